"""One group of a batch: the layers that share a pattern signature, worked through in order.

The first layer without a winner gets the full `run_graph` search; a layer with the structure
signature of one already done shares its kernel outright; a layer whose signature matches a
kernel of the previous batch starts from that kernel; every other layer starts from the group's
winner (`reuse.try_reuse`) and is searched only when that fails. Each finished layer is recorded
at once (the journal in the driver, a collector in a worker process); a failure is recorded and
the group goes on. `runner` calls this in its own process, `workers` in worker processes.
"""
from __future__ import annotations

import time

from sparseditto.batch.models import WINNER_STATUSES, LayerResult
from sparseditto.batch.progress import Progress
from sparseditto.batch.reuse import BatchSettings, GroupTimes, estimates, try_reuse
from sparseditto.batch.weights import WeightRef, as_matrix_tensor
from sparseditto.harness.sandbox import WorkerStartError



def base_layer(ref: WeightRef, **fields) -> LayerResult:
    kind = "linear" if len(ref.shape) == 2 else ("conv" if len(ref.shape) == 4 else "other")
    return LayerResult(name=ref.name, shape=tuple(ref.shape), dtype=ref.dtype, kind=kind, **fields)


def _template_format(template: str | None) -> str | None:
    from sparseditto.kernel_templates.registry import get_template

    try:
        return get_template(template).format if template else None
    except ValueError:
        return None


def searched_layer(base: LayerResult, result, report: dict, settings: BatchSettings, seconds: float) -> LayerResult:
    """A LayerResult from a full run_graph search."""
    b = result.best
    est = estimates(report, settings, b.template, b.params)
    rec = next((c for c in result.candidates if c.status == "verified" and (
        c.source_hash == b.source_hash if b.source_hash else (c.origin == "vendor" and c.template == b.template))), None)
    if settings.gpu:
        kernel_ms = b.median_ms
        reported = result.speedups.get("dense")
        # the dense time the search's reported speedup stands on (its re-timed, lower figure); the
        # record's own dense_ms is the dense run beside that one benchmark, which can be an outlier
        dense_ms = kernel_ms * reported if kernel_ms and reported else (b.dense_ms or (result.dense or {}).get("median_ms"))
    else:
        kernel_ms = b.expected_ms if b.template != "dense" else est["dense"]
        dense_ms = est["dense"]
    vendors = {k: v for k, v in result.speedups.items() if k != "dense"}
    vendor = min(vendors, key=vendors.get) if vendors else None
    vendor_ms = {k: v for k, v in ((rec.baselines or {}) if rec and settings.gpu else {}).items()
                 if v is not None and k != "cublas_dense"}
    settings.baselines.seed(_matrix_shape(base), settings.dtype, settings.n, settings.backend, _dense_timing(result),
                            f"search of {base.name}")   # dense for this shape: timed once per batch
    reason = b.reason if result.best.template != "dense" else (b.reason or "dense is best")
    return base.model_copy(update=dict(
        status="searched", template=b.template, params=dict(b.params), source=b.source, source_hash=b.source_hash,
        kernel_format=_template_format(b.template), format_bytes=est["format_bytes"], run_id=result.run_id,
        kernel_ms=kernel_ms, dense_ms=dense_ms, expected_ms=b.expected_ms,
        speedup_vs_dense=result.speedups.get("dense") or ((dense_ms / kernel_ms) if dense_ms and kernel_ms else None),
        best_vendor=vendor, speedup_vs_vendor=vendors.get(vendor) if vendor else None, vendor_ms=vendor_ms,
        dense_source=f"search of {base.name}" if settings.gpu else "cost model",
        time_saved_ms=(dense_ms - kernel_ms) if dense_ms and kernel_ms else None,
        timings_are_estimates=result.speedups_are_estimates, n=settings.n, reason=reason,
        verified_ns=list(result.verified_ns), verified_dtype=result.dtype if b.template != "dense" else None, origin=b.origin,
        verification=dict(rec.verify or {}, status=rec.status) if rec else {}, seconds=round(seconds, 3)))


