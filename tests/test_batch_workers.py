"""The groups of a batch in worker processes (local, spawned) and as Ray tasks (local cluster).

Each worker runs its group's search in its own process; only the driver writes the journal, so
the outcome must be the same batch as in one process: every layer searched once, all journaled.
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


def test_local_worker_processes(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSEDITTO_CACHE_DIR", str(tmp_path / "cache"))
    path, sd = _model(tmp_path)
    report = run_batch(path, out=tmp_path / "out", workers=2, **RUN)
    _check(report, tmp_path / "out", sd, os.getpid())


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
