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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from sparseditto.batch.models import WINNER_STATUSES, LayerResult


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
               settings, prev: dict[str, LayerResult], until_winner: bool = False) -> tuple[list[LayerResult], dict]:
    """Run one group (or one shard of it) in this process; returns the layers it finished, in order,
    and the dense timings by shape it knows (`baselines.ShapeBaselines`: the driver merges them).
    ``until_winner``: stop once the group has its winner (the lead job of `run_groups`)."""
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
              settings, prev, until_winner=until_winner)
    return sink.layers, dict(settings.baselines.dense)


def _pin(devices) -> None:
    """Process-pool initializer: take one GPU id and make it the only one this worker sees."""
    device = devices.get()
    if device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(device)


@dataclass
class _Job:
    """One unit sent to a worker: a group's lead (its layers up to the winner) or a shard of the
    rest of a group (layers that each start from the winner)."""

    key: str                                   # the group
    members: list                              # [(ref, report)] this job works on
    own: dict                                  # finished layers of the group it needs (the winner, ...)
    settings: Any
    lead: bool

    def args(self, model_path: str, prev: dict) -> tuple:
        names = [(ref.name, report) for ref, report in self.members]
        # of the previous batch, only what this job's layers can use: their own (the slower-than-before
        # flag) and those of their signatures (a kernel to start from), not every layer's source
        mine = {name for name, _ in names}
        signatures = {(report or {}).get("signature") for _, report in names} - {None}
        prev = {name: x for name, x in prev.items() if name in mine or x.signature in signatures}
        return (model_path, self.key, names, self.own, self.settings, prev, self.lead)


SHARDS_PER_WORKER = 3    # a group's reused layers go out in about this many shards per worker (load balance)
MAX_SHARD_LAYERS = 8     # and at most this many layers each: a job's layers reach the journal when it returns,
                         # so an interrupted batch loses at most this many per worker
TIMES_SEED_LAYERS = 8    # finished layers of the group a shard gets to seed its GroupTimes median


def _winner(members, done) -> LayerResult | None:
    return next((done[ref.name] for ref, _ in members if ref.name in done
                 and done[ref.name].status in WINNER_STATUSES), None)


def _settings_for(settings, out: Path, key: str, part: str | None):
    name = key if part is None else f"{key}|{part}"
    return replace(settings, memory=False, checkpoint=group_checkpoint(out, name))


def _lead_job(key, members, done, settings, out: Path) -> _Job:
    """The group's layers up to its winner (a full search; failures before it are recorded and the
    next layer searched), with the members already done (a resumed batch)."""
    own = {ref.name: done[ref.name] for ref, _ in members if ref.name in done}
    return _Job(key, list(members), own, _settings_for(settings, out, key, None), lead=True)


def shard_members(members: list, done: dict, shard_size: int, taken: set | frozenset = frozenset()) -> list[list]:
    """A group's unfinished members (not in ``taken``: sent out already) cut into shards of about
    ``shard_size`` layers, in order; the layers of one structure signature stay in one shard (the
    first shares its kernel with the rest)."""
    by_signature: dict = {}
    for ref, report in members:
        if ref.name not in done and ref.name not in taken:
            sig = (report or {}).get("signature") or ref.name
            by_signature.setdefault(sig, []).append((ref, report))
    shards, current = [], []
    for same in by_signature.values():
        if current and len(current) + len(same) > shard_size:
            shards.append(current)
            current = []
        current = current + same
    if current:
        shards.append(current)
    return shards


def _shard_jobs(key, members, done, settings, out: Path, shard_size: int,
                taken: set | frozenset = frozenset()) -> list[_Job]:
    """The rest of a group that has its winner (less ``taken``), in shards that each start from it."""
    winner = _winner(members, done)
    if winner is None:
        return []
    seen = [ref for ref, _ in members if ref.name in done and ref.name != winner.name][-TIMES_SEED_LAYERS:]
    common = {winner.name: winner, **{ref.name: done[ref.name] for ref in seen}}
    by_name = {ref.name: (ref, report) for ref, report in members}
    by_signature: dict = {}
    for ref, report in members:        # finished layers a shard's layer can share a kernel with outright
        if ref.name in done and done[ref.name].template and done[ref.name].status != "failed":
            by_signature.setdefault((report or {}).get("signature"), ref.name)
    jobs = []
    for shard in shard_members(members, done, shard_size, taken):
        same = {by_signature[sig] for sig in ((rep or {}).get("signature") for _, rep in shard) if sig in by_signature}
        own = {**common, **{name: done[name] for name in sorted(same)}}
        context = [by_name[name] for name in own]        # their analyses travel too (the winner's, the seeds')
        jobs.append(_Job(key, context + shard, own, _settings_for(settings, out, key, f"from {shard[0][0].name}"),
                         lead=False))
    return jobs


