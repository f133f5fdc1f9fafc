"""CI: `sparseditto bench --suite llm --quick` on the CPU (Triton interpreter), end to end.

Real processes and real kernels: the console script runs run_graph on every quick case, times the
chosen kernel, dense and the vendor paths in the sandboxed worker, and writes the files. The run is
cut by ``--budget-s`` after its first case(s) and finished by ``--resume``, so resuming and the budget
are exercised by the same two invocations. The checks recompute fast_p and the geomeans from the
rows, independently of `sparseditto.benchmark.metrics`, and compare them with what the summary says.
"""
from __future__ import annotations

import base64
import json
import math
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from sparseditto.benchmark import plan

REQUIRED = ("case_id", "suite", "case", "matrix", "shape", "nnz", "pattern", "detected_pattern", "sparsity", "dtype",
            "n", "chosen", "timings", "speedup_vs_dense", "best_alternative", "correct", "correctness", "format_bytes",
            "copy_bandwidth_gbs", "pct_roofline", "prepare_ms", "run_graph_s", "case_seconds", "environment",
            "run_id", "settings")


def sparseditto(args, env, check=True):
    script = Path(sys.executable).with_name("sparseditto")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "sparseditto.cli"]
    proc = subprocess.run(cmd + args, env=env, capture_output=True, text=True, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def fast_p_by_hand(rows, key, p, vendor_only):
    vendors = ("cusparse_csr_torch", "cusparse_csr_cupy", "cusparselt_2to4", "triton_bsr_torch")
    pool = [r for r in rows if not vendor_only or not r["timings"]
            or any(t["ok"] for t in r["timings"] if t["name"] in vendors)]
    hits = [r for r in pool if r["correct"] and (p == 0 or (r[key] is not None and r[key]["value"] >= p))]
    return len(hits) / len(pool) if pool else 0.0


def geomean_by_hand(values):
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


@pytest.mark.slow(seconds=120)
def test_quick_llm_suite_on_the_cpu_budget_then_resume(tmp_path):
    env = dict(os.environ, SPARSEDITTO_CACHE_DIR=str(tmp_path / "cache"), TRITON_INTERPRET="1")

    # a budget that covers the setup (~4 s here) and about one case (~7 s): the run stops before a case
    # that would not fit. On a machine loaded by other work the setup alone can pass 12 s, and then,
    # rightly, no case starts: that attempt is set aside and the next one has a budget twice as long.
    for attempt, budget in enumerate((12, 24, 48)):
        out = tmp_path / f"bench{attempt}"
        args = ["bench", "--suite", "llm", "--quick", "--out", str(out), "--quiet"]
        first = sparseditto(args + ["--budget-s", str(budget), "--memory-check", "1"], env)
        summary = json.loads((out / "summary.json").read_text())
        if (out / "results.jsonl").exists():
            break
        assert "budget" in summary["stopped"] and summary["remaining"] == 4, summary
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert 1 <= len(rows) < 4, "the budget stops before a case estimated not to fit"
    assert "budget" in summary["stopped"] and summary["remaining"] == 4 - len(rows)
    assert "Incomplete" in (out / "summary.md").read_text() and "--resume" in first.stderr

    refused = sparseditto(args, env, check=False)
    assert refused.returncode == 2 and "already exists" in refused.stderr

    second = sparseditto(args + ["--resume", "--memory-check", "0"], env)
    assert "llm: 4 cases" in second.stdout and "NOT GPU timings" in second.stdout
    lines = (out / "results.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    expected = {c.case_id for c in plan(["llm"], preset="quick")}
    assert [r["case_id"] for r in rows][:1] == [json.loads(lines[0])["case_id"]]
    assert {r["case_id"] for r in rows} == expected and len(rows) == 4, "each case exactly once"

    for r in rows:
        missing = [k for k in REQUIRED if r.get(k) is None]
        assert not missing, (r["case"], missing)
        assert r["status"] == "ok" and r["correct"], (r["case"], r["correctness"])
        assert r["timings_are_gpu"] is False and r["environment"]["backend"] == "interpret"
        names = [t["name"] for t in r["timings"]]
        assert names[:2] == ["chosen", "cublas_dense"] and "cusparselt_2to4" in names
        chosen, dense = r["timings"][0], r["timings"][1]
        assert chosen["eager_us"] > 0 and chosen["graph_us"] is None and chosen["rechecked"] is True
        assert dense["rechecked"] is True, dense["recheck_message"]
        assert r["speedup_vs_dense"]["value"] == pytest.approx(dense["eager_us"] / chosen["eager_us"])
        assert r["pct_roofline"] == pytest.approx(
            100 * r["format_bytes"] / (r["copy_bandwidth_gbs"] * 1e9) * 1e6 / chosen["eager_us"])
    chosen = {r["chosen"]["template"] for r in rows}
    assert "dense" in chosen and len(chosen - {"dense"}) >= 2, chosen
    fp32 = next(r for r in rows if r["dtype"] == "float32")
    assert fp32["best_vendor"]["versus"] == "cusparse_csr_torch"  # torch CPU CSR runs in float32
    repeats = [r["memory_repeat"] for r in rows if r["memory_repeat"]]
    assert len(repeats) == 1 and repeats[0]["exact_hit"], repeats  # the first case of the first run
    assert len({r["run_id"] for r in rows}) == 2
    assert len(json.loads((out / "environment.json").read_text())["runs"]) == 2

    # the summary's numbers, recomputed from the rows
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped"] is None and summary["remaining"] == 0
    (llm,) = summary["suites"]
    assert (llm["suite"], llm["cases"], llm["correct"], llm["errors"]) == ("llm", 4, 4, 0)
    for p in ("0", "1", "1.5", "2"):
        assert llm["fast_p_alternative"]["shares"][p] == pytest.approx(
            fast_p_by_hand(rows, "best_alternative", float(p), vendor_only=False))
        assert llm["fast_p_vendor"]["shares"][p] == pytest.approx(
            fast_p_by_hand(rows, "best_vendor", float(p), vendor_only=True))
    assert llm["fast_p_vendor"]["cases"] == 1
    assert llm["geomean_vs_dense"] == pytest.approx(geomean_by_hand(r["speedup_vs_dense"]["value"] for r in rows))
    assert llm["geomean_vs_best_alternative"] == pytest.approx(
        geomean_by_hand(r["best_alternative"]["value"] for r in rows))
    assert llm["pct_roofline_median"] == pytest.approx(statistics.median(r["pct_roofline"] for r in rows))
    assert llm["run_graph_s_median"] == pytest.approx(statistics.median(r["run_graph_s"] for r in rows))

    md = (out / "summary.md").read_text()
    assert "Not GPU timings" in md and "Incomplete" not in md
    line = next(x for x in md.splitlines() if x.startswith("| llm |"))
    assert f"{llm['fast_p_alternative']['shares']['1']:.0%}" in line and f"{llm['geomean_vs_dense']:.2f}" in line
    page = (out / "report.html").read_text()
    assert "Not GPU timings" in page and all(r["case"] in page for r in rows)
    images = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page)
    assert len(images) >= 4, "speedup vs sparsity, roofline, suite bars, fast_p"
    assert all(base64.b64decode(img)[:8] == b"\x89PNG\r\n\x1a\n" for img in images)

    again = sparseditto(["bench", "--report-only", "--out", str(out)], env)
    assert "llm: 4 cases" in again.stdout
    # the rewrite keeps the command of the run that made the rows, and its incomplete note
    assert json.loads((out / "summary.json").read_text())["command"] == summary["command"]
    assert "--report-only" not in (out / "summary.md").read_text()
    summary["stopped"], summary["remaining"] = "budget of 1 s", 3
    (out / "summary.json").write_text(json.dumps(summary))
    sparseditto(["bench", "--report-only", "--out", str(out)], env)
    assert "**Incomplete:** budget of 1 s; 3 case(s) left" in (out / "summary.md").read_text()


@pytest.mark.gpu
def test_bench_on_a_gpu_times_everything_with_graphs_and_a_roofline(tmp_path, monkeypatch):
    """On the H200: one pruned weight file, CUDA backend, every path replayed from CUDA graphs."""
    from sparseditto import generate
    from sparseditto.benchmark import bench
    from sparseditto.io import save_matrix

    monkeypatch.setenv("SPARSEDITTO_CACHE_DIR", str(tmp_path / "cache"))
    path = save_matrix(generate.magnitude_pruned(2048, 2048, 0.9, seed=1, dtype="float16"), tmp_path / "w.mtx")
    result = bench([str(path)], n=[16], dtype=["float16"], out=tmp_path / "out", memory_check=1, candidates=3,
                   progress=False)
    (row,) = [json.loads(x) for x in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert row["timings_are_gpu"] and row["environment"]["gpu"] and row["environment"]["sm_count"] > 0
    assert row["copy_bandwidth_gbs"] > 500, "1 GiB device copies run at TB/s on a data-center GPU"
    assert row["correct"], row["correctness"]
    by_name = {t["name"]: t for t in row["timings"]}
    assert by_name["chosen"]["graph_us"] and by_name["cublas_dense"]["graph_us"]
    assert by_name["cusparse_csr_torch"]["ok"] and by_name["cusparse_csr_torch"]["rechecked"] is True
    assert row["speedup_vs_dense"]["basis"] == "graph" and row["best_vendor"] is not None
    assert 0 < row["pct_roofline"] <= 150, row["pct_roofline"]
    assert row["memory_repeat"]["exact_hit"] and row["run_graph_memory_s"] > 0
    assert result.summaries[0].timings_are_gpu and "Not GPU timings" not in (tmp_path / "out" / "summary.md").read_text()
