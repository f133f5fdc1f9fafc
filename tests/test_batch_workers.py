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
