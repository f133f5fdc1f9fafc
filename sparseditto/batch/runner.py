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

from sparseditto.batch.group import base_layer, load_weight, record_layer, run_group
from sparseditto.batch.grouping import group_key, select_weights
from sparseditto.batch.journal import Journal
from sparseditto.batch.models import BatchReport, LayerResult
from sparseditto.batch.progress import Progress
from sparseditto.batch.reuse import BatchSettings
from sparseditto.batch.weights import list_weights

DEFAULT_OUT = "sparseditto-batch"
NCU_MODES = ("best", "all", "off")


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


def run_batch(model, target: str = "A100", *, n: int | list[int] | None = None, dtype: str = "float16",
              select: str | None = None, min_sparsity: float = 0.3, out: str | Path = DEFAULT_OUT,
              resume: bool = False, backend: str = "auto", budget: int | None = None, memory: Any = None,
              previous: str | Path | None = None, tolerance: float = 0.05, progress: bool = False,
              workers: int | str | None = None, ray_address: str | None = None, ncu: str = "best") -> BatchReport:
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
    see `sparseditto.batch.workers`. ``ncu``: Nsight Compute inside each full search, as run_graph's
    ``ncu`` (best | all | off).
    """
    from sparseditto.api import _check_settings

    t0 = time.time()
    tgt, target_note, n_values, resolved = _check_settings(target, n, dtype, backend, budget)
    min_sparsity = _check_fraction(min_sparsity, "min_sparsity")
    tolerance = _check_fraction(tolerance, "tolerance")
    if tolerance <= 0:
        raise ValueError("tolerance must be above 0 (a fraction such as 0.05).")
    if ncu not in NCU_MODES:
        raise ValueError(f"ncu must be one of {', '.join(NCU_MODES)} (Nsight Compute inside each search), got {ncu!r}.")
    from sparseditto.batch.workers import check_workers

    if workers is None and ray_address is None and resolved == "cuda" and isinstance(model, (str, Path)):
        import torch

        workers = torch.cuda.device_count() if torch.cuda.device_count() > 1 else None
    workers = check_workers(workers, ray_address, model)
    prev = _previous_layers(previous)
    refs = list_weights(model)
    selection = select_weights(refs, select)
    out_dir = _prepare_out(out)
    from sparseditto.paths import cache_dir

    settings = BatchSettings(target=tgt, n_values=n_values, dtype=dtype, backend=resolved, budget=budget,
                             tolerance=tolerance, memory=memory, checkpoint=str(out_dir / "checkpoint.sqlite"),
                             cache_dir=str(cache_dir()), ncu=ncu)
    fingerprint = {"model": _model_label(model), "target": tgt.name, "n": n_values, "dtype": dtype,
                   "backend": resolved, "budget": budget, "select": select, "min_sparsity": min_sparsity,
                   "tolerance": tolerance, "previous": str(previous) if previous is not None else None}
    if ncu != "best":   # the default is left out: a journal written before this setting existed still resumes
        fingerprint["ncu"] = ncu
    journal = Journal(out_dir)
    try:
        journal.start(fingerprint, resume)   # refused: out's batch and its report stay as they are
    except BaseException:
        journal.close()
        raise
    complete = False
    try:
        done = journal.done()
        if workers is None and any(ref.name not in done for ref in selection.chosen):
            from sparseditto.harness.sandbox import get_pool

            get_pool().prestart(resolved)   # the sandbox imports torch/Triton while the layers are analyzed
        with Progress(progress, len(refs)) as bar:
            for ref, why in selection.skipped:
                if ref.name not in done:
                    done[ref.name] = record_layer(journal, bar, base_layer(ref, status="skipped", reason=why))
            if workers is None:
                groups = _analyze(selection.chosen, done, journal, bar, min_sparsity, dtype)
                bar.plan(groups, done)
                for key, members in groups.items():
                    run_group(key, members, done, journal, bar, settings, prev)
            else:
                from sparseditto.batch.workers import run_groups

                # the workers start on each group as soon as its first layer is analyzed (AnalysisPass)
                with AnalysisPass(selection.chosen, done, journal, bar, min_sparsity, dtype) as analyses:
                    run_groups(analyses, done, journal, bar, settings, prev, model_path=str(Path(model).expanduser()),
                               out=out_dir, workers=workers, ray_address=ray_address)
        complete = True
    finally:
        try:
            report = _finish(model, out_dir, fingerprint, refs, journal.done(), prev, complete, time.time() - t0,
                             settings, target_note)
        finally:
            journal.close()
    return report


ANALYSIS_THREADS = 8   # at most; the weights are loaded and analyzed this many at a time


def _analysis_threads() -> int:
    """Threads for the analysis pass: torch's and numpy's large-array kernels drop the GIL, so a
    few threads overlap the loads and analyses of several weights (a 7B checkpoint: 224 weights,
    1-3 s each on one thread); one core is left to the progress display and the journal."""
    import os

    return max(1, min(ANALYSIS_THREADS, (os.cpu_count() or 2) - 1))


def _analyze_one(ref, min_sparsity: float):
    """(layer to record, None) when ``ref`` is skipped or fails to load; (None, report) otherwise."""
    from sparseditto.analysis import analyze

    t0 = time.time()
    try:
        A = load_weight(ref)
    except ValueError as exc:
        if "no nonzeros" in str(exc):
            return base_layer(ref, status="skipped", sparsity=1.0, nnz=0,
                              reason="all zeros: no pattern to build a kernel for"), None
        return base_layer(ref, status="failed", reason=f"cannot load: {exc}"), None
    m, k = A.shape
    sparsity = 1.0 - A.nnz / float(m * k)
    if sparsity < min_sparsity:
        return base_layer(ref, status="skipped", sparsity=sparsity, nnz=A.nnz,
                          reason=f"sparsity {sparsity:.1%} is below min_sparsity {min_sparsity:.0%}"), None
    report = analyze(A).model_dump(mode="json")
    report["analyze_seconds"] = round(time.time() - t0, 3)   # load + analysis, shown in the layer's phases
    return None, report


class AnalysisPass:
    """The analysis pass, taken a step at a time: each weight is loaded and analyzed once (a few at a
    time, `_analysis_threads`), its report kept and the matrix dropped, so a 7B checkpoint is never held
    whole; results are recorded in the model's order (the groups and the journal do not depend on the
    threads' timing), each report journaled at once, and a resumed batch takes the journal's reports
    instead of analyzing again. ``groups``: group key -> [(ref, report dict)] as known so far (the done
    layers' keys included).

    Why a stream: with workers (`workers.run_groups`) a group's lead can start as soon as its first
    layer is analyzed, while the rest of the model is (the H200's analysis pass took ~54 s for the 224
    weights of a 7B-shaped checkpoint, session 39); `_analyze` simply drains it."""

    def __init__(self, chosen, done: dict, journal, bar, min_sparsity: float, dtype: str):
        from collections import deque
        from concurrent.futures import ThreadPoolExecutor
        from itertools import islice

        self.groups: OrderedDict[str, list] = OrderedDict()
        self._done, self._journal, self._bar, self._min, self._dtype = done, journal, bar, min_sparsity, dtype
        self._known = journal.analyses() if journal is not None else {}
        todo = []
        for ref in chosen:
            prior = done.get(ref.name)
            if prior is not None and (prior.status == "skipped" or not prior.group):
                continue
            if prior is not None:   # done before a resume: its group and analysis are known, no need to load it again
                self.groups.setdefault(prior.group, []).append((ref, self._known.get(ref.name)))
                continue
            todo.append(ref)
        self._todo = deque(todo)
        self._fresh = iter([ref for ref in todo if ref.name not in self._known])   # in todo's order
        threads = _analysis_threads()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="analyze")
        # a bounded window of weights in flight: memory stays at `threads` (+1) matrices, and a Ctrl-C
        # waits for at most that many analyses
        self._window = deque(self._pool.submit(_analyze_one, ref, min_sparsity)
                             for ref in islice(self._fresh, threads + 1))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._pool.shutdown(wait=True, cancel_futures=True)

    @property
    def finished(self) -> bool:
        return not self._todo

    def take(self, block: bool = True) -> list[tuple[str, Any, dict]]:
        """Record the next weights in model order whose analysis is ready: all that are (``block``: and
        wait for at least one unless finished); returns their (group key, ref, report)."""
        added = []
        while self._todo:
            ref = self._todo[0]
            report = self._known.get(ref.name)
            if report is None:
                if not self._window[0].done() and not (block and not added):
                    break
                self._bar.working(ref.name, "analyzing")
                layer, report = self._window.popleft().result()
                following = next(self._fresh, None)
                if following is not None:
                    self._window.append(self._pool.submit(_analyze_one, following, self._min))
                self._todo.popleft()
                if layer is not None:
                    self._done[ref.name] = record_layer(self._journal, self._bar, layer)
                    continue
                if self._journal is not None:
                    self._journal.record_analysis(ref.name, report)
            else:
                self._todo.popleft()
            key = group_key(report, self._dtype)
            self.groups.setdefault(key, []).append((ref, report))
            added.append((key, ref, report))
        return added


def _analyze(chosen, done, journal, bar, min_sparsity: float, dtype: str) -> "OrderedDict[str, list]":
    """Group key -> [(ref, report dict)] of the layers still to do (plus the done ones' keys): the whole
    `AnalysisPass` at once (the batch in one process)."""
    with AnalysisPass(chosen, done, journal, bar, min_sparsity, dtype) as analyses:
        while not analyses.finished:
            analyses.take(block=True)
        return analyses.groups


def _finish(model, out_dir: Path, fingerprint: dict, refs, done: dict, prev, complete: bool, wall: float,
            settings: BatchSettings, target_note: str | None = None) -> BatchReport:
    from sparseditto.batch.bundle import write_bundle
    from sparseditto.batch.report import write_reports

    order = [r.name for r in refs]
    layers = [done[name] for name in order if name in done]
    report = BatchReport(model=fingerprint["model"], out=str(out_dir), settings=fingerprint, layers=layers,
                         complete=complete and len(layers) == len(order), wall_seconds=round(wall, 3),
                         timings_are_gpu=settings.gpu, groups=len({x.group for x in layers if x.group}),
                         target_note=target_note)   # e.g. planned for an A100 on an H200: what it left out
    if not settings.gpu:
        report.notes.append("Ran on the CPU (Triton interpreter): kernel and dense times are the roofline cost "
                            "model's estimates on the target, NOT GPU timings.")
    write_bundle(out_dir / "bundle", layers)
    write_reports(out_dir, report)
    return report