def _cost(job: _Job) -> float:
    """Work of a job for longest-first dispatch: its unfinished layers' elements."""
    return sum(float(np.prod(ref.matrix_shape or (1, 1))) for ref, _ in job.members if ref.name not in job.own)


def _failed(members, done, reason: str) -> list[LayerResult]:
    from sparseditto.batch.group import base_layer

    return [base_layer(ref, status="failed", reason=reason) for ref, _ in members if ref.name not in done]


def run_groups(analyses, done: dict, journal, bar, settings, prev, *, model_path: str, out: Path,
               workers: int | str, ray_address: str | None = None) -> None:
    """Every unfinished layer, sent out; each returned layer is journaled by the driver.

    ``analyses``: the `runner.AnalysisPass` of the batch, taken as it goes: a group's lead (its first
    layer's full search; the next layer's when it fails) goes out as soon as that layer is analyzed,
    while the rest of the model is; once a group has its winner, the rest goes out in shards that
    start from it (`_Dispatch`), longest first, so that all workers stay busy on the big groups too
    (a 7B model has three groups of 128, 64 and 32 layers). Several workers may share one GPU:
    every timing takes the GPU alone (`harness.gpu_lock`), the rest of their work runs side by side."""
    slots = 2 if workers == "ray" else int(workers)
    if workers == "ray":
        if ray_address is not None:   # a remote cluster: its nodes keep their own cache directory
            settings = replace(settings, cache_dir=None)
        pool = _RayPool(model_path, prev, settings, ray_address)
    else:
        pool = _LocalPool(model_path, prev, settings, int(workers))
    plan = _Dispatch(analyses.groups, done, settings, out, slots)
    with pool:
        while True:
            keys = {key for key, _, _ in analyses.take(block=False)}
            final = analyses.finished
            if final and not plan.final:
                plan.finish()
                keys = set(analyses.groups)
                bar.plan(analyses.groups, done)   # the ETA counts every group from now on
            for job in plan.jobs(keys):
                pool.submit(job)
            if final and not pool.busy():
                break        # every group was looked at when the pass ended and after each of its jobs
            got = pool.poll(None if final else ANALYSIS_POLL_S)
            if got is None:
                continue
            job, returned, error = got
            if error is not None:
                layers = _failed(job.members, done, f"worker failed: {error}")
            else:
                layers, dense = returned
                settings.baselines.merge(dense)   # later jobs carry the shapes' dense timings
            for layer in layers:
                journal.record(layer)
                bar.done(layer)
                done[layer.name] = layer
            plan.returned(job)
            for follow in plan.jobs({job.key}):
                pool.submit(follow)


ANALYSIS_POLL_S = 0.05   # how often the driver looks at the analysis pass while it runs
STOP_GRACE_S = 5.0       # an interrupted driver's workers get this long after SIGTERM, then SIGKILL


