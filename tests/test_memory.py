"""The SQLite trajectory memory, on real SQLite files in tmp_path."""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
import time

import pytest
import sqlite_utils

import sparseditto
from sparseditto.memory import Memory, default_memory_path, environment_fingerprint, n_bucket

VERSIONS = {"torch": "test", "triton": "test"}


def _run(mem: Memory, signature="sig-a", *, features=None, status="ok", template="csr_rowsplit",
         cand_status="verified", median_ms=1.0, dtype="float16", gpu="NVIDIA H200", n_values=(16,),
         pattern="unstructured", source=None, speedup=1.5):
    """Record one finished run with one candidate; returns (run_id, candidate_id)."""
    run_id = mem.start_run(signature=signature, matrix_name=f"m-{signature}", shape=(64, 32), nnz=100,
                           pattern=pattern, n_values=n_values, dtype=dtype, gpu=gpu, target="H200",
                           backend="cuda", policy="expert", versions=VERSIONS,
                           features=features if features is not None else {"density": 0.1},
                           report={"pattern": pattern})
    cand = mem.record_candidate(run_id, template=template, status=cand_status, params={"BLOCK_N": 32},
                                source=source or f"# kernel {template} {signature} {median_ms}\n",
                                timings={"median_ms": median_ms}, origin="template", backend="triton")
    mem.finish_run(run_id, status, cand if cand_status == "verified" else None,
                   best_speedup_vs_dense=speedup, wall_seconds=1.0)
    return run_id, cand


@pytest.fixture
def mem(tmp_path):
    m = Memory(tmp_path / "memory.sqlite")
    yield m
    m.close()


def test_wal_mode_and_default_path(tmp_path, monkeypatch, mem):
    assert mem.journal_mode == "wal"
    assert (tmp_path / "memory.sqlite").exists()
    monkeypatch.delenv("SPARSEDITTO_MEMORY", raising=False)
    monkeypatch.delenv("SPARSEDITTO_CACHE_DIR", raising=False)   # it would win over XDG_CACHE_HOME
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_memory_path() == tmp_path / "cache" / "sparseditto" / "memory.sqlite"
    monkeypatch.setenv("SPARSEDITTO_MEMORY", str(tmp_path / "env.sqlite"))
    default = Memory()
    assert default.path == tmp_path / "env.sqlite" and (tmp_path / "env.sqlite").exists()
    default.close()
    with pytest.raises(ValueError, match="is a directory"):
        Memory(tmp_path)


def test_unusable_files_are_clear_errors(tmp_path):
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database at all, just text" * 100)
    with pytest.raises(ValueError, match="is not a usable SQLite database"):
        Memory(junk)
    newer = tmp_path / "newer.sqlite"
    conn = sqlite3.connect(newer)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(ValueError, match="schema version 99, newer than"):
        Memory(newer)


def test_n_bucket():
    assert [n_bucket(n) for n in (1, 2, 16, 17, 128, 129, 1024, 1025)] == [
        "1", "<=16", "<=16", "<=128", "<=128", "<=1024", "<=1024", ">1024"]
    assert n_bucket([16, 1, 8]) == "1|<=16"
    with pytest.raises(ValueError, match="N >= 1"):
        n_bucket(0)
    with pytest.raises(ValueError, match="integer N"):
        n_bucket(2.5)


