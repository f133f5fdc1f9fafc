"""The one typed record of a candidate attempt, and the one function that builds it.

Why one record: a candidate's story is told by several nodes (the coder may fail to produce
source, the debugger may reject it, the profiler measures it), then read by the planner, the
memory, finalize and `Result`. A `CandidateRecord` has the same fields wherever it is: built by
`build_record` from the in-flight candidate (``state["current"]``) plus what the node found out,
kept in state as its JSON dump (state is plain data), written to memory from it, and validated back
into the same model by `sparseditto.api.Result`.

Also here: the identity of a candidate (`params_key`, `record_key`, `spec_key`), the harness
`Candidate` of the in-flight source, and the planner's compact view of past attempts.
"""
from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sparseditto.agents.policy import KernelProfile, TriedCandidate


class CandidateRecord(BaseModel):
    """One attempt at a kernel: what was tried, why, and what happened (failed or measured)."""

    model_config = ConfigDict(extra="forbid")

    # --- what was tried --------------------------------------------------------------------------
    index: int | None = None             # candidate number within the run (retries share it)
    attempt: int = 1
    template: str
    params: dict[str, Any] = Field(default_factory=dict)
    origin: str | None = None            # template | memory | llm | vendor (a library path: dense cuBLAS, cuSPARSE, ...)
    vendor: str | None = None            # origin "vendor": the library, in words ("cuSPARSE CSR SpMM via torch.sparse")
    rationale: str = ""
    source: str | None = None
    source_hash: str | None = None
    backend: str | None = None           # triton | cuda (kernel language)
    expected_ms: float | None = None     # roofline estimate on the target
    # --- what happened ---------------------------------------------------------------------------
    status: str                          # verified, codegen_error, compile_error, wrong_result, ... bench_failed
    failure_class: str | None = None
    message: str = ""
    diagnosis: str | None = None         # the debugger policy's reading of a failure
    verify: dict[str, Any] | None = None  # {status, checks, worst_tol_ratio, seconds} of the verification
    # --- measurements (verified candidates) ------------------------------------------------------
    median_ms: float | None = None       # GPU: cold-L2 time of one launch inside a CUDA graph
    timing_basis: str | None = None      # "cuda_graph" or "eager": what median_ms/dense_ms measure
    eager_ms: float | None = None        # the same kernel launched eagerly (what users without graphs pay)
    p10_ms: float | None = None
    p90_ms: float | None = None
    graph_ms: float | None = None
    dense_ms: float | None = None
    dense_eager_ms: float | None = None
    conversion_ms: float | None = None
    speedup_vs_dense: float | None = None       # GPU timings only, on timing_basis
    speedup_vs_dense_eager: float | None = None
    cpu_speedup_vs_dense: float | None = None   # interpreter runs: CPU timings, for the record only
    speedup_vs_best_baseline: float | None = None
    best_baseline: str | None = None
    baselines: dict[str, float | None] = Field(default_factory=dict)   # vendor library -> eager ms
    baseline_notes: dict[str, str | None] = Field(default_factory=dict)
    pct_of_roofline: float | None = None
    a_bytes: float | None = None         # bytes of A in the cost model (measured from prepare() for LLM code)
    a_bytes_measured: bool | None = None
    roofline_ms: float | None = None     # the cost model's bound on the measuring GPU (the % above is against it)
    bottleneck: str | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)              # Nsight Compute
    ncu_note: str | None = None
    timings_are_gpu: bool | None = None
    gpu_name: str | None = None
    n: int | None = None
    notes: list[str] = Field(default_factory=list)
    memory_candidate_id: str | None = None      # the row the trajectory memory keeps of it


# Timing fields the memory keeps of a record (its "timings" column).
TIMING_FIELDS = ("median_ms", "eager_ms", "p10_ms", "p90_ms", "graph_ms", "dense_ms", "dense_eager_ms",
                 "conversion_ms", "speedup_vs_dense_eager", "speedup_vs_dense", "cpu_speedup_vs_dense", "expected_ms")