def _dense_timing(result) -> dict | None:
    """The search's dense cuBLAS timing as ``ShapeBaselines.seed`` takes it: the dense vendor path's
    own verified record (dense timed as a candidate, graph and eager, by the method every kernel
    is timed with), else ``result.dense`` (the dense run beside the best kernel's benchmark).

    Why not always ``result.dense``: on the H200 that one benchmark's dense graph time of a
    4096 x 4096 layer at N = 1 read 71.5 us, where the dense path itself measured 14.6 us; seeded
    with it, every reused layer of the shape reported 5.3x instead of 1.07x."""
    rec = next((c for c in result.candidates if c.origin == "vendor" and c.template == "dense"
                and c.status == "verified" and c.timings_are_gpu and c.eager_ms), None)
    if rec is None:
        return result.dense
    return {"timings_are_gpu": True, "median_ms": rec.median_ms, "eager": {"median_ms": rec.eager_ms},
            "graph": {"median_ms": rec.graph_ms} if rec.graph_ms else None}


def _matrix_shape(base: LayerResult) -> tuple[int, int]:
    from sparseditto.batch.weights import WeightRef

    return WeightRef(base.name, base.shape, base.dtype, lambda: None).matrix_shape


def _search(A, base: LayerResult, report: dict, settings: BatchSettings, why: str | None) -> LayerResult:
    from sparseditto.api import run_graph

    t0 = time.time()
    result = run_graph(A, target=settings.target.name, n=settings.n_values, dtype=settings.dtype,
                       backend=settings.backend, budget=settings.budget, memory=settings.memory,
                       checkpoint=settings.checkpoint, ncu=settings.ncu)
    layer = searched_layer(base, result, report, settings, time.time() - t0)
    if why:
        layer.reason = f"full search ({why}); {layer.reason}"
    return layer


def _shared(done: LayerResult, base: LayerResult) -> LayerResult:
    keep = {k: getattr(done, k) for k in ("template", "params", "source", "source_hash", "origin", "kernel_format",
                                           "format_bytes", "run_id", "kernel_ms", "dense_ms", "expected_ms",
                                           "speedup_vs_dense", "best_vendor", "speedup_vs_vendor", "time_saved_ms",
                                           "timings_are_estimates", "n", "verified_ns", "verified_dtype",
                                           "verification", "n_speedups")}
    return base.model_copy(update=dict(keep, status="shared",
                                       reason=f"same structure signature as {done.name}: its kernel outright"))


def _n_speedups(layer: LayerResult, ref: WeightRef, A, report: dict, same: LayerResult | None,
                winner: LayerResult | None, settings: BatchSettings, phases: dict) -> dict[int, float]:
    """The layer's kernel-vs-dense ratio at every N of the batch (batch.n_speedups): a layer that took
    a kernel already measured takes its ratios at the other N, a new winner is measured there. A
    failure to measure leaves the ratios out (patch_model then runs the verified kernel, as before).
    ``A``: the weight's matrix when this layer loaded it already (None: loaded here)."""
    from sparseditto.batch import n_speedups

    if layer.status == "shared" and same is not None:
        return n_speedups.inherited(layer, same, settings)
    if layer.status == "reused" and winner is not None and winner.name != layer.name:
        return n_speedups.inherited(layer, winner, settings)
    t0 = time.time()
    try:
        return n_speedups.measured(layer, A if A is not None else load_weight(ref), report, settings)
    except WorkerStartError:
        raise
    except Exception:   # noqa: BLE001 - ratios are an optimisation of patch_model, never a layer failure
        return n_speedups.inherited(layer, None, settings)
    finally:
        phases["n_speedups"] = round(time.time() - t0, 3)


def record_layer(journal, bar: Progress, layer: LayerResult) -> LayerResult:
    journal.record(layer)
    bar.done(layer)
    return layer


def load_weight(ref: WeightRef):
    from sparseditto.io import load_matrix

    return load_matrix(as_matrix_tensor(ref), name=ref.name)


def layer_report(ref: WeightRef) -> dict:
    from sparseditto.analysis import analyze

    return analyze(load_weight(ref)).model_dump(mode="json")


