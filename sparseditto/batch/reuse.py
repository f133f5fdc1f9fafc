"""A layer that starts from its group's winner: one verification, one timing, one check.

The group's first layer found its kernel with the full `run_graph` search. For the others the
winner's source is verified on the new layer's pattern (a fresh seed, the batch's N values plus
the harness's odd ones) and, on a GPU, timed once by the harness: the kernel and the vendor
libraries that ran on the winner's layer, never dense again (dense cuBLAS is timed once per
shape, `baselines.ShapeBaselines`). It is kept when its time is within ``tolerance`` of what it
is expected to take; otherwise the caller runs the full search. On the interpreter nothing is
timed (a CPU time of an interpreted kernel says nothing; the check uses the cost model).

Expected time:
- on a GPU: what the winner's kernel takes on this group's layers (`GroupTimes`: the median of its
  measured times, each divided by the cost model's ratio of that layer to the winner's; the
  winner's own time until three are in), scaled by the cost model's ratio of this layer to the
  winner's (same template and parameters), against this layer's measured time. A miss is timed a
  second time; one that stays within twice the tolerance keeps the kernel once a full search of
  this group, sent by such a miss, chose the same kernel again;
- on the interpreter (CPU timings say nothing about a GPU): the cost model's estimate of the
  winner on this layer against the best estimate of any template the planner could pick for it.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from sparseditto.batch.baselines import ShapeBaselines, vendor_names
from sparseditto.batch.models import LayerResult

GPU_REPEATS = (50, 5)          # (repeats, warmup) of a reused layer's timing


@dataclass
class BatchSettings:
    """What every layer of one batch is run with (validated once by run_batch)."""

    target: Any                 # sparseditto.targets.Target
    n_values: list[int]
    dtype: str
    backend: str                # cuda | interpret (resolved)
    budget: int | None
    tolerance: float
    memory: Any
    checkpoint: str
    baselines: ShapeBaselines = field(default_factory=ShapeBaselines)   # dense once per shape
    cache_dir: str | None = None   # the driver's sparseditto.paths.cache_dir(): workers compile into it
    ncu: str = "best"              # Nsight Compute inside each full search (run_graph's ncu)

    @property
    def gpu(self) -> bool:
        return self.backend == "cuda"

    @property
    def n(self) -> int:
        return self.n_values[0]


@dataclass
class GroupTimes:
    """What the group's winner kernel measured on the group's layers, each time divided by the cost
    model's ratio of that layer to the winner's layer (so each estimates the winner's own time).

    Why: a reused layer was expected to take the winner's own measurement, the lower of its search's
    timing and re-timing, i.e. the low end of the kernel's spread. On the H200 (session 39, the
    7B-shaped batch, 4096 x 4096 layers, delta_spmv at N = 1) 58 reused layers read 13.2-14.0 us
    against the lead's 13.4 us, and 6 read 14.1-14.3 us in both timings: each went to a full search
    (23-41 s, against ~3.5 s for a reused layer), and five of those chose the same kernel again, at
    13.3-14.0 us. The median of what the group measured is what its spread sits around, and a search
    that confirmed the kernel says a miss of that size is the spread, not the layer."""

    normalized_ms: list[float] = field(default_factory=list)
    search_confirmed: str | None = None   # a layer whose miss-sent full search chose the winner's kernel again
    MIN_SAMPLES = 3

    def add(self, ms: float | None, scale: float = 1.0) -> None:
        if ms and scale:
            self.normalized_ms.append(ms / scale)

    def winner_ms(self, lead_ms: float) -> float:
        """The winner kernel's typical time on its own layer: the median of the group's measurements
        once there are MIN_SAMPLES of them, else the winner's own measurement."""
        if len(self.normalized_ms) >= self.MIN_SAMPLES:
            return statistics.median(self.normalized_ms)
        return lead_ms

    def resumed(self, winner: LayerResult, winner_report: dict | None, finished: list[LayerResult],
                reports: dict[str, dict | None], settings: "BatchSettings") -> None:
        """Take in what the layers a resumed batch finished before measured with the winner's kernel
        (reused ones' times, each divided by the cost model's ratio to the winner's layer; a full
        search a miss sent that chose the kernel again), so that a resume judges its layers as the
        batch it continues would have. ``reports``: the layers' analyses (the journal's)."""
        lead = _lead_estimate(winner, winner_report, settings) if winner_report is not None else None
        for x in finished:
            if x.name == winner.name or not _same_kernel(winner, x):
                continue
            if x.status == "searched" and (x.reason or "").startswith("full search ("):
                self.search_confirmed = self.search_confirmed or x.name
            elif x.status == "reused" and winner_report is not None and reports.get(x.name) is not None:
                est = estimates(reports[x.name], settings, winner.template, winner.params)
                self.add(x.kernel_ms, _ratio(est["kernel"], lead))

    def confirm(self, winner: LayerResult, searched: LayerResult) -> None:
        """Note ``searched`` (a full search sent by a timing miss) if it chose the winner's kernel."""
        if _same_kernel(winner, searched):
            self.search_confirmed = self.search_confirmed or searched.name


