"""A batch killed with kill -9 and restarted with resume=True redoes no finished layer.

The child process runs a real batch over a .pt state_dict of two weights in two groups (so each
gets its own run_graph search); the parent SIGKILLs it as soon as the journal holds the first
finished search, then resumes in-process, counting the searches it runs.
"""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from batch_models import small_unstructured
from sparseditto.batch.journal import JOURNAL_NAME
from sparseditto.batch.runner import run_batch

CHILD = textwrap.dedent('''
    import sys
    from sparseditto.batch.runner import run_batch
    run_batch(sys.argv[1], out=sys.argv[2], target="A100", n=[16], backend="interpret", budget=1, memory=False)
''')


def _searched(journal) -> dict[str, str]:
    if not journal.exists():
        return {}
    try:
        with sqlite3.connect(str(journal), timeout=5) as conn:
            return dict(conn.execute("SELECT name, record FROM layers WHERE status = 'searched'").fetchall())
    except sqlite3.Error:
        return {}


@pytest.mark.slow
def test_kill_minus_nine_then_resume_redoes_no_finished_layer(tmp_path, monkeypatch, pool):
    sd = {"a.weight": small_unstructured(64, 64, 1), "b.weight": small_unstructured(64, 96, 2)}
    torch.save(sd, tmp_path / "model.pt")
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["SPARSEDITTO_CACHE_DIR"] = str(tmp_path / "cache")
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "model.pt"), str(out)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    before: dict[str, str] = {}
    while time.time() < deadline and child.poll() is None:
        before = _searched(out / JOURNAL_NAME)
        if before:
            os.kill(child.pid, signal.SIGKILL)
            break
        time.sleep(0.1)
    child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr.read()[-3000:]
    before = _searched(out / JOURNAL_NAME)     # what the journal holds after the kill
    assert len(before) == 1                   # killed between the two searches

    import sparseditto.api

    real, searched = sparseditto.api.run_graph, []

    def counting(A, **kw):
        searched.append(A.name)
        return real(A, **kw)

    monkeypatch.setattr(sparseditto.api, "run_graph", counting)
    report = run_batch(tmp_path / "model.pt", out=out, target="A100", n=[16], backend="interpret", budget=1,
                       memory=False, resume=True)
    assert report.complete and {x.name for x in report.layers} == set(sd)
    assert sorted(searched) == sorted(set(sd) - set(before))        # finished layers were not searched again
    after = _searched(out / JOURNAL_NAME)
    assert all(after[name] == record for name, record in before.items())   # their records are untouched
    assert all(x.status == "searched" for x in report.layers)