def test_start_record_finish_roundtrip(mem):
    run_id = mem.start_run(signature="sig", matrix_name="layer0", shape=(8, 4), nnz=7, pattern="2:4",
                           n_values=[1, 16], dtype="bfloat16", gpu="cpu", target="A100", backend="interpret",
                           policy="llm", llm_model="qwen", llm_settings={"temperature": 0},
                           versions=VERSIONS, features=[0.5, 0.25], report={"rows": 8})
    assert len(run_id) == 32
    src = "def prepare(A, dtype, device):\n    return {}\n"
    c1 = mem.record_candidate(run_id, step=0, template="nm_compressed", params={"BG": 16}, source=src,
                              status="failed", failure_class="compile_error", message="bad", origin="llm")
    c2 = mem.record_candidate(run_id, step=1, template="nm_compressed", params={"BG": 32}, source=src,
                              status="verified", timings={"median_ms": 0.2})
    mem.update_candidate(c2, status="profiled", metrics={"dram_pct": 80.0})
    assert mem.record_step(run_id, "planner", "decision", {"action": "try"}) == 0
    assert mem.record_step(run_id, "coder", "code", {"source": src}) == 1
    mem.finish_run(run_id, "ok", c2, best_speedup_vs_dense=1.7, wall_seconds=3.5,
                   token_usage={"total_tokens": 12})

    run = mem.get_run(run_id)
    assert run["status"] == "ok" and run["finished"] is not None
    assert run["n_values"] == [1, 16] and run["n_bucket"] == "1|<=16"
    assert run["features"] == {"f0": 0.5, "f1": 0.25}
    assert run["best_template"] == "nm_compressed" and run["best_speedup_vs_dense"] == 1.7
    assert run["token_usage"] == {"total_tokens": 12} and run["llm_settings"] == {"temperature": 0}
    assert [c["id"] for c in run["candidates"]] == [c1, c2]
    assert run["candidates"][1]["status"] == "profiled" and run["candidates"][1]["metrics"] == {"dram_pct": 80.0}
    assert run["candidates"][0]["source"] == src
    assert [s["kind"] for s in run["steps"]] == ["decision", "code"]
    # one stored kernel for two candidates with the same source
    assert mem.db["kernels"].count == 1
    # an 8-character prefix (what `memory list` shows) resolves
    assert mem.get_run(run_id[:8])["id"] == run_id


def test_bad_inputs_are_clear_errors(mem):
    with pytest.raises(ValueError, match=r"Unknown run id 'nope'.*sparseditto memory list"):
        mem.get_run("nope")
    with pytest.raises(ValueError, match="Unknown run id"):
        mem.record_step("nope", "planner", "decision", {})
    run_id = mem.start_run(signature="s", versions=VERSIONS)
    with pytest.raises(ValueError, match="Unknown step kind 'thought'"):
        mem.record_step(run_id, "planner", "thought", {})
    with pytest.raises(ValueError, match=r"Unknown candidate field\(s\) \['colour'\]"):
        mem.record_candidate(run_id, template="t", status="verified", colour="red")
    with pytest.raises(ValueError, match="needs a non-empty 'status'"):
        mem.record_candidate(run_id, template="t")
    with pytest.raises(ValueError, match="Unknown final run status 'done'"):
        mem.finish_run(run_id, "done")
    with pytest.raises(ValueError, match="is not a candidate of run"):
        mem.finish_run(run_id, "ok", "0" * 32)
    with pytest.raises(ValueError, match="Feature 'x' must be finite"):
        mem.start_run(signature="s", versions=VERSIONS, features={"x": float("nan")})


def test_exact_hit_only_verified_and_matching_key(mem):
    assert mem.exact_hit("sig-a", "<=16", "float16", "NVIDIA H200") is None
    _run(mem, "sig-a", median_ms=2.0, template="old_best")
    newer, newer_cand = _run(mem, "sig-a", median_ms=1.0, template="csr_rowsplit", source="# newest\n")
    # later runs that must not win: failed run, a run whose candidate failed, other keys
    _run(mem, "sig-a", status="failed", template="from_failed_run")
    hit = mem.exact_hit("sig-a", "<=16", "float16", "NVIDIA H200")
    assert hit["run_id"] == newer and hit["candidate_id"] == newer_cand
    assert hit["template"] == "csr_rowsplit" and hit["source"] == "# newest\n"
    assert hit["params"] == {"BLOCK_N": 32} and hit["timings"] == {"median_ms": 1.0}
    assert (hit["gpu"], hit["dtype"], hit["n_bucket"], hit["n_values"]) == ("NVIDIA H200", "float16", "<=16", [16])
    assert mem.exact_hit("sig-a", "<=128", "float16", "NVIDIA H200") is None
    assert mem.exact_hit("sig-a", "<=16", "bfloat16", "NVIDIA H200") is None
    assert mem.exact_hit("sig-a", "<=16", "float16", "NVIDIA A100") is None
    assert mem.exact_hit("sig-b", "<=16", "float16", "NVIDIA H200") is None
    # the most recent successful run verified nothing -> no hit (never an unverified kernel)
    _run(mem, "sig-a", cand_status="failed", template="broken")
    assert mem.exact_hit("sig-a", "<=16", "float16", "NVIDIA H200") is None


