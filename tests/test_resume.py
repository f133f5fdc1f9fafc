"""An interrupted run resumes from its SQLite checkpoint without redoing verified work.

`run_graph` checkpoints every step under a thread id derived from the matrix and the settings.
Here a test hook crashes the profiler mid-run (after two candidates were verified); calling
`run_graph` again with the same inputs picks the thread up at the profiler, and the verification
counter shows that neither verified candidate went through the sandbox again.
"""
from __future__ import annotations

import json
import sqlite3
from contextlib import closing

import pytest

from sparseditto import generate, harness
from sparseditto.agents.expert import ExpertPolicy
from sparseditto.agents.policy import CandidateSpec, PlanDecision
from sparseditto.api import run_graph


class FixedPlan(ExpertPolicy):
    """The expert, except that it plans a fixed list of templates (so the test controls how many
    candidates run, whatever the cost model would prefer on the interpreter)."""

    def __init__(self, templates):
        super().__init__()
        self.templates = list(templates)

    def plan(self, inp):
        tried = {t.template for t in inp.tried}
        left = [t for t in self.templates if t not in tried]
        if not left or inp.budget_left <= 0:
            return PlanDecision(action="stop", rationale="fixed plan done")
        return PlanDecision(action="try", rationale=f"fixed plan: {left[0]}",
                            candidates=[CandidateSpec(template=t, rationale=f"fixed plan: {t}") for t in left])


@pytest.fixture
def verify_calls(monkeypatch, tmp_path):
    monkeypatch.setenv("SPARSEDITTO_CACHE_DIR", str(tmp_path / "cache"))
    calls = []
    real = harness.run_and_verify

    def counting(candidate, matrix, **kw):
        if getattr(candidate, "backend", None) != "builtin":   # the vendor paths are measured in finalize
            calls.append(candidate.source_hash)
        return real(candidate, matrix, **kw)

    monkeypatch.setattr(harness, "run_and_verify", counting)
    return calls


def settings(tmp_path, **kw):
    base = dict(target="A100", n=1, backend="interpret", budget=3, memory=tmp_path / "memory.sqlite",
                checkpoint=tmp_path / "checkpoints.sqlite")
    return {**base, **kw}


def test_crash_in_the_profiler_resumes_at_the_profiler(tmp_path, verify_calls):
    A = generate.nm_sparse(128, 128, dtype="float16", seed=3)
    plan = ["nm_compressed", "bitmap_tiles"]

    def crash_on_second_profile(node, state):
        verified = [c for c in state.get("candidates") or [] if c["status"] == "verified"]
        if node == "profiler" and len(verified) == 1:
            raise RuntimeError("simulated crash while profiling the second candidate")

    with pytest.raises(RuntimeError, match="simulated crash"):
        run_graph(A, **settings(tmp_path, policy=FixedPlan(plan), hooks={"before_node": crash_on_second_profile}))
    assert len(verify_calls) == 2 and len(set(verify_calls)) == 2
    before = list(verify_calls)

    result = run_graph(A, **settings(tmp_path, policy=FixedPlan(plan)))
    assert result.resumed
    assert verify_calls == before, "a verified candidate went through verification again"
    verified = [c for c in result.candidates if c.status == "verified" and c.origin != "vendor"]
    assert [c.template for c in verified] == plan
    assert {c.source_hash for c in verified} == set(before)
    debugger_verdicts = [d for d in result.decisions if d["node"] == "debugger" and d["action"] == "verified"]
    assert len(debugger_verdicts) == 2  # the trail is not duplicated by the resume
    assert any(d["node"] == "finalize" for d in result.decisions)

    # The thread is finished now: the same call starts a fresh thread instead of reopening it.
    fresh = run_graph(A, **settings(tmp_path, policy=FixedPlan(plan[:1]), memory=False))
    assert not fresh.resumed and fresh.thread_id != result.thread_id


def memory_rows(path, run_id: str) -> tuple[dict, list[str]]:
    """(vendor template -> candidate rows, finalize's step actions) of one run, read from the SQLite file."""
    with closing(sqlite3.connect(path)) as db:
        vendors = dict(db.execute("SELECT template, COUNT(*) FROM candidates WHERE run_id = ? AND origin = 'vendor' "
                                  "GROUP BY template", [run_id]).fetchall())
        steps = [json.loads(p)["action"] for (p,) in db.execute(
            "SELECT payload FROM steps WHERE run_id = ? AND node = 'finalize' ORDER BY idx", [run_id])]
    return vendors, steps


@pytest.fixture
def vendor_verifications(monkeypatch, verify_calls):
    calls = []
    real = harness.run_and_verify

    def counting(candidate, matrix, **kw):
        if getattr(candidate, "backend", None) == "builtin":
            calls.append(candidate.template)
        return real(candidate, matrix, **kw)

    monkeypatch.setattr(harness, "run_and_verify", counting)
    return calls


def test_interrupt_at_the_approval_prompt_resumes_at_finalize(tmp_path, verify_calls, vendor_verifications):
    """finalize measures the vendor paths (memory rows included) before its approval prompt, and
    LangGraph runs it again from its start on resume: the resumed node must get those results,
    not measure and record them again. Resumed twice: in the call that answers the prompt, and
    after a Ctrl-C at the prompt by a new call (the memory and checkpoint files are real)."""
    A = generate.row_pruned(256, 4096, 0.9, dtype="float32", seed=4)

    def ctrl_c(payload):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_graph(A, **settings(tmp_path, budget=1, dtype="float32", approve=ctrl_c))
    assert len(verify_calls) == 1
    assert sorted(vendor_verifications) == ["cusparse_csr_torch", "dense"]   # what the CPU runs in fp32
    seen = []
    result = run_graph(A, **settings(tmp_path, budget=1, dtype="float32",
                                     approve=lambda p: seen.append(p) or True))
    assert result.resumed and len(verify_calls) == 1
    assert seen and seen[0]["chosen"]["template"] == result.best.template == "compact_rows_cols"
    assert sorted(vendor_verifications) == ["cusparse_csr_torch", "dense"], "vendor paths measured again"
    vendors, steps = memory_rows(tmp_path / "memory.sqlite", result.run_id)
    assert vendors == {"cusparse_csr_torch": 1, "dense": 1} and steps == ["vendor_paths", "choose"]

    # answered in the same call: run_graph resumes the interrupted thread itself
    B = generate.row_pruned(256, 4096, 0.9, dtype="float32", seed=5)
    answered = run_graph(B, **settings(tmp_path, budget=1, dtype="float32", approve=lambda p: True))
    assert answered.best.template == "compact_rows_cols" and len(vendor_verifications) == 4
    vendors, steps = memory_rows(tmp_path / "memory.sqlite", answered.run_id)
    assert vendors == {"cusparse_csr_torch": 1, "dense": 1} and steps == ["vendor_paths", "choose"]
    assert len([c for c in answered.candidates if c.origin == "vendor"]) == 2


def test_explicit_thread_id_returns_the_finished_run(tmp_path, verify_calls):
    A = generate.dense(32, 32, dtype="float16", seed=0)
    first = run_graph(A, thread_id="my-thread", **settings(tmp_path, memory=False))
    again = run_graph(A, thread_id="my-thread", **settings(tmp_path, memory=False))
    assert again.thread_id == first.thread_id == "my-thread" and again.resumed
    assert again.best == first.best and again.decisions == first.decisions
