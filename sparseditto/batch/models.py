"""The batch's result models: one `LayerResult` per weight, one `BatchReport` per batch.

``report.json`` is exactly ``BatchReport.model_dump_json()``, the journal stores each
``LayerResult`` as written, and the bundle is built from them: the same record everywhere, never
a dict that changes shape on the way.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

# searched: its own run_graph search; reused: started from its group's winner (verified and timed
# here); shared: the same structure signature as a layer already done, so the same kernel outright;
# previous: a kernel of the previous batch's bundle whose signature still matches; dense: no kernel
# beats dense; skipped: not a candidate (not 2-D, below --min-sparsity, not selected); failed.
LayerStatus = Literal["searched", "reused", "shared", "previous", "skipped", "failed"]
# A layer the rest of its group starts from: one searched here, or one whose previous-batch kernel
# was verified and timed here.
WINNER_STATUSES = ("searched", "previous")


class LayerResult(BaseModel):
    """What the batch found for one weight."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str = "linear"                  # linear (2-D) | conv (4-D, im2col'd) | other
    status: LayerStatus
    reason: str = ""
    group: str | None = None
    pattern: str | None = None
    sparsity: float | None = None
    nnz: int | None = None
    signature: str | None = None          # structure signature (sparseditto.pattern_features)
    template: str | None = None           # chosen kernel; 'dense' when nothing beats dense
    params: dict[str, Any] = Field(default_factory=dict)
    source_hash: str | None = None
    source: str | None = None             # the kernel source (the bundle writes it to its own file); None for
                                          # dense and a vendor path (rebuilt from the weight when loaded)
    origin: str | None = None             # template | memory | llm | vendor (the chosen kernel's)
    kernel_format: str | None = None
    format_bytes: float | None = None     # bytes of A the format moves (cost model)
    run_id: str | None = None             # the run_graph run that searched it (or the group's leader)
    kernel_ms: float | None = None        # per call at N (GPU: measured; interpreter: cost model)
    dense_ms: float | None = None
    expected_ms: float | None = None      # what the reuse check expected (reused layers)
    speedup_vs_dense: float | None = None
    best_vendor: str | None = None
    speedup_vs_vendor: float | None = None
    vendor_ms: dict[str, float] = Field(default_factory=dict)   # vendor library -> its time here (GPU)
    dense_source: str | None = None       # what measured dense_ms: this layer's search, or the shape's one timing
    time_saved_ms: float | None = None    # dense_ms - kernel_ms, per call at N
    timings_are_estimates: bool = True
    n: int | None = None
    # kernel-vs-dense ratio at each of the batch's N values (GPU: measured, dense beside it; else the
    # cost model's estimate): patch_model runs dense where it is below 1.0
    n_speedups: dict[int, float] = Field(default_factory=dict)
    verified_ns: list[int] = Field(default_factory=list)
    verified_dtype: str | None = None
    verification: dict[str, Any] = Field(default_factory=dict)   # status, seed, backend, checks, seconds
    seconds: float = 0.0                  # wall time the batch spent on this layer
    phase_seconds: dict[str, float] = Field(default_factory=dict)   # where ``seconds`` went: analyze, load,
                                          # verify, time (kernel + vendors), dense, search
    previous_kernel_ms: float | None = None
    slower_than_previous: bool = False

    @property
    def has_kernel(self) -> bool:
        return self.status in ("searched", "reused", "shared", "previous") and self.template not in (None, "dense")


class BatchReport(BaseModel):
    """The whole batch: settings, every layer, and whether it finished."""

    model: str
    out: str
    settings: dict[str, Any]
    layers: list[LayerResult]
    complete: bool
    wall_seconds: float
    timings_are_gpu: bool
    groups: int = 0
    notes: list[str] = Field(default_factory=list)
    # what planning for this target left out that the GPU it ran on could run (run_graph's note; None if nothing)
    target_note: str | None = None

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for layer in self.layers:
            out[layer.status] = out.get(layer.status, 0) + 1
        return out

    def phase_totals(self) -> dict[str, float]:
        """Seconds by phase summed over the layers, largest first (analyze: thread time of the
        analysis pass, which overlaps; the others ran one after the other)."""
        total: dict[str, float] = {}
        for layer in self.layers:
            for k, v in layer.phase_seconds.items():
                total[k] = total.get(k, 0.0) + float(v)
        return dict(sorted(total.items(), key=lambda kv: -kv[1]))

    def layer(self, name: str) -> LayerResult:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(name)

    def summary(self) -> str:
        counts = ", ".join(f"{v} {k}" for k, v in sorted(self.counts().items()))
        saved = sum(x.time_saved_ms or 0.0 for x in self.layers if x.has_kernel)
        basis = "GPU timings" if self.timings_are_gpu else "cost-model estimates (NOT GPU timings)"
        slower = [x.name for x in self.layers if x.slower_than_previous]
        phases = self.phase_totals()
        lines = [f"{len(self.layers)} tensors in {self.groups} group(s): {counts}; {self.wall_seconds:.1f} s",
                 f"time saved per forward at N: {saved * 1e3:.1f} us ({basis})",
                 *([("batch seconds by phase: " + ", ".join(f"{k} {v:.1f}" for k, v in phases.items()))]
                   if phases else []),
                 f"report: {self.out}/report.html, {self.out}/report.json; bundle: {self.out}/bundle"]
        if slower:
            lines.append(f"slower than the previous report: {', '.join(slower)}")
        if self.target_note:
            lines.append(f"note: {self.target_note}")
        if not self.complete:
            lines.append("incomplete: run the same command with --resume to continue")
        return "\n".join(lines)