def test_exact_hit_falls_back_to_fastest_verified_when_dense_won(mem):
    run_id = mem.start_run(signature="s", n_values=[16], dtype="float16", gpu="g", versions=VERSIONS)
    mem.record_candidate(run_id, template="slow", status="verified", source="# slow\n", timings={"median_ms": 3.0})
    mem.record_candidate(run_id, template="fast", status="benchmarked", source="# fast\n", timings={"median_ms": 2.0})
    mem.record_candidate(run_id, template="wrong", status="failed", source="# wrong\n", timings={"median_ms": 0.1})
    mem.finish_run(run_id, "ok", best_template="dense", best_speedup_vs_dense=1.0)
    hit = mem.exact_hit("s", "<=16", "float16", "g")
    assert hit["template"] == "fast" and hit["run_best_template"] == "dense"


def test_neighbours_ordering_and_filters(mem):
    far, _ = _run(mem, "far", features={"density": 0.9, "imbalance": 0.9})
    near, _ = _run(mem, "near", features={"density": 0.11, "imbalance": 0.2}, template="bsr")
    mid, _ = _run(mem, "mid", features={"density": 0.3, "imbalance": 0.2}, pattern="block")
    _run(mem, "failed", features={"density": 0.1, "imbalance": 0.2}, status="failed")
    mem.start_run(signature="running", features={"density": 0.1, "imbalance": 0.2}, versions=VERSIONS)

    got = mem.neighbours({"density": 0.1, "imbalance": 0.2}, k=5)
    assert [g["run_id"] for g in got] == [near, mid, far]
    assert got[0]["distance"] == pytest.approx(0.01)
    assert got[0]["best_template"] == "bsr" and got[0]["best_params"] == {"BLOCK_N": 32}
    assert got[0]["best_speedup_vs_dense"] == 1.5
    assert [g["run_id"] for g in mem.neighbours({"density": 0.1, "imbalance": 0.2}, k=1)] == [near]
    assert [g["run_id"] for g in mem.neighbours({"density": 0.1}, pattern="block")] == [mid]
    assert mem.neighbours({"density": 0.1}, dtype="float32") == []
    with pytest.raises(ValueError, match="non-empty feature vector"):
        mem.neighbours({})


def test_neighbours_keep_to_the_n_range_when_asked(mem):
    """A neighbour measured at another N range is no prior for this one (SpMV at N = 1 and SpMM at
    N = 16 favour different kernels): n_bucket restricts the search to runs of the same range."""
    spmv, _ = _run(mem, "spmv", features={"density": 0.5}, template="delta_spmv", n_values=(1,))
    spmm, _ = _run(mem, "spmm", features={"density": 0.49}, template="tc_words", n_values=(16,))
    assert [g["run_id"] for g in mem.neighbours({"density": 0.49})] == [spmm, spmv]
    got = mem.neighbours({"density": 0.49}, n_bucket="1")
    assert [(g["run_id"], g["best_template"], g["n_bucket"]) for g in got] == [(spmv, "delta_spmv", "1")]
    assert [g["run_id"] for g in mem.neighbours({"density": 0.49}, n_bucket="<=16")] == [spmm]
    assert mem.neighbours({"density": 0.49}, n_bucket="<=128") == []


def test_multi_row_write_is_transactional(mem, monkeypatch):
    """A failure between the kernel row and the candidate row leaves neither behind."""
    run_id = mem.start_run(signature="s", versions=VERSIONS)
    real_insert = sqlite_utils.db.Table.insert

    def failing_insert(self, record, *args, **kwargs):
        if self.name == "candidates":
            raise RuntimeError("disk on fire")
        return real_insert(self, record, *args, **kwargs)

    monkeypatch.setattr(sqlite_utils.db.Table, "insert", failing_insert)
    with pytest.raises(RuntimeError, match="disk on fire"):
        mem.record_candidate(run_id, template="t", status="verified", source="# never stored\n")
    monkeypatch.setattr(sqlite_utils.db.Table, "insert", real_insert)
    assert mem.db["kernels"].count == 0 and mem.db["candidates"].count == 0
    # the memory still works after the rolled-back write
    mem.record_candidate(run_id, template="t", status="verified", source="# stored\n")
    assert mem.db["kernels"].count == 1 and mem.db["candidates"].count == 1


