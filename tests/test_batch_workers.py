"""The groups of a batch in worker processes (local, spawned) and as Ray tasks (local cluster).

Each worker runs its group's search in its own process; only the driver writes the journal, so
the outcome must be the same batch as in one process: every layer searched once, all journaled.
Every worker's sandbox works in the driver's cache directory (kernel sources, Triton / CuPy /
CUDA compiler caches), so a second worker process compiles nothing the first one compiled: on the
CPU nothing is compiled (the interpreter), so that part is the GPU test at the end.
"""
from __future__ import annotations

import os
import sqlite3

import pytest
import torch

from batch_models import small_unstructured
from sparseditto.batch.journal import JOURNAL_NAME
from sparseditto.batch.runner import run_batch

RUN = dict(target="A100", n=[16], backend="interpret", budget=1, memory=False)


def _model(tmp_path):
    sd = {"a.weight": small_unstructured(64, 64, 1), "b.weight": small_unstructured(64, 96, 2)}
    torch.save(sd, tmp_path / "model.pt")
    return tmp_path / "model.pt", sd


def _check(report, out, sd, parent_pid):
    assert report.complete and all(x.status == "searched" for x in report.layers), report.layers
    with sqlite3.connect(str(out / JOURNAL_NAME)) as conn:
        assert {r[0] for r in conn.execute("SELECT name FROM layers")} == set(sd)
    # the searches ran elsewhere: their run_graph checkpoints are the per-group files
    assert len(list((out / "checkpoints").glob("*.sqlite"))) == 2


def _check_shared_cache(report, cache):
    """The workers' sandboxes compiled and stored their kernels under the driver's cache dir."""
    from sparseditto.harness.isolation import cache_subdirs
    from sparseditto.harness.source_loader import source_hash

    stored = {p.stem for p in (cache / "kernels").glob("*.py")}
    verified = [x for x in report.layers if x.template != "dense"]
    assert all(source_hash(x.source) in stored for x in verified) and stored
    assert all(path.is_dir() for path in cache_subdirs(cache).values())


