"""`run_batch(model, ...)`: a kernel per layer of a pruned model, resumable, with a report.

The order of work: list the model's tensors; pick the 2-D weights (and im2col'd convs) the user
selected, skipping the rest with the reason; analyze each chosen weight once (its pattern report
is small, the matrix is dropped again, so a 7B checkpoint never sits in memory whole); group them
by pattern signature (`grouping.group_key`); then per group: the first layer gets the full
`run_graph` search, every other layer starts from the group's winner (`reuse.try_reuse`), layers
with a structure signature already done share its kernel outright, and layers whose signature
matches a kernel of the previous batch (``previous=DIR``) start from that kernel. Every finished
layer goes to the journal at once; a failure is recorded and the batch goes on. At the end (and
on Ctrl-C) the report and the bundle are written from the journal.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from sparseditto.batch.grouping import group_key, select_weights
from sparseditto.batch.journal import Journal
from sparseditto.batch.models import BatchReport, LayerResult
from sparseditto.batch.reuse import BatchSettings, estimates, try_reuse
from sparseditto.batch.weights import WeightRef, as_matrix_tensor, list_weights

DEFAULT_OUT = "sparseditto-batch"
# A layer the rest of its group starts from: one searched here, or one whose previous-batch kernel
# was verified and timed here.
WINNER_STATUSES = ("searched", "previous")


def _model_label(model: Any) -> str:
    if isinstance(model, (str, Path)):
        return str(Path(model).expanduser().resolve())
    return f"{type(model).__module__}.{type(model).__name__}"


def _check_fraction(value, what: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number in [0, 1), got {value!r}.") from None
    if not (0.0 <= v < 1.0):
        raise ValueError(f"{what} must be in [0, 1), got {v}.")
    return v


def _prepare_out(out) -> Path:
    path = Path(out).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"out={str(path)!r} is a file; the batch writes a folder (report, bundle, journal).")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"Cannot create the out folder {path}: {exc}") from None
    return path


def _base(ref: WeightRef, **fields) -> LayerResult:
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
    rec = next((c for c in result.candidates if c.status == "verified" and c.source_hash == b.source_hash), None)
    if settings.gpu:
        kernel_ms, dense_ms = b.median_ms, b.dense_ms or (result.dense or {}).get("median_ms")
    else:
        kernel_ms = b.expected_ms if b.template != "dense" else est["dense"]
        dense_ms = est["dense"]
    vendors = {k: v for k, v in result.speedups.items() if k != "dense"}
    vendor = min(vendors, key=vendors.get) if vendors else None
    reason = b.reason if result.best.template != "dense" else (b.reason or "dense is best")
    return base.model_copy(update=dict(
        status="searched", template=b.template, params=dict(b.params), source=b.source, source_hash=b.source_hash,
        kernel_format=_template_format(b.template), format_bytes=est["format_bytes"], run_id=result.run_id,
        kernel_ms=kernel_ms, dense_ms=dense_ms, expected_ms=b.expected_ms,
        speedup_vs_dense=result.speedups.get("dense") or ((dense_ms / kernel_ms) if dense_ms and kernel_ms else None),
        best_vendor=vendor, speedup_vs_vendor=vendors.get(vendor) if vendor else None,
        time_saved_ms=(dense_ms - kernel_ms) if dense_ms and kernel_ms else None,
        timings_are_estimates=result.speedups_are_estimates, n=settings.n, reason=reason,
        verified_ns=list(result.verified_ns), verified_dtype=result.dtype if b.template != "dense" else None,
        verification=dict(rec.verify or {}, status=rec.status) if rec else {}, seconds=round(seconds, 3)))


def _search(A, base: LayerResult, report: dict, settings: BatchSettings, why: str | None) -> LayerResult:
    from sparseditto.api import run_graph

    t0 = time.time()
    result = run_graph(A, target=settings.target.name, n=settings.n_values, dtype=settings.dtype,
                       backend=settings.backend, budget=settings.budget, memory=settings.memory,
                       checkpoint=settings.checkpoint)
    layer = searched_layer(base, result, report, settings, time.time() - t0)
    if why:
        layer.reason = f"full search ({why}); {layer.reason}"
    return layer


def _shared(done: LayerResult, base: LayerResult) -> LayerResult:
    keep = {k: getattr(done, k) for k in ("template", "params", "source", "source_hash", "kernel_format",
                                           "format_bytes", "run_id", "kernel_ms", "dense_ms", "expected_ms",
                                           "speedup_vs_dense", "best_vendor", "speedup_vs_vendor", "time_saved_ms",
                                           "timings_are_estimates", "n", "verified_ns", "verified_dtype",
                                           "verification")}
    return base.model_copy(update=dict(keep, status="shared",
                                       reason=f"same structure signature as {done.name}: its kernel outright"))


def _previous_layers(previous) -> dict[str, LayerResult]:
    if previous is None:
        return {}
    path = Path(previous).expanduser() / "report.json"
    if not path.is_file():
        raise ValueError(f"previous={str(previous)!r} holds no report.json of an earlier batch.")
    try:
        old = BatchReport.model_validate_json(path.read_text())
    except ValueError as exc:
        raise ValueError(f"{path} is not a batch report: {str(exc)[:200]}") from None
    return {x.name: x for x in old.layers}


class _Progress:
    """A rich progress bar on stderr (layers done / to do, the current layer and what happened)."""

    def __init__(self, enabled: bool, total: int):
        self.bar = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("[bold cyan]batch"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), TextColumn("{task.description}"), console=Console(stderr=True))
            self.task = self.bar.add_task("", total=total)

    def __enter__(self):
        if self.bar is not None:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def working(self, name: str, what: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, description=f"{name}: {what}")

    def done(self, layer: LayerResult) -> None:
        if self.bar is not None:
            self.bar.advance(self.task)
            self.bar.console.print(f"  {layer.name}: {layer.status} {layer.template or ''} {layer.reason[:100]}",
                                   highlight=False, markup=False)


def run_batch(model, target: str = "A100", *, n: int | list[int] | None = None, dtype: str = "float16",
              select: str | None = None, min_sparsity: float = 0.3, out: str | Path = DEFAULT_OUT,
              resume: bool = False, backend: str = "auto", budget: int | None = None, memory: Any = None,
              previous: str | Path | None = None, tolerance: float = 0.05, progress: bool = False,
              workers: int | str | None = None, ray_address: str | None = None) -> BatchReport:
    """A verified kernel (or dense) for every selected weight of ``model``; see the module doc.

    ``model``: a .safetensors file, a folder of safetensors shards (with its index json), a .pt
    state_dict, an nn.Module or a name -> tensor dict. ``select``: regex the tensor names must
    match (re.search). ``min_sparsity``: weights sparser than this are worked on, the others
    skipped with the reason. ``out``: the folder for report.json, report.html, bundle/ and the
    journal. ``resume``: continue the batch already in ``out`` (nothing finished is redone).
    ``previous``: the out folder of an earlier batch of this model (re-pruned since): layers
    whose signature still matches start from its kernels, and any layer slower than there is
    flagged. ``tolerance``: how far (fraction) a reused kernel may be from its expected time.
    ``workers``: None (default: one process per local GPU when there are several, else this
    process), a number of local worker processes, or "ray" (Ray tasks; ``ray_address`` implies it);
    see `sparseditto.batch.workers`.
    """
    from sparseditto.api import _check_settings

    t0 = time.time()
    tgt, _note, n_values, resolved = _check_settings(target, n, dtype, backend, budget)
    min_sparsity = _check_fraction(min_sparsity, "min_sparsity")
    tolerance = _check_fraction(tolerance, "tolerance")
    if tolerance <= 0:
        raise ValueError("tolerance must be above 0 (a fraction such as 0.05).")
    from sparseditto.batch.workers import check_workers

    if workers is None and ray_address is None and resolved == "cuda" and isinstance(model, (str, Path)):
        import torch

        workers = torch.cuda.device_count() if torch.cuda.device_count() > 1 else None
    workers = check_workers(workers, ray_address, model)
    prev = _previous_layers(previous)
    refs = list_weights(model)
    selection = select_weights(refs, select)
    out_dir = _prepare_out(out)
    settings = BatchSettings(target=tgt, n_values=n_values, dtype=dtype, backend=resolved, budget=budget,
                             tolerance=tolerance, memory=memory, checkpoint=str(out_dir / "checkpoint.sqlite"))
    fingerprint = {"model": _model_label(model), "target": tgt.name, "n": n_values, "dtype": dtype,
                   "backend": resolved, "budget": budget, "select": select, "min_sparsity": min_sparsity,
                   "tolerance": tolerance, "previous": str(previous) if previous is not None else None}
    journal = Journal(out_dir)
    try:
        journal.start(fingerprint, resume)   # refused: out's batch and its report stay as they are
    except BaseException:
        journal.close()
        raise
    complete = False
    try:
        done = journal.done()
        with _Progress(progress, len(refs)) as bar:
            for ref, why in selection.skipped:
                if ref.name not in done:
                    done[ref.name] = _record(journal, bar, _base(ref, status="skipped", reason=why))
            groups = _analyze(selection.chosen, done, journal, bar, min_sparsity, dtype)
            if workers is None:
                for key, members in groups.items():
                    run_group(key, members, done, journal, bar, settings, prev)
            else:
                from sparseditto.batch.workers import run_groups

                run_groups(groups, done, journal, bar, settings, prev, model_path=str(Path(model).expanduser()),
                           out=out_dir, workers=workers, ray_address=ray_address)
        complete = True
    finally:
        try:
            report = _finish(model, out_dir, fingerprint, refs, journal.done(), prev, complete, time.time() - t0,
                             settings)
        finally:
            journal.close()
    return report


def _record(journal: Journal, bar: _Progress, layer: LayerResult) -> LayerResult:
    journal.record(layer)
    bar.done(layer)
    return layer


def _load(ref: WeightRef):
    from sparseditto.io import load_matrix

    return load_matrix(as_matrix_tensor(ref), name=ref.name)


def _report(ref: WeightRef) -> dict:
    from sparseditto.analysis import analyze

    return analyze(_load(ref)).model_dump(mode="json")


def _analyze(chosen, done, journal, bar, min_sparsity: float, dtype: str) -> "OrderedDict[str, list]":
    """Group key -> [(ref, report dict)] of the layers still to do (plus the done ones' keys)."""
    from sparseditto.analysis import analyze

    groups: OrderedDict[str, list] = OrderedDict()
    for ref in chosen:
        prior = done.get(ref.name)
        if prior is not None and (prior.status == "skipped" or not prior.group):
            continue
        if prior is not None:   # done before a resume: its group is known, no need to load it again
            groups.setdefault(prior.group, []).append((ref, None))
            continue
        bar.working(ref.name, "analyzing")
        try:
            A = _load(ref)
        except ValueError as exc:
            if "no nonzeros" in str(exc):
                done[ref.name] = _record(journal, bar, _base(ref, status="skipped", sparsity=1.0, nnz=0,
                                                             reason="all zeros: no pattern to build a kernel for"))
            else:
                done[ref.name] = _record(journal, bar, _base(ref, status="failed", reason=f"cannot load: {exc}"))
            continue
        m, k = A.shape
        sparsity = 1.0 - A.nnz / float(m * k)
        if sparsity < min_sparsity:
            if prior is None:
                done[ref.name] = _record(journal, bar, _base(
                    ref, status="skipped", sparsity=sparsity, nnz=A.nnz,
                    reason=f"sparsity {sparsity:.1%} is below min_sparsity {min_sparsity:.0%}"))
            continue
        report = analyze(A).model_dump(mode="json")
        del A
        groups.setdefault(group_key(report, dtype), []).append((ref, report))
    return groups


def run_group(key: str, members: list, done: dict, journal, bar: _Progress, settings: BatchSettings,
               prev: dict[str, LayerResult]) -> None:
    finished = [done[ref.name] for ref, _ in members if ref.name in done]
    winner = next((x for x in finished if x.status in WINNER_STATUSES), None)
    winner_ref = next((ref for ref, _ in members if winner is not None and ref.name == winner.name), None)
    winner_report = None
    by_signature = {x.signature: x for x in finished if x.status != "failed" and x.template}
    prev_by_signature = {x.signature: x for x in prev.values() if x.signature and x.template}
    for ref, report in members:
        if ref.name in done:
            continue
        t0 = time.time()
        base = _base(ref, status="failed", reason="unfinished", group=key, pattern=report["pattern"], sparsity=report["sparsity"], nnz=report["nnz"],
                     signature=report["signature"])
        try:
            same = by_signature.get(report["signature"])
            if same is not None:
                layer = _shared(same, base)
            else:
                A = _load(ref)
                layer = None
                old = prev_by_signature.get(report["signature"])
                if old is not None:
                    bar.working(ref.name, f"checking the previous batch's {old.template}")
                    got = try_reuse(old, report, base, A, report, settings)
                    if isinstance(got, LayerResult):
                        layer = got.model_copy(update=dict(
                            status="previous", reason=f"the previous batch's kernel for {old.name} (signature "
                                                      f"unchanged), verified here; {got.reason}"))
                why = None
                if layer is None and winner is not None:
                    bar.working(ref.name, f"starting from {winner.name}'s {winner.template}")
                    if winner_report is None:   # the winner was done before a resume: analyze it again
                        winner_report = _report(winner_ref)
                    got = try_reuse(winner, winner_report, base, A, report, settings)
                    layer, why = (got, None) if isinstance(got, LayerResult) else (None, got)
                if layer is None:
                    bar.working(ref.name, "full search (run_graph)")
                    layer = _search(A, base, report, settings, why)
                if winner is None and layer.status in WINNER_STATUSES:
                    winner, winner_report = layer, report
        except Exception as exc:   # one layer's failure is recorded; the batch goes on
            layer = base.model_copy(update=dict(status="failed", reason=f"{type(exc).__name__}: {str(exc)[:400]}"))
        layer = layer.model_copy(update=dict(seconds=round(time.time() - t0, 3)))
        old = prev.get(ref.name)
        if old is not None and old.kernel_ms and layer.kernel_ms and layer.kernel_ms > old.kernel_ms * (1 + settings.tolerance):
            layer.previous_kernel_ms, layer.slower_than_previous = old.kernel_ms, True
        elif old is not None:
            layer.previous_kernel_ms = old.kernel_ms
        done[ref.name] = _record(journal, bar, layer)
        if layer.status != "failed" and layer.template:
            by_signature.setdefault(layer.signature, layer)


def _finish(model, out_dir: Path, fingerprint: dict, refs, done: dict, prev, complete: bool, wall: float,
            settings: BatchSettings) -> BatchReport:
    from sparseditto.batch.bundle import write_bundle
    from sparseditto.batch.report import write_reports

    order = [r.name for r in refs]
    layers = [done[name] for name in order if name in done]
    report = BatchReport(model=fingerprint["model"], out=str(out_dir), settings=fingerprint, layers=layers,
                         complete=complete and len(layers) == len(order), wall_seconds=round(wall, 3),
                         timings_are_gpu=settings.gpu, groups=len({x.group for x in layers if x.group}))
    if not settings.gpu:
        report.notes.append("Ran on the CPU (Triton interpreter): kernel and dense times are the roofline cost "
                            "model's estimates on the target, NOT GPU timings.")
    write_bundle(out_dir / "bundle", layers)
    write_reports(out_dir, report)
    return report