def run_group(key: str, members: list, done: dict, journal, bar: Progress, settings: BatchSettings,
               prev: dict[str, LayerResult], *, until_winner: bool = False) -> None:
    """Work through ``members`` in order (module docstring); ``until_winner``: return as soon as the
    group has a winner (`workers.run_groups` sends the rest out in shards that start from it)."""
    finished = [done[ref.name] for ref, _ in members if ref.name in done]
    winner = next((x for x in finished if x.status in WINNER_STATUSES), None)
    if until_winner and winner is not None:
        return
    winner_ref = next((ref for ref, _ in members if winner is not None and ref.name == winner.name), None)
    # a resumed batch has every analysis in its journal (runner._analyze hands the finished layers' on too)
    winner_report = next((rep for ref, rep in members if winner is not None and ref.name == winner.name), None)
    times = GroupTimes()                     # what the winner's kernel measured on this group's layers
    if winner is not None:
        times.add(winner.kernel_ms)
        if settings.gpu:
            times.resumed(winner, winner_report, finished, {ref.name: rep for ref, rep in members}, settings)
    by_signature = {x.signature: x for x in finished if x.status != "failed" and x.template}
    prev_by_signature = {x.signature: x for x in prev.values() if x.signature and x.template}
    for ref, report in members:
        if ref.name in done:
            continue
        t0 = time.time()
        base = base_layer(ref, status="failed", reason="unfinished", group=key, pattern=report["pattern"],
                          sparsity=report["sparsity"], nnz=report["nnz"], signature=report["signature"])
        phases: dict[str, float] = {}
        same = A = None
        try:
            same = by_signature.get(report["signature"])
            if same is not None:
                layer = _shared(same, base)
            else:
                A = load_weight(ref)
                phases["load"] = round(time.time() - t0, 3)
                layer = None
                old = prev_by_signature.get(report["signature"])
                if old is not None:
                    bar.working(ref.name, f"checking the previous batch's {old.template}")
                    got = try_reuse(old, report, base, A, report, settings, phases)
                    if isinstance(got, LayerResult):
                        layer = got.model_copy(update=dict(
                            status="previous", reason=f"the previous batch's kernel for {old.name} (signature "
                                                      f"unchanged), verified here; {got.reason}"))
                why = None
                if layer is None and winner is not None:
                    bar.working(ref.name, f"starting from {winner.name}'s {winner.template}")
                    if winner_report is None:   # a journal without the winner's analysis: analyze it again
                        winner_report = layer_report(winner_ref)
                    got = try_reuse(winner, winner_report, base, A, report, settings, phases, times)
                    layer, why = (got, None) if isinstance(got, LayerResult) else (None, got)
                if layer is None:
                    bar.working(ref.name, "full search (run_graph)")
                    t1 = time.time()
                    layer = _search(A, base, report, settings, why)
                    phases["search"] = round(time.time() - t1, 3)
                    if why is not None and winner is not None:
                        times.confirm(winner, layer)
                if winner is None and layer.status in WINNER_STATUSES:
                    winner, winner_report = layer, report
                    times.add(winner.kernel_ms)
        except WorkerStartError:   # the environment, not this layer: no later layer could run either
            raise
        except Exception as exc:   # one layer's failure is recorded; the batch goes on
            layer = base.model_copy(update=dict(status="failed", reason=f"{type(exc).__name__}: {str(exc)[:400]}"))
        if layer.has_kernel and not layer.n_speedups:
            layer = layer.model_copy(update=dict(n_speedups=_n_speedups(layer, ref, A, report, same, winner,
                                                                        settings, phases)))
            if winner is not None and winner.name == layer.name:
                winner = layer      # the group's later layers inherit these ratios (found on the H200:
                                    # they took the winner's copy from before, without them)
        if report.get("analyze_seconds") is not None:
            phases["analyze"] = report["analyze_seconds"]
        layer = layer.model_copy(update=dict(seconds=round(time.time() - t0, 3), phase_seconds=phases))
        old = prev.get(ref.name)
        slower = old is not None and old.kernel_ms and layer.kernel_ms and \
            layer.kernel_ms > old.kernel_ms * (1 + settings.tolerance)
        if slower:
            layer.previous_kernel_ms, layer.slower_than_previous = old.kernel_ms, True
        elif old is not None:
            layer.previous_kernel_ms = old.kernel_ms
        done[ref.name] = record_layer(journal, bar, layer)
        if layer.status != "failed" and layer.template:
            by_signature.setdefault(layer.signature, layer)
        if until_winner and winner is not None:
            return