def test_crash_mid_write_keeps_committed_rows(tmp_path):
    path = tmp_path / "crash.sqlite"
    with Memory(path) as mem:
        committed = mem.start_run(signature="committed", versions=VERSIONS)
    child = (
        "import os, sys\n"
        "from sparseditto.memory import Memory\n"
        "mem = Memory(sys.argv[1])\n"
        "mem.db.conn.execute('BEGIN')\n"
        "mem.db['lessons'].insert({'pattern': 'x', 'text': 'half-written'})\n"
        "os._exit(1)\n")
    proc = subprocess.run([sys.executable, "-c", child, str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    with Memory(path) as mem:
        assert mem.get_run(committed)["signature"] == "committed"
        assert mem.lessons() == []


def test_reader_sees_only_committed_data_while_writer_writes(tmp_path):
    path = tmp_path / "concurrent.sqlite"
    writer = Memory(path)
    first = writer.start_run(signature="first", versions=VERSIONS)
    reader = Memory(path)
    with writer.db.atomic():
        writer.db["runs"].insert({"id": "f" * 32, "created": "2099", "signature": "uncommitted", "status": "running"})
        t0 = time.perf_counter()
        seen = [r["id"] for r in reader.list_runs()]
        assert time.perf_counter() - t0 < 2.0  # WAL: the reader did not wait for the writer
        assert seen == [first]
    assert len(reader.list_runs()) == 2

    # a reader thread polling while the writer records steps never errors and sees a growing run
    errors: list[BaseException] = []
    counts: list[int] = []
    done = threading.Event()

    def poll():
        try:
            while not done.is_set():
                counts.append(len(reader.get_run(first)["steps"]))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=poll)
    thread.start()
    for i in range(40):
        writer.record_step(first, "profiler", "feedback", {"i": i})
    done.set()
    thread.join(timeout=10)
    assert not errors
    assert counts == sorted(counts) and max(counts) <= 40
    assert [s["payload"]["i"] for s in reader.get_run(first)["steps"]] == list(range(40))
    reader.close()
    writer.close()


def test_memory_is_usable_from_another_thread(mem):
    """LangGraph runs nodes in worker threads; the memory must accept calls from them."""
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(id=mem.start_run(signature="t", versions=VERSIONS)))
    thread.start()
    thread.join()
    assert mem.get_run(result["id"])["signature"] == "t"


def test_export_jsonl_with_ordered_steps(mem, tmp_path, capsys):
    run_a, cand = _run(mem, "a")
    for i, kind in enumerate(["decision", "prompt", "code", "feedback", "outcome"]):
        mem.record_step(run_a, f"node{i}", kind, {"i": i})
    _run(mem, "b")
    out = tmp_path / "export" / "trajectories.jsonl"
    assert mem.export(out) == 2
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["signature"] for r in records] == ["a", "b"]
    first = records[0]
    assert [s["kind"] for s in first["steps"]] == ["decision", "prompt", "code", "feedback", "outcome"]
    assert [s["idx"] for s in first["steps"]] == [0, 1, 2, 3, 4]
    assert first["versions"] == VERSIONS and first["report"] == {"pattern": "unstructured"}
    assert first["candidates"][0]["id"] == cand and first["candidates"][0]["source"].startswith("# kernel")

    assert mem.export(None, fmt="json") == 2
    assert [r["signature"] for r in json.loads(capsys.readouterr().out)] == ["a", "b"]
    with pytest.raises(ValueError, match="Unknown export format 'csv'"):
        mem.export(tmp_path / "x.csv", fmt="csv")


def test_memory_list_table_and_lessons(mem, tmp_path, capsys):
    """`sparseditto memory list` renders the runs with rich, names whole, the speedup as the run's
    summary printed it: measured, or the roofline estimate marked as one."""
    from sparseditto.cli import main

    assert main(["memory", "list", "--memory", str(mem.path)]) == 0
    assert "No runs recorded yet" in capsys.readouterr().out
    run_id, _ = _run(mem, "a", template="bsr_dot")
    long_name = "model.layers.17.mlp.down_proj.weight_block_pruned_95pct"
    estimated = mem.start_run(signature="e", matrix_name=long_name, shape=(64, 64), nnz=100, backend="interpret",
                              gpu="interpret:A100-80GB", target="A100-80GB")
    mem.finish_run(estimated, "ok", best_template="bsr_tc", best_speedup_estimate=2.4)
    assert main(["memory", "list", "--memory", str(mem.path), "--limit", "10"]) == 0
    out = capsys.readouterr().out
    assert long_name in out                            # no ellipsis in a pipe, however long the name
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.startswith("│")}
    assert "bsr_dot" in rows[run_id[:8]] and "1.50x" in rows[run_id[:8]] and "ok" in rows[run_id[:8]]
    assert "~2.40x est." in rows[estimated[:8]] and "CPU (interpreter)" in rows[estimated[:8]]
    assert "A100-80GB" in rows[estimated[:8]]

    mem.add_lesson("2:4", "expand with precomputed masks", signature="s1")
    mem.add_lesson("block", "more stages on Hopper")
    assert [lesson["text"] for lesson in mem.lessons("2:4")] == ["expand with precomputed masks"]
    assert len(mem.lessons()) == 2
    with pytest.raises(ValueError, match="non-empty text"):
        mem.add_lesson("x", "  ")