def _cache_files(cache) -> dict[str, int]:
    """Every compiled artefact of the shared compiler caches, by path, with its mtime (ns)."""
    from sparseditto.harness.isolation import cache_subdirs

    return {str(p): p.stat().st_mtime_ns for name, folder in cache_subdirs(cache).items() if name != "TRITON_HOME"
            for p in folder.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_local_worker_processes(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSEDITTO_CACHE_DIR", str(tmp_path / "cache"))
    path, sd = _model(tmp_path)
    report = run_batch(path, out=tmp_path / "out", workers=2, **RUN)
    _check(report, tmp_path / "out", sd, os.getpid())
    _check_shared_cache(report, tmp_path / "cache")


def test_ray_tasks_on_a_local_cluster(tmp_path, monkeypatch):
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'sparseditto[ray]')")
    monkeypatch.setenv("SPARSEDITTO_CACHE_DIR", str(tmp_path / "cache"))
    path, sd = _model(tmp_path)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        report = run_batch(path, out=tmp_path / "out", workers="ray", **RUN)
    finally:
        ray.shutdown()
    _check(report, tmp_path / "out", sd, os.getpid())


def test_workers_refuse_an_in_memory_module(tmp_path):
    with pytest.raises(ValueError, match="workers need the model as a file"):
        run_batch(torch.nn.Linear(4, 4), out=tmp_path / "o", workers=2, **RUN)
    with pytest.raises(ValueError, match="workers must be a number"):
        run_batch(tmp_path, out=tmp_path / "o", workers="many", **RUN)


@pytest.mark.gpu
def test_a_second_batch_of_worker_processes_compiles_nothing_new(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSEDITTO_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("TRITON_CACHE_DIR", "TRITON_HOME", "CUPY_CACHE_DIR", "CUDA_CACHE_PATH"):
        monkeypatch.delenv(name, raising=False)   # the sandbox derives them from the cache dir (device_run.sh sets one)
    path, sd = _model(tmp_path)
    gpu = dict(RUN, backend="cuda", target="H200")
    first = run_batch(path, out=tmp_path / "out1", workers=2, **gpu)
    _check(first, tmp_path / "out1", sd, os.getpid())
    compiled = _cache_files(tmp_path / "cache")
    assert compiled, "the workers compiled nothing into the shared cache"
    second = run_batch(path, out=tmp_path / "out2", workers=2, **gpu)   # two new worker processes
    assert [x.source_hash for x in second.layers] == [x.source_hash for x in first.layers]
    assert _cache_files(tmp_path / "cache") == compiled     # same files, same mtimes: all cache hits


def _refs(names, shape=(256, 1024)):
    from sparseditto.batch.weights import WeightRef

    return [WeightRef(name, shape, "float16", lambda: None) for name in names]


def test_a_group_is_sent_out_as_its_lead_then_shards_that_start_from_the_winner(tmp_path):
    """The scheduling of run_groups without running anything: a group with no winner sends its lead;
    one with a winner sends the rest in shards, layers of one signature together, each shard carrying
    the winner (and a few finished layers for its median) but never a layer of another shard."""
    from sparseditto.batch.group import base_layer
    from sparseditto.batch.reuse import BatchSettings
    from sparseditto.batch.workers import _lead_job, _shard_jobs, shard_members
    from sparseditto.targets import get_target

    refs = _refs([f"l{i}" for i in range(8)])
    sig = {"l0": "a", "l1": "b", "l2": "c", "l3": "c", "l4": "d", "l5": "e", "l6": "f", "l7": "g"}
    members = [(ref, {"signature": sig[ref.name]}) for ref in refs]
    settings = BatchSettings(target=get_target("A100"), n_values=[16], dtype="float16", backend="interpret",
                             budget=1, tolerance=0.05, memory=False, checkpoint=str(tmp_path / "c.sqlite"))
    lead = _lead_job("g", members, {}, settings, tmp_path)
    assert lead.lead and [r.name for r, _ in lead.members] == [r.name for r in refs] and lead.own == {}
    assert lead.settings.memory is False and lead.settings.checkpoint.startswith(str(tmp_path / "checkpoints"))
    assert _shard_jobs("g", members, {}, settings, tmp_path, 2) == []          # no winner yet: no shards
    done = {"l0": base_layer(refs[0], status="searched", template="bsr_tc", kernel_ms=0.01),
            "l1": base_layer(refs[1], status="reused", template="bsr_tc", kernel_ms=0.011)}
    shards = shard_members(members, done, 2)
    assert [[r.name for r, _ in s] for s in shards] == [["l2", "l3"], ["l4", "l5"], ["l6", "l7"]]
    assert [[r.name for r, _ in s] for s in shard_members(members, done, 1)] == [["l2", "l3"], ["l4"], ["l5"],
                                                                                 ["l6"], ["l7"]]
    jobs = _shard_jobs("g", members, done, settings, tmp_path, 2)
    assert len(jobs) == 3 and not any(j.lead for j in jobs)
    for job, shard in zip(jobs, shards):
        assert set(job.own) == {"l0", "l1"}                                    # the winner and a finished layer
        work = [r.name for r, _ in job.members if r.name not in job.own]
        assert work == [r.name for r, _ in shard]
        assert job.settings.checkpoint != lead.settings.checkpoint            # searches of two shards: two files
    assert len({j.settings.checkpoint for j in jobs}) == 3
    # a finished layer with a shard layer's signature travels with that shard (shared outright, not verified
    # again), also when it is not among the TIMES_SEED_LAYERS latest finished layers every shard gets
    many = _refs([f"m{i}" for i in range(16)])
    msig = {f"m{i}": f"s{i}" for i in range(16)} | {"m13": "s1"}
    mem = [(ref, {"signature": msig[ref.name]}) for ref in many]
    mdone = {"m0": base_layer(many[0], status="searched", template="bsr_tc", kernel_ms=0.01)}
    mdone |= {f"m{i}": base_layer(many[i], status="reused", template="bsr_tc", kernel_ms=0.01) for i in range(1, 11)}
    by_shard = {tuple(r.name for r, _ in j.members if r.name not in j.own): set(j.own)
                for j in _shard_jobs("g", mem, mdone, settings, tmp_path, 2)}
    seeds = {"m0"} | {f"m{i}" for i in range(3, 11)}
    assert by_shard == {("m11", "m12"): seeds, ("m13", "m14"): seeds | {"m1"}, ("m15",): seeds}
    # a job carries only the previous batch's layers its own layers can use: by name or by signature
    prev = {"l2": base_layer(refs[2], status="searched", signature="zz"),
            "old9": base_layer(_refs(["old9"])[0], status="searched", signature="d"),
            "old8": base_layer(_refs(["old8"])[0], status="searched", signature="q")}
    assert set(jobs[0].args("m", prev)[5]) == {"l2"} and set(jobs[1].args("m", prev)[5]) == {"old9"}


def test_a_workers_dense_timings_are_merged_into_the_drivers_without_overwriting():
    """group_task hands back the dense timings its process knew; the driver keeps the first per shape,
    and its later jobs carry them (pickled with the settings), so a shape's dense is timed about once."""
    import pickle

    from sparseditto.batch.baselines import DenseTiming, ShapeBaselines

    driver = ShapeBaselines()
    key = ShapeBaselines.key((4096, 4096), "float16", 1, "cuda")
    driver.merge({key: DenseTiming(0.0138, 0.0162, "search of q")})
    driver.merge({key: DenseTiming(0.0200, 0.0210, "timed for k"), ((11008, 4096), "float16", 1, "cuda"):
                  DenseTiming(None, 0.027, "timed for gate")})
    assert driver.dense[key].source == "search of q" and len(driver.dense) == 2
    carried = pickle.loads(pickle.dumps(driver))
    assert carried.dense == driver.dense and carried.timed == 0


@pytest.mark.slow(seconds=10)
def test_an_interrupted_driver_stops_its_workers_instead_of_waiting_for_their_jobs(tmp_path, monkeypatch):
    """Ctrl-C (or batch_7b.py's SIGTERM made a KeyboardInterrupt) inside run_groups: the pool terminates
    its worker processes, so the report of what was journaled is written now, not after a running job."""
    import time

    import batch_models
    from sparseditto.batch import workers
    from sparseditto.batch.reuse import BatchSettings
    from sparseditto.targets import get_target

    monkeypatch.setattr(workers, "group_task", batch_models.sleepy_group_task)
    settings = BatchSettings(target=get_target("A100"), n_values=[16], dtype="float16", backend="interpret",
                             budget=1, tolerance=0.05, memory=False, checkpoint=str(tmp_path / "c.sqlite"))
    job = workers._Job("g", [], {}, settings, lead=True)
    running = tmp_path / "running"
    procs = []
    with pytest.raises(KeyboardInterrupt):
        with workers._LocalPool(str(running), {}, settings, 2) as pool:
            pool.submit(job)
            deadline = time.monotonic() + 60
            while not running.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert running.exists(), "the job never started"
            procs = list(pool._pool._processes.values())
            t0 = time.monotonic()
            raise KeyboardInterrupt
    assert time.monotonic() - t0 < 30, "the driver waited for the running job"
    assert procs
    for p in procs:
        # asked of the OS: Process.is_alive() stays True for a child that the executor's own manager
        # thread has reaped already (its waitpid then fails and is taken for "still running")
        deadline = time.monotonic() + 15
        while not _gone(p.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(p.pid), "a worker kept running its job after the interrupt"


def _gone(pid: int) -> bool:
    """The process has exited: no /proc entry any more, or a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except FileNotFoundError:
        return True


@pytest.mark.slow(seconds=30)
def test_a_groups_lead_starts_while_the_rest_of_the_model_is_analyzed(tmp_path, monkeypatch):
    """With workers, the analysis pass streams into the dispatch: here every weight after the first waits
    (in the driver's analysis thread) until the first layer's search has come back and been journaled. A
    batch that analyzed everything before sending out any job would wait forever; this one finishes, and
    the other layers start from that search's kernel."""
    import threading

    from batch_models import block_weight
    from sparseditto.batch import runner
    from sparseditto.batch.journal import Journal
    from sparseditto.batch.progress import Progress

    monkeypatch.setenv("SPARSEDITTO_CACHE_DIR", str(tmp_path / "cache"))
    sd = {f"layers.{i}.up.weight": block_weight(i) for i in range(3)}
    torch.save(sd, tmp_path / "model.pt")
    journaled = threading.Event()
    waits = []
    record = Journal.record

    def record_and_tell(self, layer):
        record(self, layer)
        if layer.status == "searched":
            journaled.set()

    analyze_one = runner._analyze_one

    def analyze_after_the_lead(ref, min_sparsity):
        if ref.name != "layers.0.up.weight":
            waits.append(journaled.wait(120))
        return analyze_one(ref, min_sparsity)

    planned = []
    plan = Progress.plan

    def plan_and_tell(self, groups, done):
        planned.append({ref.name for members in groups.values() for ref, _ in members})
        plan(self, groups, done)

    monkeypatch.setattr(Journal, "record", record_and_tell)
    monkeypatch.setattr(runner, "_analyze_one", analyze_after_the_lead)
    monkeypatch.setattr(Progress, "plan", plan_and_tell)
    report = run_batch(tmp_path / "model.pt", out=tmp_path / "out", workers=2, **RUN)
    assert waits and all(waits), "a later analysis waited for a lead that never went out"
    assert planned == [set(sd)], "the ETA learns every group once the analysis pass is over"
    statuses = {x.name: x.status for x in report.layers}
    assert report.complete and statuses == {"layers.0.up.weight": "searched", "layers.1.up.weight": "reused",
                                            "layers.2.up.weight": "reused"}, statuses
    lead = report.layers[0]           # the others went out in shards after it, from its kernel
    for x in report.layers[1:]:
        assert (x.template, x.source_hash) == (lead.template, lead.source_hash)
        assert x.reason.startswith(f"{lead.name}'s kernel, verified here") and x.verification["ok"]
    with sqlite3.connect(str(tmp_path / "out" / JOURNAL_NAME)) as conn:
        assert {r[0] for r in conn.execute("SELECT name FROM layers")} == set(sd)


def test_the_dispatch_sends_one_lead_per_group_and_full_shards_while_the_analysis_runs(tmp_path):
    """_Dispatch without workers: one lead out per group at a time (the next one when a lead came back
    without a winner); with a winner, shards of MAX_SHARD_LAYERS while the analysis pass runs (a partial
    one waits), everything left once it is over."""
    from sparseditto.batch.group import base_layer
    from sparseditto.batch.reuse import BatchSettings
    from sparseditto.batch.workers import MAX_SHARD_LAYERS, _Dispatch
    from sparseditto.targets import get_target

    settings = BatchSettings(target=get_target("A100"), n_values=[16], dtype="float16", backend="interpret",
                             budget=1, tolerance=0.05, memory=False, checkpoint=str(tmp_path / "c.sqlite"))
    refs = _refs([f"l{i}" for i in range(20)])
    groups = {"g": [(r, {"signature": r.name}) for r in refs[:3]]}
    done: dict = {}
    plan = _Dispatch(groups, done, settings, tmp_path, slots=2)
    lead = plan.jobs({"g"})
    assert [j.lead for j in lead] == [True] and [r.name for r, _ in lead[0].members] == ["l0"]
    assert plan.jobs({"g"}) == []                                  # one lead at a time
    done["l0"] = base_layer(refs[0], status="failed", reason="x")  # the lead failed: the next layer leads
    plan.returned(lead[0])
    again = plan.jobs({"g"})
    assert [r.name for r, _ in again[0].members if r.name not in again[0].own] == ["l1"]
    done["l1"] = base_layer(refs[1], status="searched", template="bsr_tc", kernel_ms=0.01)
    plan.returned(again[0])
    groups["g"] += [(r, {"signature": r.name}) for r in refs[3:12]]   # analyzed since: l2..l11
    first = plan.jobs({"g"})
    assert len(first) == 1 and not first[0].lead                   # one full shard; the other two layers wait
    assert len([r for r, _ in first[0].members if r.name not in first[0].own]) == MAX_SHARD_LAYERS
    assert plan.jobs({"g"}) == []
    groups["g"] += [(r, {"signature": r.name}) for r in refs[12:]]
    plan.finish()                                                  # the analysis pass is over
    rest = plan.jobs({"g"})
    sent = sorted(r.name for j in [*first, *rest] for r, _ in j.members if r.name not in j.own)
    assert sent == sorted(f"l{i}" for i in range(2, 20)) and plan.jobs({"g"}) == []
    assert all(len([r for r, _ in j.members if r.name not in j.own]) <= plan.shard_size for j in rest)
