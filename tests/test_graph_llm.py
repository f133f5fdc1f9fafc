"""The graph driven by the LLM policy, with scripted fake chat models (no network).

Each scenario is one an LLM really produces: a good kernel, a kernel that does not compile and is
fixed through the debugger loop, a kernel with a wrong result, a "kernel" that cheats with
torch.mm, and a server that is down. The graph must accept the first, repair the second, catch
the third and fourth, and fall back to the expert for the fifth, recording every step.
"""
from __future__ import annotations

import pytest
import torch

from sparseditto import generate
from sparseditto.api import SpMMKernel, run_graph
from sparseditto.memory import Memory
from sparseditto.testing_llm import (
    GOOD_KERNEL,
    cheating_model,
    fix_after_error_model,
    good_kernel_model,
    unreachable_model,
    wrong_result_model,
)


@pytest.fixture
def matrix():
    return generate.unstructured(64, 64, 0.8, dtype="float16", seed=5)


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSEDITTO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SPARSEDITTO_LLM_MODEL", raising=False)

    def go(A, model, **kw):
        return run_graph(A, target="A100", n=1, backend="interpret", budget=kw.pop("budget", 2), llm=model,
                         memory=tmp_path / "memory.sqlite", checkpoint=tmp_path / "checkpoints.sqlite", **kw)

    go.memory_path = tmp_path / "memory.sqlite"
    return go


@pytest.mark.slow
def test_good_llm_kernel_is_verified_and_recorded(matrix, run):
    model = good_kernel_model()
    result = run(matrix, model)
    assert result.policy == "llm"
    first = result.candidates[0]
    assert (first.origin, first.status) == ("llm", "verified")
    assert first.source.strip() == GOOD_KERNEL.strip()
    assert {"planner", "coder"} <= set(model.roles_called)
    usage = result.token_usage
    assert usage.total_tokens > 0 and {"planner", "coder"} <= set(usage.by_role)
    assert usage.total_tokens == sum(r.total_tokens for r in usage.by_role.values())
    assert [c.role for c in result.llm_calls] == model.roles_called   # every request, in order
    B = torch.randn(64, 3, dtype=torch.float16)
    C = SpMMKernel(matrix, first.source)(B)
    ref = torch.from_numpy(matrix.to_dense()) @ B.double()
    assert float((C.double() - ref).abs().max()) < 2e-2 * max(1.0, float(ref.abs().max()))
    # the trajectory in memory: the prompts, the code, the verdicts, the outcome
    with Memory(run.memory_path) as mem:
        steps = mem.get_run(result.run_id)["steps"]
    kinds = {s["kind"] for s in steps}
    assert {"decision", "prompt", "code", "feedback", "outcome"} <= kinds
    prompts = [s["payload"] for s in steps if s["kind"] == "prompt"]
    assert {"planner", "coder"} <= {p["role"] for p in prompts}
    with Memory(run.memory_path) as mem:
        transcript = mem.llm_calls(result.run_id)
    assert [p["call_idx"] for p in prompts] == [c["idx"] for c in transcript]
    assert all(c["prompt"] and c["reply"] and c["prompt_tokens"] > 0 for c in transcript)


@pytest.mark.slow
def test_kernel_that_does_not_compile_is_fixed_by_the_debugger_loop(matrix, run):
    result = run(matrix, fix_after_error_model())
    attempts = [c for c in result.candidates if c.index == 1]
    assert [c.status for c in attempts][-1] == "verified"
    broken = attempts[0]
    assert broken.status != "verified" and broken.failure_class
    assert "reduce_sum" in broken.source and "reduce_sum" not in attempts[-1].source
    assert any(d["node"] == "debugger" and d["action"] in ("retry_source", "retry_params") for d in result.decisions)
    assert attempts[-1].attempt == 2


def test_wrong_result_is_caught(matrix, run):
    result = run(matrix, wrong_result_model())
    bad = result.candidates[0]
    assert bad.origin == "llm" and bad.status == "wrong_result" and bad.failure_class == "wrong_result"
    assert result.best.source != bad.source
    assert any(d["node"] == "debugger" and d["action"] == "give_up" for d in result.decisions)


def test_cheating_kernel_is_rejected_by_static_checks(matrix, run):
    result = run(matrix, cheating_model())
    bad = result.candidates[0]
    assert bad.status == "static_rejected"
    assert "torch.mm" in bad.source and ("mm" in bad.message or "matmul" in bad.message)
    assert all(c.source != bad.source or c.status != "verified" for c in result.candidates)


def test_unreachable_server_falls_back_to_the_expert(matrix, run):
    result = run(matrix, unreachable_model())
    fallbacks = [e for e in result.events if e.get("event") == "fallback"]
    assert fallbacks and fallbacks[0]["decision"] == "plan" and "Connection" in fallbacks[0]["reason"]
    generated = [c for c in result.candidates if c.origin != "vendor"]
    assert generated and all(c.origin == "template" for c in generated)
    assert any(c.status == "verified" for c in result.candidates)
    assert "events:" in result.summary()
    # the summary and the Result say the LLM policy did not really decide
    n = len(fallbacks)
    assert result.policy == "llm"
    assert result.policy_label == f"llm ({n} step{'' if n == 1 else 's'} fell back to expert)"
    assert f"policy: {result.policy_label}" in result.summary()
    assert result.model_dump()["policy_label"] == result.policy_label