def test_past_kernels_by_signature_or_pattern(mem):
    _run(mem, "s1", pattern="block", source="# block kernel\n", template="bsr_dot")
    _run(mem, "s2", pattern="unstructured", source="# csr kernel\n")
    assert [k["source"] for k in mem.past_kernels("block")] == ["# block kernel\n"]
    assert [k["template"] for k in mem.past_kernels("s2")] == ["csr_rowsplit"]
    assert mem.past_kernels("nothing") == []


def test_environment_fingerprint_on_this_machine():
    info = environment_fingerprint()
    assert info["python"] == sys.version.split()[0]
    assert info["torch"] and info["triton"]
    assert info["sparseditto"] == sparseditto.__version__
    assert isinstance(info["templates"], dict)
    json.dumps(info)  # recorded as JSON


def test_cli_memory_commands(tmp_path, capsys):
    from sparseditto.cli import main

    path = tmp_path / "cli.sqlite"
    with Memory(path) as mem:
        run_id, _ = _run(mem, "cli")
    assert main(["memory", "list", "--memory", str(path)]) == 0
    assert run_id[:8] in capsys.readouterr().out
    assert main(["memory", "show", run_id[:8], "--memory", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == run_id
    assert main(["memory", "show", "deadbeef", "--memory", str(path)]) == 2
    assert "sparseditto memory list" in capsys.readouterr().err
    out = tmp_path / "dump.jsonl"
    assert main(["memory", "export", "--memory", str(path), "--out", str(out)]) == 0
    assert json.loads(out.read_text().splitlines()[0])["id"] == run_id


def test_analyzer_starts_from_neighbours_of_the_same_n_range_only(mem):
    """The analyzer's memory lookup (exact hit, else neighbours) keeps to the run's N range: a similar
    weight's winner at N = 16 is a prior at N = 16, not at N = 1 (where the H200 measured delta_spmv
    1.2-1.7x ahead of what won at N = 16)."""
    from sparseditto import generate
    from sparseditto.agents.analyzer import lookup_memory
    from sparseditto.agents.state import Context
    from sparseditto.analysis import analyze

    report = analyze(generate.unstructured(64, 128, 0.5, seed=0))
    _run(mem, "a-similar-weight", features=report.feature_vector(), pattern=report.pattern, template="tc_words",
         n_values=(16,))
    hits = lookup_memory(mem, report, Context(backend="interpret", n_values=[16]), None)
    assert [(h["kind"], h["template"]) for h in hits] == [("neighbour", "tc_words")]
    assert lookup_memory(mem, report, Context(backend="interpret", n_values=[12]), None)[0]["template"] == "tc_words"
    assert lookup_memory(mem, report, Context(backend="interpret", n_values=[1]), None) == []


def test_neighbours_run_at_about_this_n_come_first_within_the_bucket(mem):
    """Within an N range, a neighbour run within 2x of these N goes ahead of a nearer one run farther
    away (the graphs suite runs each matrix at N = 32 then 128, where the winners differ)."""
    from sparseditto import generate
    from sparseditto.agents.analyzer import lookup_memory
    from sparseditto.agents.state import Context
    from sparseditto.analysis import analyze

    report = analyze(generate.laplacian_2d(20, 20))
    features = report.feature_vector()
    farther = [features[0] + 0.01, *features[1:]]
    _run(mem, "same-weight-at-n32", features=features, pattern=report.pattern, template="csr_rowsplit",
         n_values=(32,))
    _run(mem, "similar-weight-at-n128", features=farther, pattern=report.pattern, template="csr_rowdecomp",
         n_values=(128,))
    at128 = lookup_memory(mem, report, Context(backend="interpret", n_values=[128]), None)
    assert [(h["template"], h["n_values"]) for h in at128] == [("csr_rowdecomp", [128]), ("csr_rowsplit", [32])]
    at32 = lookup_memory(mem, report, Context(backend="interpret", n_values=[32]), None)
    assert [h["template"] for h in at32] == ["csr_rowsplit", "csr_rowdecomp"]
    assert at32[0]["distance"] < at32[1]["distance"]