def _same_kernel(a: LayerResult, b: LayerResult) -> bool:
    return (a.template, a.params, a.source_hash) == (b.template, b.params, b.source_hash)


def cost_table(report: dict, settings: BatchSettings) -> list[dict]:
    """The planner's table for this layer: applicable templates it could run, best estimate first."""
    from sparseditto.agents.costing import runnable_templates, template_table

    table, _ = template_table(report, settings.n, settings.dtype, settings.target, exec_backend=settings.backend)
    return runnable_templates(table, settings.backend)


def estimates(report: dict, settings: BatchSettings, template: str, params: dict) -> dict[str, float | None]:
    """{'kernel', 'dense', 'best'} estimates in ms (cost model, plan target) for this layer."""
    from sparseditto.agents.costing import template_estimate

    table = cost_table(report, settings)
    values = [t["estimate_ms"] for t in table if t.get("estimate_ms") is not None]
    return {"kernel": template_estimate(table, template, params),
            "dense": next((t["estimate_ms"] for t in table if t["name"] == "dense"), None),
            "best": min(values) if values else None,
            "format_bytes": next((t.get("bytes") for t in table if t["name"] == template), None)}


def _verification(result) -> dict:
    return {"status": result.status, "ok": result.ok, "seed": result.seed, "backend": result.backend,
            "seconds": round(result.seconds, 3), "message": result.message[:300],
            "checks": [c.model_dump() for c in result.checks]}


def _vendor_times(bench) -> dict[str, float]:
    return {b.name: b.timing.median_ms for b in bench.baselines
            if b.ok and b.timing is not None and b.name != "cublas_dense"}


def _lead_estimate(winner: LayerResult, winner_report: dict, settings: BatchSettings) -> float | None:
    """The cost model's time of the winner's kernel on the winner's own layer (ms)."""
    return estimates(winner_report, settings, winner.template, winner.params)["kernel"]


def _ratio(kernel_ms: float | None, lead_ms: float | None) -> float:
    """The cost model's ratio of a layer's time (``kernel_ms``) to the winner layer's, same kernel (1 unknown)."""
    return (kernel_ms / lead_ms) if (lead_ms and kernel_ms) else 1.0


def _gpu_timing(winner: LayerResult, winner_report: dict, A, est: dict, settings: BatchSettings, phases: dict,
                times: GroupTimes | None = None):
    """(observed ms, expected ms, dense ms, dense source, vendor times, basis, the cost model's ratio
    of this layer to the winner's) of the winner's kernel on this layer, or the reason it failed its
    timing (a str)."""
    from sparseditto import harness

    vendors = vendor_names(winner.vendor_ms)
    repeats, warmup = GPU_REPEATS
    scale = _ratio(est["kernel"], _lead_estimate(winner, winner_report, settings))
    def timing(baselines):
        """(bench result, the kernel's ms: graph-replayed when captured, else eager)."""
        res = harness.bench(_runnable(winner), A, settings.n, dtype=settings.dtype, backend=settings.backend,
                            repeats=repeats, warmup=warmup, baselines=baselines, time_dense=False)
        return res, (res.candidate_graph or res.candidate).median_ms

    t0 = time.time()
    try:
        timed, observed = timing(vendors or False)
        lead_ms = winner.kernel_ms or observed
        typical = times.winner_ms(lead_ms) if times is not None else lead_ms
        expected = typical * scale
        retimed = ""
        if observed > expected * (1 + settings.tolerance):
            # a miss costs a full search (a minute on the H200): confirm it with a second timing
            # first. One kernel's timings on the H200 spread over 12-22 us in a session-22 run
            # (sandbox profiled), enough to send 5 of 8 sibling layers to needless searches.
            second = timing(False)[1]
            retimed = f" (a second timing: {second * 1e3:.1f} us, the lower kept)"
            observed = min(observed, second)
    except harness.BenchError as exc:
        return f"{winner.template} from {winner.name} failed its timing here: {exc}"
    finally:
        phases["time"] = round(time.time() - t0, 3)
    graph = timed.candidate_graph is not None
    t0 = time.time()
    dense = settings.baselines.dense_for(A, settings.dtype, settings.n, settings.backend,
                                         repeats=repeats, warmup=warmup)
    phases["dense"] = round(time.time() - t0, 3)
    from_median = times is not None and len(times.normalized_ms) >= GroupTimes.MIN_SAMPLES
    source = f"the group's median ({len(times.normalized_ms)} layers)" if from_median else winner.name
    basis = f"measured {observed * 1e3:.1f} us vs {expected * 1e3:.1f} us expected from {source}{retimed}"
    return observed, expected, dense.for_basis(graph), dense.source, _vendor_times(timed), basis, scale


