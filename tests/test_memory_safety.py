"""The memory loses nothing: many writer processes, crashed owners, tampered kernels, bad paths."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from sparseditto.memory import Memory, MemoryIntegrityError

WRITER = textwrap.dedent('''
    import sys, random
    from sparseditto.memory import Memory
    path, worker, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    mem = Memory(path)
    for r in range(runs):
        run = mem.start_run(signature=f"sig-{worker % 3}", matrix_name=f"w{worker}-r{r}", shape=(8, 8), nnz=10,
                            pattern="unstructured", n_values=[16], dtype="float16", gpu="cpu",
                            versions={"t": 1}, features={"density": random.random()})
        for step in range(12):
            mem.record_step(run, "planner", "decision", {"worker": worker, "run": r, "step": step})
            if step % 4 == 0:
                mem.neighbours({"density": 0.5}, k=3)
                mem.exact_hit(f"sig-{worker % 3}", "<=16", "float16", "cpu")
        cands = [mem.record_candidate(run, template="csr_rowsplit", status="verified",
                                      source=f"# kernel w{worker} r{r} c{c}\\n", timings={"median_ms": c + 1.0})
                 for c in range(3)]
        mem.update_candidate(cands[0], status="profiled", metrics={"x": 1.0})
        mem.finish_run(run, "ok", cands[0], best_speedup_vs_dense=1.5, wall_seconds=0.1)
    print("done", worker)
''')


@pytest.mark.slow
def test_eight_processes_times_five_runs_lose_nothing(tmp_path):
    path = tmp_path / "shared.sqlite"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(w), "5"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for w in range(8)]
    outputs = [p.communicate(timeout=300) for p in procs]
    failures = [(p.returncode, err[-1500:]) for p, (_, err) in zip(procs, outputs) if p.returncode != 0]
    assert not failures, failures
    with Memory(path) as mem:
        runs = mem.list_runs(limit=1000)
        assert len(runs) == 40 and all(r["status"] == "ok" for r in runs)
        assert {r["matrix_name"] for r in runs} == {f"w{w}-r{r}" for w in range(8) for r in range(5)}
        for run in runs:
            full = mem.get_run(run["id"])
            assert len(full["steps"]) == 12 and [s["idx"] for s in full["steps"]] == list(range(12))
            assert len(full["candidates"]) == 3 and full["best_candidate_id"]
        assert mem.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_a_run_whose_process_died_is_marked_crashed(tmp_path):
    path = tmp_path / "m.sqlite"
    code = ("import os, sys\nfrom sparseditto.memory import Memory\nm = Memory(sys.argv[1])\n"
            "print(m.start_run(signature='s', n_values=[1]))\nos._exit(9)\n")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    dead_run = done.stdout.strip()
    with Memory(path) as mem:
        alive_run = mem.start_run(signature="s", n_values=[1])
    with Memory(path) as mem:  # opening marks stale runs
        assert mem.get_run(dead_run)["status"] == "crashed" and mem.get_run(dead_run)["finished"]
        assert mem.get_run(alive_run)["status"] == "running"  # this process is alive
        mem.claim_run(dead_run)  # a resume takes it over
        assert mem.get_run(dead_run)["status"] == "running"
        assert mem.get_run(dead_run)["owner_pid"] == os.getpid()


def _tamper(path, run_id):
    conn = sqlite3.connect(path)
    conn.execute("UPDATE kernels SET source = source || '\nimport os; os.system(\"echo pwned\")\n'")
    conn.commit()
    conn.close()


def test_a_tampered_kernel_is_refused_on_load(tmp_path):
    path = tmp_path / "m.sqlite"
    with Memory(path) as mem:
        run = mem.start_run(signature="sig", n_values=[16], dtype="float16", gpu="g", pattern="p")
        cand = mem.record_candidate(run, template="csr_rowsplit", status="verified", source="# honest kernel\n")
        mem.finish_run(run, "ok", cand)
        assert mem.exact_hit("sig", "<=16", "float16", "g")["source"] == "# honest kernel\n"
    _tamper(path, run)
    with Memory(path) as mem:
        with pytest.raises(MemoryIntegrityError, match="does not match its content hash"):
            mem.exact_hit("sig", "<=16", "float16", "g")
        with pytest.warns(UserWarning, match="tampered"):
            assert mem.past_kernels("sig") == []
    with Memory(path) as mem, pytest.raises(ValueError, match="not the content hash"):
        mem.record_candidate(run, template="t", status="verified", source="a", source_hash="0" * 32)


def test_a_tampered_memory_hit_never_runs_through_run_graph(tmp_path, monkeypatch):
    from sparseditto import generate, harness
    from sparseditto.api import run_graph

    monkeypatch.setenv("SPARSEDITTO_CACHE_DIR", str(tmp_path / "cache"))
    A = generate.row_pruned(64, 512, 0.9, dtype="float16", seed=4)
    settings = dict(target="A100", n=1, backend="interpret", budget=1, memory=tmp_path / "m.sqlite")
    first = run_graph(A, checkpoint=tmp_path / "c1.sqlite", **settings)
    assert any(c.status == "verified" for c in first.candidates)
    _tamper(tmp_path / "m.sqlite", first.run_id)
    seen = []
    real = harness.run_and_verify
    monkeypatch.setattr(harness, "run_and_verify", lambda cand, m, **kw: seen.append(cand.source) or real(cand, m, **kw))
    again = run_graph(A, checkpoint=tmp_path / "c2.sqlite", **settings)
    assert not any("pwned" in s for s in seen), "the tampered kernel was executed"
    unavailable = [e for e in again.events if e.get("event") == "memory_unavailable"]
    assert unavailable and "content hash" in unavailable[0]["detail"]
    assert all(c.origin != "memory" for c in again.candidates)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes read-only files anyway")
def test_a_read_only_memory_file_is_a_clear_error(tmp_path):
    path = tmp_path / "ro.sqlite"
    Memory(path).close()
    path.chmod(0o444)
    with pytest.raises(ValueError, match="read-only"):
        Memory(path)


def test_memory_and_checkpoint_paths_are_checked_up_front(tmp_path):
    from sparseditto.memory import check_writable_file

    with pytest.raises(ValueError, match="is a directory"):
        Memory(tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="not a writable directory"):
        Memory(blocker / "sub" / "m.sqlite")
    with pytest.raises(ValueError, match="Checkpoint path .* is a directory"):
        check_writable_file(tmp_path, "Checkpoint")


GRAPH_WRITER = textwrap.dedent('''
    import sys
    from sparseditto import generate
    from sparseditto.api import run_graph
    memory, tmp, worker = sys.argv[1], sys.argv[2], int(sys.argv[3])
    for r in range(2):
        A = generate.row_pruned(32, 64, 0.5, dtype="float16", seed=100 * worker + r)
        run_graph(A, target="A100", n=1, backend="interpret", budget=1, memory=memory,
                  checkpoint=f"{tmp}/ckpt-{worker}.sqlite")
    print("done", worker)
''')


@pytest.mark.slow(seconds=30)
def test_concurrent_run_graph_processes_share_one_memory_file(tmp_path):
    """The issue's failure mode (runs lost to 'database is locked' with several users of the
    default memory): 3 processes x 2 full graph runs on one file, every run recorded and finished."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["SPARSEDITTO_CACHE_DIR"] = str(tmp_path / "cache")
    memory = tmp_path / "shared.sqlite"
    procs = [subprocess.Popen([sys.executable, "-c", GRAPH_WRITER, str(memory), str(tmp_path), str(w)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for w in range(3)]
    outputs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outputs]
    with Memory(memory) as mem:
        runs = mem.list_runs(limit=100)
        assert len(runs) == 6 and all(r["status"] == "ok" for r in runs), [(r["matrix_name"], r["status"]) for r in runs]
        assert all(mem.get_run(r["id"])["steps"] for r in runs)
        assert mem.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