def build_record(current: dict, status: str, **outcome: Any) -> CandidateRecord:
    """The record of the in-flight candidate ``current`` (its spec, source, attempt) with what a
    node found out (``status`` and any `CandidateRecord` field)."""
    spec = current["spec"]
    fields: dict[str, Any] = dict(
        index=current.get("index"), attempt=current.get("attempt", 1), template=spec["template"], vendor=spec.get("vendor"),
        params=spec.get("params") or {}, origin=current.get("origin") or spec.get("origin"),
        rationale=spec.get("rationale", ""), source=current.get("source"), source_hash=current.get("source_hash"),
        backend=current.get("backend"), expected_ms=spec.get("expected_ms"), verify=current.get("verify"))
    fields.update(outcome)
    return CandidateRecord(status=status, **fields)


def params_key(template: str, params: dict | None) -> str:
    """Canonical identity of a template instance (dedupe across plans, memory and retries)."""
    return template + ":" + json.dumps(params or {}, sort_keys=True, default=str)


def record_key(rec: dict) -> str:
    """A tried candidate's identity: its source for LLM code, else template + params."""
    if rec.get("origin") == "llm" and rec.get("source_hash"):
        return "src:" + rec["source_hash"]
    return params_key(rec.get("template", "?"), rec.get("params"))


def spec_key(spec: dict) -> str:
    """A planned candidate's identity, comparable with `record_key`."""
    if spec.get("origin") == "llm" and spec.get("source"):
        from sparseditto.harness.source_loader import source_hash

        return "src:" + source_hash(spec["source"])
    return params_key(spec.get("template", "?"), spec.get("params"))


def tried(records: list[dict]) -> list[TriedCandidate]:
    """The planner's compact view of past attempts (what a plan, or a prompt, needs)."""
    return [TriedCandidate(template=r.get("template", "?"), params=r.get("params") or {}, status=r.get("status", "?"),
                           failure_class=r.get("failure_class"), median_ms=r.get("median_ms"),
                           speedup_vs_dense=r.get("speedup_vs_dense"), pct_of_roofline=r.get("pct_of_roofline"),
                           bottleneck=r.get("bottleneck")) for r in records]


def kernel_profile(record: dict | None, nnz: int | None) -> KernelProfile | None:
    """The prompts' view of a verified candidate record (the current best): source, times, bytes
    of A and its byte roofline, bottleneck, Nsight Compute metrics."""
    if not record:
        return None
    a_bytes = record.get("a_bytes")
    metrics = {k: float(v) for k, v in (record.get("metrics") or {}).items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return KernelProfile(
        template=record.get("template", "?"), params=record.get("params") or {}, origin=record.get("origin"),
        source=record.get("source"), median_ms=record.get("median_ms"), timings_are_gpu=record.get("timings_are_gpu"),
        expected_ms=record.get("expected_ms"), a_bytes=a_bytes, a_bytes_measured=bool(record.get("a_bytes_measured")),
        bytes_per_nnz=a_bytes / nnz if a_bytes is not None and nnz else None, roofline_ms=record.get("roofline_ms"),
        pct_of_roofline=record.get("pct_of_roofline"), bottleneck=record.get("bottleneck"), ncu=metrics)


def make_candidate(spec: dict, source: str, origin: str):
    """The harness `Candidate` for this source: the registry's own instance when the source is the
    plain template instance, else a candidate built around the given source (an LLM's, memory's).
    ValueError for an unknown template or illegal parameters of a template instance."""
    from sparseditto.harness.candidate_spec import source_backend
    from sparseditto.kernel_templates.registry import Candidate, get_template

    try:
        template = get_template(spec["template"])
    except ValueError:
        template = None   # an LLM may name its own kernel
    if template is not None and origin != "llm":
        try:
            inst = template.instantiate(spec.get("params") or {})
        except ValueError:
            inst = None   # e.g. a memory source whose parameters this template version no longer allows
        if inst is not None and inst.source == source:
            return inst.model_copy(update={"origin": origin})
    # An LLM's source is in whatever language it was written in (a Triton template's adaptation
    # may come back as CUDA C++ through CuPy): read it from the source, not from the template.
    backend = template.backend if template is not None and origin != "llm" else None
    if backend in (None, "builtin"):
        backend = source_backend(source)
    return Candidate(template=spec["template"], params=spec.get("params") or {}, source=source, backend=backend,
                     origin=origin, format=template.format if template is not None else None)


def candidate_of(current: dict):
    """The harness `Candidate` of the in-flight candidate (after the coder gave it a source)."""
    return make_candidate(current["spec"], current["source"], current.get("origin") or "template")