def _runnable(winner: LayerResult):
    """What the harness runs for the winner: its source, or the vendor path itself (no source:
    cuSPARSE, ... is verified and timed on this layer as the same library)."""
    from sparseditto import harness

    return harness.vendor_spec(winner.template) if harness.is_vendor_kernel(winner.template) else winner.source


def try_reuse(winner: LayerResult, winner_report: dict, base: LayerResult, A, report: dict,
              settings: BatchSettings, phases: dict | None = None, times: GroupTimes | None = None) -> LayerResult | str:
    """``base`` (this layer's name, shape, pattern, ...) completed with the winner's kernel, or
    the reason the full search must run instead. ``phases`` gets the seconds of each step
    (verify, time, dense), whichever way it ends; ``times`` (the group's, GPU only) what the
    winner's kernel measured on the group's layers so far, and gets this layer's time."""
    from sparseditto import harness

    phases = {} if phases is None else phases

    est = estimates(report, settings, winner.template or "dense", winner.params)
    tol = settings.tolerance
    if winner.template in (None, "dense"):
        if est["best"] is not None and est["dense"] is not None and est["best"] < est["dense"] * (1 - tol):
            return (f"the group's winner is dense, but the cost model puts a kernel at {est['best'] * 1e3:.1f} us vs "
                    f"dense {est['dense'] * 1e3:.1f} us on this layer")
        return base.model_copy(update=dict(
            status="reused", template="dense", reason=f"dense, as for {winner.name} (no kernel beats it)",
            run_id=winner.run_id, kernel_ms=est["dense"] if not settings.gpu else winner.dense_ms,
            dense_ms=est["dense"] if not settings.gpu else winner.dense_ms, speedup_vs_dense=1.0, time_saved_ms=0.0,
            timings_are_estimates=not settings.gpu, n=settings.n))
    t0 = time.time()
    verify = harness.run_and_verify(_runnable(winner), A, n_values=settings.n_values, dtype=settings.dtype,
                                    backend=settings.backend)
    phases["verify"] = round(time.time() - t0, 3)
    if not verify.ok:
        return f"{winner.template} from {winner.name} failed verification here: {verify.status}: {verify.message[:200]}"
    vendor_ms: dict[str, float] = {}
    if settings.gpu:
        got = _gpu_timing(winner, winner_report, A, est, settings, phases, times)
        if isinstance(got, str):
            return got
        observed, expected, dense_ms, dense_source, vendor_ms, basis, scale = got
    else:
        observed, expected, dense_ms, dense_source = est["kernel"], est["best"], est["dense"], "cost model"
        basis = (f"cost model: {observed * 1e3:.1f} us vs the best template's {expected * 1e3:.1f} us on this layer"
                 if observed and expected else "")
    vendor = min(vendor_ms, key=vendor_ms.get) if vendor_ms else None
    vendor_best = vendor_ms.get(vendor) if vendor else None
    if observed is None or expected is None:
        return f"no expected time for {winner.template} on this layer (the cost model does not know it)"
    if observed > expected * (1 + tol):
        if not (times is not None and times.search_confirmed and observed <= expected * (1 + 2 * tol)):
            return f"{winner.template} from {winner.name} is not within {tol:.0%} of its expected time ({basis})"
        basis += (f"; kept: within {2 * tol:.0%}, and the full search that such a miss sent "
                  f"{times.search_confirmed} to chose this same kernel")
    if settings.gpu and times is not None:
        times.add(observed, scale)
    return base.model_copy(update=dict(
        status="reused", template=winner.template, params=dict(winner.params), source=winner.source,
        origin=winner.origin,
        source_hash=winner.source_hash, kernel_format=winner.kernel_format, format_bytes=est["format_bytes"],
        run_id=winner.run_id, kernel_ms=observed, dense_ms=dense_ms, expected_ms=expected,
        speedup_vs_dense=(dense_ms / observed) if dense_ms and observed else None,
        best_vendor=vendor, speedup_vs_vendor=(vendor_best / observed) if vendor_best and observed else None,
        vendor_ms=vendor_ms, dense_source=dense_source,
        time_saved_ms=(dense_ms - observed) if dense_ms and observed else None,
        timings_are_estimates=not settings.gpu, n=settings.n, reason=f"{winner.name}'s kernel, verified here; {basis}",
        verified_ns=sorted({c.n for c in verify.checks}) or list(settings.n_values), verified_dtype=settings.dtype,
        verification=_verification(verify)))
