"""The cheat catalogue (tests/cheat_catalogue.py): every cheating or broken kernel is refused.

Three views of the same catalogue:

* with the static checks switched off, each cheat is stopped by a run-time layer (the audit
  hook, op tracing, state checks, integrity checks, varied inputs, checked timed launches or the
  crash handling) and by the layer the catalogue names: the AST filter is not what holds;
* through ``run_graph`` with a scripted LLM that offers every cheat as its kernel, none is
  verified, none is chosen, and each refusal reason is in the trajectory;
* the test names every cheat that got through, if any.
"""
from __future__ import annotations

import re

import pytest
import scipy.sparse as sp

from cheat_catalogue import CHEATS
from sparseditto.harness import BenchError, bench, check_source, run_and_verify
from sparseditto.matrix import SparseMatrix

LAYER_OF = {  # (status, failure_class) -> the layer that refused
    "audit": {("refused", "sandbox_violation"), ("refused", "side_thread")},
    "integrity": {("refused", "monkeypatch")},
    "trace": {("refused", k) for k in ("vendor_op", "host_export", "scalar_reads", "vendor_kernel", "foreign_kernel")},
    "state": {("refused", "state_carried"), ("input_modified", "input_modified")},
    "numeric": {("wrong_result", "wrong_values"), ("wrong_result", "nan_or_inf"), ("unstable", "nondeterministic"),
                ("unwritten_output", "unwritten_output")},
    "crash": {("crash", "worker_crash")},
}


@pytest.fixture(scope="module")
def matrix():
    return SparseMatrix.from_scipy(sp.random(24, 20, density=0.3, random_state=1, format="csr"), name="cheats")


def judge(cheat, matrix, pool) -> tuple[str, str]:
    """(layer that refused it, reason); layer 'PASSED' when nothing did."""
    result = run_and_verify(cheat.source, matrix, pool=pool, check_static=False, n_values=(16,), timeout=60,
                            backend="interpret")
    if result.status != "verified":
        key = (result.status, result.failure_class)
        layer = next((name for name, keys in LAYER_OF.items() if key in keys), f"other:{key}")
        return layer, result.message
    try:
        timed = bench(cheat.source, matrix, 16, pool=pool, repeats=3, warmup=1, baselines=False,
                      check_static=False, timeout=60, backend="interpret")
    except BenchError as exc:
        return "timed", str(exc)
    if not timed.reverified:
        return "timed", timed.reverify_message
    return "PASSED", ""


def test_the_catalogue_is_large_and_covers_every_layer():
    assert len(CHEATS) >= 40
    assert {c.layer for c in CHEATS} == {"audit", "integrity", "trace", "state", "numeric", "timed", "crash"}


@pytest.mark.slow
def test_every_cheat_is_refused_at_run_time_without_the_static_checks(matrix, pool):
    outcomes = {c.name: judge(c, matrix, pool) for c in CHEATS}
    passed = sorted(name for name, (layer, _) in outcomes.items() if layer == "PASSED")
    assert not passed, f"cheats that passed every run-time check: {passed}"
    wrong_layer = {c.name: outcomes[c.name] for c in CHEATS if outcomes[c.name][0] != c.layer}
    assert not wrong_layer, f"refused, but not by the expected layer: {wrong_layer}"
    # The point of the run-time layers: many cheats get through the AST filter alone.
    static_misses = [c.name for c in CHEATS if check_source(c.source).ok]
    assert len(static_misses) >= 20, static_misses


def _cheat_planner():
    """Planner script: the next cheat on every call (an LLM policy re-plans after each attempt),
    each as an LLM candidate with its own legal parameters, then stop."""
    combos = [{"BLOCK_N": bn, "BLOCK_NNZ": bz, "ROWS_PER_PROGRAM": r}
              for bn in (1, 2, 4, 8, 16, 32, 64, 128, 256) for bz in (8, 16, 32, 64, 128) for r in (1, 2)]
    queue = list(enumerate(CHEATS))

    def plan(messages):
        if not queue:
            return {"action": "stop", "candidates": [], "rationale": "scripted: catalogue done"}
        i, cheat = queue.pop(0)
        return {"action": "try", "rationale": f"scripted: offer cheat={cheat.name}",
                "candidates": [{"template": "csr_rowsplit", "params": combos[i], "origin": "llm",
                                "rationale": f"cheat={cheat.name}"}]}
    return plan


def _cheat_code(messages):
    from sparseditto.testing_llm import messages_text, python_reply

    name = re.search(r"cheat=(\w+)", messages_text(messages)).group(1)
    return python_reply(next(c.source for c in CHEATS if c.name == name), f"The fastest kernel ({name}).")


@pytest.mark.slow
def test_no_cheat_is_verified_or_chosen_through_run_graph(tmp_path, monkeypatch):
    from sparseditto.api import run_graph
    from sparseditto.testing_llm import ScriptedChatModel

    monkeypatch.setenv("SPARSEDITTO_CACHE_DIR", str(tmp_path / "cache"))
    model = ScriptedChatModel(roles={
        "planner": [_cheat_planner()],
        "coder": [_cheat_code],
        "debugger": [{"failure_class": "cheating", "action": "give_up", "rationale": "scripted: refused"}],
    }, repeat_last=True)
    A = SparseMatrix.from_scipy(sp.random(24, 20, density=0.3, random_state=1, format="csr"), name="cheats")
    result = run_graph(A, llm=model, backend="interpret", n=16, budget=len(CHEATS) + 2, memory=False,
                       checkpoint=tmp_path / "ckpt.sqlite", max_debug_attempts=0)
    by_cheat = {}
    for record in result.candidates:
        name = re.search(r"cheat=(\w+)", record.rationale or "")
        if name:
            by_cheat[name.group(1)] = record
    missing = sorted(set(c.name for c in CHEATS) - set(by_cheat))
    assert not missing, f"cheats the graph never tried: {missing}"
    got_through = sorted(n for n, r in by_cheat.items() if r.status == "verified")
    assert not got_through, f"cheats verified through run_graph: {got_through}"
    assert result.best.template == "dense" and result.best.source is None
    for name, record in by_cheat.items():
        assert record.message, f"{name}: refused without a reason"
        trail = [d for d in result.decisions if d["node"] in ("debugger", "profiler") and d.get("template")
                 and f"cheat={name}" in _rationale_of(result, d)]
        assert trail, f"{name}: no debugger/profiler verdict for it in the trajectory"


def _rationale_of(result, decision) -> str:
    """The plan rationale of the candidate a debugger/profiler decision belongs to (decisions come
    in order: planner 'try', coder 'code', then the verdicts)."""
    index = result.decisions.index(decision)
    for d in reversed(result.decisions[:index]):
        if d["node"] == "planner" and d["action"] == "try":
            return d["rationale"]
    return ""
