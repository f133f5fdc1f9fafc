"""The command line as a user drives it: real `sparseditto` processes, their output and exit codes.

Help and version, `python -m sparseditto`, `analyze` (readable, --json, -o), `run` on a small
matrix in the Triton interpreter, `memory list` agreeing with that run's summary, `targets` with
whole names in a pipe, a closed pipe (exit 141, no traceback) and Ctrl-C in the middle of a
verification (exit 130 within seconds, the resume hint, and the same command resuming the run).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import pytest
import scipy.io

from sparseditto import generate

SCRIPT = Path(sys.executable).with_name("sparseditto")


def cli(*args: str, env: dict, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "sparseditto"]
    proc = subprocess.run(cmd + list(args), env=env, capture_output=True, text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    return proc


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict:
    home = tmp_path_factory.mktemp("cli")
    out = dict(os.environ, SPARSEDITTO_CACHE_DIR=str(home / "cache"), SPARSEDITTO_MEMORY=str(home / "memory.sqlite"),
               TRITON_INTERPRET="1", COLUMNS="80")
    out.pop("SPARSEDITTO_LLM_MODEL", None)
    return out


@pytest.fixture(scope="module")
def weight(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("weights") / "layer.mtx"
    scipy.io.mmwrite(str(path), generate.unstructured(96, 64, 0.85, seed=3).to_scipy())
    return path


def test_help_and_version_read_like_a_tool(env):
    top = cli("--help", env=env).stdout
    assert "The `sparseditto` console script" not in top
    assert "find the fastest verified SpMM kernel" in top and "examples:" in top
    for command in ("demo", "analyze", "run", "targets", "bench", "memory"):
        assert f"    {command}" in top
    run_help = " ".join(cli("run", "--help", env=env).stdout.split())   # argparse wraps at $COLUMNS
    for option, words in {"matrix": ".safetensors", "--dtype": "accumulation is float32",
                          "--backend": "Triton interpreter", "--target": "sparseditto targets",
                          "--json": "as JSON", "--out": "FILE"}.items():
        assert option in run_help and words in run_help, option
    expected = f"sparseditto {version('sparseditto')}"
    assert cli("--version", env=env).stdout.strip() == expected
    module = subprocess.run([sys.executable, "-m", "sparseditto", "--version"], env=env, capture_output=True,
                            text=True, timeout=120)
    assert module.returncode == 0 and module.stdout.strip() == expected
    bad = cli("run", "--dtype", "int8", "x.mtx", env=env, check=False)
    assert bad.returncode == 2 and "invalid choice: 'int8'" in bad.stderr


def test_analyze_prints_a_report_and_json_on_request(env, weight, tmp_path):
    text = cli("analyze", str(weight), env=env).stdout
    assert "{" not in text
    for label in ("matrix", "pattern", "why", "rows", "columns", "N:M", "blocks", "band", "signature"):
        assert any(line.startswith(label) for line in text.splitlines()), label
    assert "unstructured" in text and "96 x 64" in text
    out = tmp_path / "report.json"
    data = json.loads(cli("analyze", str(weight), "--json", "-o", str(out), env=env).stdout)
    assert data["pattern"] == "unstructured" and json.loads(out.read_text()) == data
    missing = cli("analyze", str(tmp_path / "nope.mtx"), env=env, check=False)
    assert missing.returncode == 2 and missing.stderr.startswith("error: ") and "Traceback" not in missing.stderr


@pytest.mark.slow
def test_run_then_memory_list_agree(env, weight, tmp_path):
    out = tmp_path / "result.json"
    proc = cli("run", str(weight), "-n", "8", "--budget", "1", "--backend", "interpret", "-o", str(out), env=env)
    summary = proc.stdout
    assert "policy: expert" in summary and "memory: nothing similar yet" in summary
    assert "candidate 1/1" in proc.stderr          # live progress of the agents on stderr
    result = json.loads(out.read_text())
    assert result["policy_label"] == "expert" and f"recorded as run {result['run_id'][:8]}" in summary
    table = cli("memory", "list", env=env).stdout
    rows = [line for line in table.splitlines() if result["run_id"][:8] in line]
    assert len(rows) == 1 and "layer" in rows[0] and "96x64" in rows[0] and "CPU (interpreter)" in rows[0]
    speed = result["speedups"].get("dense")
    expected_cell = f"~{speed:.2f}x est." if speed is not None and result["speedups_are_estimates"] else "-"
    assert expected_cell in rows[0] and result["best"]["template"] in rows[0]
    shown = json.loads(cli("memory", "show", result["run_id"][:8], env=env).stdout)
    assert shown["id"] == result["run_id"]


def test_targets_names_are_whole_in_a_pipe(env):
    out = cli("targets", env=env).stdout
    assert "A100-80GB-PCIe" in out and "GeForce-RTX-4090" in out and "H100-80GB-HBM3" in out and "…" not in out
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.startswith("│")}
    # the templates never planned for a GPU: the tensor-core tier needs compute capability 9.0
    assert "tc_words" in rows["A100-80GB"] and "tc_sp24" in rows["L40S"] and "tc_" not in rows["H200"]


def test_a_closed_pipe_ends_quietly(env, weight):
    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "sparseditto"]
    for args in (["analyze", str(weight), "--json"], ["targets"]):
        proc = subprocess.Popen(cmd + args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        proc.stdout.close()                                   # the reader is gone before anything is written
        err = proc.stderr.read()
        proc.wait(timeout=120)
        assert proc.returncode == 141 and "Traceback" not in err and "BrokenPipe" not in err, (args, err)


@pytest.mark.slow(seconds=30)
def test_ctrl_c_stops_a_run_fast_and_the_same_command_resumes(env, weight, tmp_path):
    # The first verification also starts the sandboxed worker (importing torch and triton takes
    # seconds), so an interrupt sent as soon as it begins lands inside it.
    args = ["run", str(weight), "-n", "4", "--budget", "1", "--backend", "interpret",
            "--memory", str(tmp_path / "m.sqlite")]
    cmd = ([str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "sparseditto"]) + args
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)   # its own process group, like a terminal's foreground job
    seen = []
    deadline = time.time() + 240
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        if "verifying" in line:
            break
    assert any("verifying" in line for line in seen), "".join(seen)[-2000:]
    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)            # what Ctrl-C in a terminal does
    out, err = proc.communicate(timeout=60)
    took = time.monotonic() - sent
    assert proc.returncode == 130, (proc.returncode, err[-2000:])
    assert took < 15, f"Ctrl-C took {took:.1f} s"
    assert "run the same command again to resume" in err and "Traceback" not in err
    resumed = json.loads(cli(*args, "--json", env=env).stdout)
    assert resumed["resumed"] is True and resumed["report"]["pattern"] == "unstructured"


@pytest.mark.slow(seconds=30)
def test_demo_tells_the_story_of_a_win(env):
    """`make demo`'s command: the pattern and why, the plan, each kernel tried, the choice with its
    labelled estimate, the memory, and result.kernel(B) checked against the fp64 product."""
    out = cli("demo", env=env, timeout=600).stdout
    lines = {line.split()[0]: line for line in out.splitlines()[1:] if line.strip()}
    assert {"matrix", "pattern", "plan", "tried", "chosen", "memory", "check", "policy", "next"} <= set(lines)
    assert len(out.splitlines()) <= 14
    assert "block (confidence 1.00)" in lines["pattern"] and "64x64 blocks" in lines["pattern"]
    assert "bsr_tc" in lines["plan"] and "dense 6.7 us" in lines["plan"]
    assert lines["tried"].split()[1] == "bsr_tc:" and "verified" in lines["tried"]
    assert "estimated 2.40x faster than dense cuBLAS on A100-80GB" in lines["chosen"]
    assert "roofline model's estimate" in lines["chosen"]
    assert "matches the fp64 product" in lines["check"]
    assert "nothing similar yet" in lines["memory"] or "exact hit" in lines["memory"]
