"""Groups of a batch run in worker processes: one per local GPU, or Ray tasks (one GPU each).

Groups are independent (a group's layers only ever start from that group's winner), so a group
is the unit of work sent out: `group_task` runs `group.run_group` for one group in the worker and
returns its finished `LayerResult`s. Only the driver writes: it records each returned layer in
the journal and never lets a worker touch the SQLite memory (workers run with ``memory=False``;
the run_graph checkpoints of a group's searches go to ``OUT/checkpoints/<group>.sqlite``, so a
killed worker's search resumes on the next ``resume``). Workers re-list the model file
themselves, so only a model on disk (not an in-memory nn.Module) can be sent out.

Local workers are spawned processes, each pinned to one GPU through CUDA_VISIBLE_DEVICES before
torch is imported there. Ray tasks need the ``ray`` extra (``pip install 'sparseditto[ray]'``).

Compiled kernels are shared: every worker uses the driver's cache directory
(``settings.cache_dir``, set as SPARSEDITTO_CACHE_DIR before the worker's sandbox starts), and the
sandbox points Triton's, CuPy's and the CUDA driver's caches under it
(`sparseditto.harness.isolation.cache_subdirs`), so a kernel one worker compiled is a cache hit
for every later worker and batch. A Ray cluster given by address keeps each node's own default
cache directory (the driver's path need not exist there).
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from sparseditto.batch.models import LayerResult


class _Collect:
    """The worker's stand-in for the journal: keeps the layers to hand back to the driver."""

    def __init__(self):
        self.layers: list[LayerResult] = []

    def record(self, layer: LayerResult) -> None:
        self.layers.append(layer)


def group_checkpoint(out: Path, key: str) -> str:
    folder = out / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    return str(folder / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.sqlite")


def group_task(model_path: str, key: str, members: list[tuple[str, dict | None]], done: dict[str, LayerResult],
               settings, prev: dict[str, LayerResult]) -> list[LayerResult]:
    """Run one group in this process; returns the layers it finished (in order)."""
    if settings.cache_dir:   # before this process's sandbox starts
        os.environ["SPARSEDITTO_CACHE_DIR"] = settings.cache_dir
    from sparseditto.harness.sandbox import get_pool

    get_pool().prestart(settings.backend)   # the sandbox imports torch/Triton while this process imports the agents
    from sparseditto.batch.group import run_group
    from sparseditto.batch.progress import Progress
    from sparseditto.batch.weights import list_weights

    refs = {r.name: r for r in list_weights(model_path)}
    sink = _Collect()
    run_group(key, [(refs[name], report) for name, report in members], dict(done), sink, Progress(False, 0),
              settings, prev)
    return sink.layers


def _pin(devices) -> None:
    """Process-pool initializer: take one GPU id and make it the only one this worker sees."""
    device = devices.get()
    if device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(device)


def _jobs(groups, done, settings, out: Path):
    for key, members in groups.items():
        if all(ref.name in done for ref, _ in members):
            continue
        names = [(ref.name, report) for ref, report in members]
        own = {ref.name: done[ref.name] for ref, _ in members if ref.name in done}
        yield key, names, own, replace(settings, memory=False, checkpoint=group_checkpoint(out, key))


def _failed(members, done, reason: str) -> list[LayerResult]:
    from sparseditto.batch.group import base_layer

    return [base_layer(ref, status="failed", reason=reason) for ref, _ in members if ref.name not in done]


def run_groups(groups, done: dict, journal, bar, settings, prev, *, model_path: str, out: Path,
               workers: int | str, ray_address: str | None = None) -> None:
    """Every unfinished group, sent out; each returned layer is journaled by the driver."""
    jobs = list(_jobs(groups, done, settings, out))
    if not jobs:
        return
    if workers == "ray":
        if ray_address is not None:   # a remote cluster: its nodes keep their own cache directory
            jobs = [(key, names, own, replace(s, cache_dir=None)) for key, names, own, s in jobs]
        results = _ray_results(jobs, model_path, prev, settings, ray_address)
    else:
        results = _local_results(jobs, model_path, prev, settings, int(workers))
    for key, layers, error in results:
        if error is not None:
            layers = _failed(groups[key], done, f"worker failed: {error}")
        for layer in layers:
            journal.record(layer)
            bar.done(layer)
            done[layer.name] = layer


def _local_results(jobs, model_path: str, prev, settings, workers: int):
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    ctx = mp.get_context("spawn")
    devices = ctx.Queue()
    count = 0
    if settings.gpu:
        import torch

        count = torch.cuda.device_count()
    for i in range(workers):
        devices.put(i % count if count else None)
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_pin, initargs=(devices,)) as pool:
        futures = {pool.submit(group_task, model_path, key, names, own, s, prev): key for key, names, own, s in jobs}
        for future in as_completed(futures):
            try:
                yield futures[future], future.result(), None
            except Exception as exc:   # a worker process that died takes only its group with it
                yield futures[future], [], f"{type(exc).__name__}: {str(exc)[:300]}"


def _ray_results(jobs, model_path: str, prev, settings, address: str | None):
    try:
        import ray
    except ImportError:
        raise ValueError("workers='ray' needs Ray: pip install 'sparseditto[ray]'.") from None
    if not ray.is_initialized():
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    task = ray.remote(num_gpus=1 if settings.gpu else 0, num_cpus=1, max_retries=0)(group_task)
    pending = {task.remote(model_path, key, names, own, s, prev): key for key, names, own, s in jobs}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        key = pending.pop(ready[0])
        try:
            yield key, ray.get(ready[0]), None
        except Exception as exc:
            yield key, [], f"{type(exc).__name__}: {str(exc)[:300]}"


def check_workers(workers: Any, ray_address: str | None, model) -> int | str | None:
    """None (in this process), an int >= 2 (local processes) or 'ray'; ValueError otherwise."""
    if ray_address is not None:
        workers = "ray"
    if workers in (None, 0, 1, "1"):
        return None
    if workers != "ray":
        try:
            workers = int(workers)
        except (TypeError, ValueError):
            raise ValueError(f"workers must be a number of processes or 'ray', got {workers!r}.") from None
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}.")
    if not isinstance(model, (str, os.PathLike)):
        raise ValueError("workers need the model as a file or folder (each worker reads its own layers); "
                         "save the nn.Module's state_dict first, or run without workers.")
    return workers