class _Dispatch:
    """Which jobs go out next, as the analyses come in and the jobs come back (`run_groups`).

    A group without a winner has at most one lead out at a time (its first unfinished layer); a group
    with one sends its unfinished layers in shards: while the analysis pass runs, only full shards of
    MAX_SHARD_LAYERS (the rest waits for more layers), after it, everything left, in shards sized so
    that the workers get about SHARDS_PER_WORKER each."""

    def __init__(self, groups: dict, done: dict, settings, out: Path, slots: int):
        self.groups, self.done, self.settings, self.out, self.slots = groups, done, settings, out, slots
        self.sent: set = set()       # layers in a job that went out
        self.leading: set = set()    # groups with a lead out
        self.final = False
        self.shard_size = MAX_SHARD_LAYERS

    def finish(self) -> None:
        """The analysis pass is over: size the remaining shards by what is left."""
        self.final = True
        left = sum(1 for members in self.groups.values() for ref, _ in members
                   if ref.name not in self.done and ref.name not in self.sent)
        self.shard_size = max(1, min(MAX_SHARD_LAYERS, -(-left // (self.slots * SHARDS_PER_WORKER))))

    def returned(self, job: _Job) -> None:
        if job.lead:
            self.leading.discard(job.key)

    def jobs(self, keys) -> list[_Job]:
        out = []
        for key in keys:
            out += self._for_group(key)
        out.sort(key=lambda j: (not j.lead, -_cost(j)))
        for job in out:
            self.sent.update(ref.name for ref, _ in job.members if ref.name not in job.own)
        return out

    def _for_group(self, key) -> list[_Job]:
        members = self.groups.get(key) or []
        avail = [(ref, rep) for ref, rep in members if ref.name not in self.done and ref.name not in self.sent]
        if not avail:
            return []
        if _winner(members, self.done) is None:
            if key in self.leading:
                return []
            self.leading.add(key)
            finished = [(ref, rep) for ref, rep in members if ref.name in self.done]
            return [_lead_job(key, finished + avail[:1], self.done, self.settings, self.out)]
        if not self.final and len(avail) < MAX_SHARD_LAYERS:
            return []                # while the analysis runs, wait for a full shard
        jobs = _shard_jobs(key, members, self.done, self.settings, self.out, self.shard_size, self.sent)
        if not self.final and jobs:
            last = [ref for ref, _ in jobs[-1].members if ref.name not in jobs[-1].own]
            if len(last) < self.shard_size:
                jobs = jobs[:-1]     # a partial shard waits for the rest of the group's analyses
        return jobs


def _idle(timeout: float | None) -> None:
    """A pool's poll with nothing out: wait ``timeout`` seconds (the driver's analysis pass may hand it
    work meanwhile), then nothing finished."""
    if timeout:
        import time

        time.sleep(timeout)
    return None


class _LocalPool:
    """Spawned worker processes, each pinned to one local GPU (round robin: several per GPU when
    there are more workers than GPUs)."""

    def __init__(self, model_path: str, prev, settings, workers: int):
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        ctx = mp.get_context("spawn")
        devices = ctx.Queue()
        count = 0
        if settings.gpu:
            import torch

            count = torch.cuda.device_count()
        for i in range(workers):
            devices.put(i % count if count else None)
        self._pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_pin, initargs=(devices,))
        self._model_path, self._prev = model_path, prev
        self._futures: dict = {}

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            # Ctrl-C, or `timeout`'s SIGTERM turned into KeyboardInterrupt in the driver: the report of
            # what was journaled is written now, not after every running job's last layer
            processes = list(getattr(self._pool, "_processes", {}).values())
            for process in processes:
                process.terminate()
            import time

            deadline = time.monotonic() + STOP_GRACE_S
            for process in processes:   # one that does not stop on SIGTERM in time is killed
                process.join(max(0.0, deadline - time.monotonic()))
                if process.is_alive():
                    process.kill()
                    process.join(5)
        self._pool.shutdown(wait=exc_type is None, cancel_futures=True)

    def submit(self, job: _Job) -> None:
        self._futures[self._pool.submit(group_task, *job.args(self._model_path, self._prev))] = job

    def busy(self) -> bool:
        return bool(self._futures)

    def poll(self, timeout: float | None):
        """(job, its return, error) of a job that finished, or None after ``timeout`` seconds (None: wait;
        nothing out: None at once)."""
        from concurrent.futures import FIRST_COMPLETED, wait

        if not self._futures:
            return _idle(timeout)
        finished, _ = wait(list(self._futures), timeout=timeout, return_when=FIRST_COMPLETED)
        if not finished:
            return None
        future = next(iter(finished))
        job = self._futures.pop(future)
        try:
            return job, future.result(), None
        except Exception as exc:   # a worker process that died takes only its job with it
            return job, None, f"{type(exc).__name__}: {str(exc)[:300]}"


class _RayPool:
    """The same jobs as Ray tasks with one GPU each."""

    def __init__(self, model_path: str, prev, settings, address: str | None):
        try:
            import ray
        except ImportError:
            raise ValueError("workers='ray' needs Ray: pip install 'sparseditto[ray]'.") from None
        if not ray.is_initialized():
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
        self._ray = ray
        self._task = ray.remote(num_gpus=1 if settings.gpu else 0, num_cpus=1, max_retries=0)(group_task)
        self._model_path, self._prev = model_path, prev
        self._pending: dict = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for ref in self._pending:
            self._ray.cancel(ref, force=True)

    def submit(self, job: _Job) -> None:
        self._pending[self._task.remote(*job.args(self._model_path, self._prev))] = job

    def busy(self) -> bool:
        return bool(self._pending)

    def poll(self, timeout: float | None):
        """As `_LocalPool.poll`."""
        if not self._pending:
            return _idle(timeout)
        ready, _ = self._ray.wait(list(self._pending), num_returns=1, timeout=timeout)
        if not ready:
            return None
        job = self._pending.pop(ready[0])
        try:
            return job, self._ray.get(ready[0]), None
        except Exception as exc:
            return job, None, f"{type(exc).__name__}: {str(exc)[:300]}"


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
