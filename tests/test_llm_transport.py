"""The pieces under the LLM path, without a server: failure classes, the retry bounds, the budget,
the transcript record, prompt limits, the per-role usage reducer, measured bytes in the cost
model, and the memory's transcript table."""
from __future__ import annotations

import sqlite3

import pytest
import torch
from langchain_core.exceptions import ContextOverflowError
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from sparseditto import generate
from sparseditto.agents.llm_policy import LLMPolicy
from sparseditto.agents.llm_prompts import PromptLimits
from sparseditto.agents.llm_transport import (BudgetReached, ContextTooLong, Failure, LLMBudget, LLMCallFailed,
                                              ModelCaller, RetryPolicy, classify)
from sparseditto.agents.policy import CandidateSpec, CodeProposal, Diagnosis, FailureReport, PlanDecision
from sparseditto.agents.state import add_usage
from sparseditto.analysis import analyze
from sparseditto.harness.execution import packed_nbytes
from sparseditto.kernel_templates.registry import get_template
from sparseditto.llm import LLMCall, RunTokenUsage, call_cost, check_price
from sparseditto.memory import Memory
from sparseditto.testing_llm import ScriptedChatModel


class _Response:
    def __init__(self, status: int, headers: dict | None = None):
        self.status_code = status
        self.headers = headers or {}


class HTTPError(Exception):
    """An error shaped like the openai client's APIStatusError (status_code, response.headers)."""

    def __init__(self, message: str, status: int, headers: dict | None = None):
        super().__init__(message)
        self.status_code = status
        self.response = _Response(status, headers)


@pytest.mark.parametrize("exc, kind, retry_after", [
    (HTTPError("Rate limit reached", 429, {"retry-after": "2"}), "rate_limit", 2.0),
    (HTTPError("slow down", 429, {"retry-after-ms": "250", "retry-after": "9"}), "rate_limit", 0.25),
    (HTTPError("The server had an error", 503), "server_error", None),
    (HTTPError("This model's maximum context length is 8192 tokens", 400), "context_length", None),
    (ContextOverflowError("too long"), "context_length", None),
    (HTTPError("response_format json_schema is not supported", 400), "bad_request", None),
    (TimeoutError("timed out"), "timeout", None),
    (ConnectionError("Connection refused"), "connection", None),
    (ValueError("something else"), "other", None),
])
def test_failures_are_classified(exc, kind, retry_after):
    failure = classify(exc)
    assert failure.kind == kind and failure.retry_after_s == retry_after
    assert failure.error_type == type(exc).__name__


def test_retry_policy_bounds():
    policy = RetryPolicy(attempts=3, backoff_s=0.5, max_wait_s=20)
    limited = Failure("rate_limit", "RateLimitError", "429", 429, retry_after_s=3.0)
    assert policy.wait_for(limited, 1) == 3.0 and policy.wait_for(limited, 3) is None   # attempts bound
    assert policy.wait_for(Failure("rate_limit", "E", "", 429, retry_after_s=60.0), 1) is None   # beyond the bound
    server = Failure("server_error", "E", "", 500)
    assert [policy.wait_for(server, a) for a in (1, 2, 3)] == [0.5, 1.0, None]
    for kind in ("timeout", "connection", "context_length", "bad_request", "other"):
        assert policy.wait_for(Failure(kind, "E", ""), 1) is None


class Flaky:
    """A runnable failing with the given exceptions, then answering."""

    def __init__(self, *failures, answer=None):
        self.failures = list(failures)
        self.answer = answer or AIMessage(content="ok", usage_metadata={"input_tokens": 10, "output_tokens": 2,
                                                                        "total_tokens": 12})
        self.calls = 0

    def invoke(self, messages):
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return self.answer


MESSAGES = [SystemMessage(content="[sparseditto-role: planner] system"), HumanMessage(content="the prompt")]


def test_caller_retries_waits_and_records():
    waits = []
    caller = ModelCaller(model_name="m", retry=RetryPolicy(backoff_s=0.1), sleep=waits.append,
                         budget=LLMBudget(price=(1.0, 4.0)))
    flaky = Flaky(HTTPError("busy", 429, {"retry-after": "0.2"}), HTTPError("oops", 502))
    result, record = caller.invoke("planner", flaky, MESSAGES, "the prompt")
    assert result.content == "ok" and flaky.calls == 3 and waits == [0.2, 0.2]   # Retry-After, then 2nd back-off
    assert (record.attempts, record.outcome, record.total_tokens) == (3, "ok", 12)
    assert [r["status"] for r in record.retries] == [429, 502]
    assert record.cost_usd == pytest.approx(call_cost(10, 2, (1.0, 4.0))) == pytest.approx(18e-6)
    assert record.prompt == "the prompt" and record.prompt_chars > len("the prompt") and len(record.prompt_hash) == 64
    assert caller.budget.spent_tokens == 12


def test_caller_gives_up_with_the_record_on_the_exception():
    caller = ModelCaller(sleep=lambda s: None)
    with pytest.raises(LLMCallFailed) as info:
        caller.invoke("coder", Flaky(ConnectionError("refused")), MESSAGES, "p")
    assert (info.value.record.outcome, info.value.record.attempts, info.value.failure.kind) == ("error", 1, "connection")
    too_long = HTTPError("This model's maximum context length is 1000 tokens. However, your messages resulted in "
                         "4000 tokens.", 400)
    with pytest.raises(ContextTooLong) as info:
        caller.invoke("coder", Flaky(too_long), MESSAGES, "p")
    assert (info.value.limit, info.value.requested) == (1000, 4000) and info.value.shrink_factor() == pytest.approx(0.2)
    assert ContextTooLong(Failure("context_length", "E", "too long"), info.value.record).shrink_factor() == 0.25


def test_budget_is_checked_before_the_request():
    flaky = Flaky()
    caller = ModelCaller(budget=LLMBudget(max_tokens=100, spent_tokens=95))
    with pytest.raises(BudgetReached, match="95 of max_llm_tokens=100"):
        caller.invoke("planner", flaky, MESSAGES, "p")
    assert flaky.calls == 0   # no request was made
    cost = LLMBudget(max_cost=0.01, price=(1000.0, 0.0), spent_cost=0.0)
    with pytest.raises(BudgetReached, match="cost budget"):
        cost.check(20)        # 20 tokens at $1000 per million = $0.02
    cost.check(5)


def test_policy_hands_every_step_to_the_fallback_once_the_budget_is_spent():
    class Fallback:
        name = "expert"

        def plan(self, inp):
            return PlanDecision(action="stop", rationale="expert plan")

        def code(self, spec, template_source, feedback=None, brief=None):
            return CodeProposal(source="# expert", origin="template")

        def diagnose(self, failure, source):
            return Diagnosis(failure_class="x", action="give_up", rationale="expert")

    model = ScriptedChatModel(responses=[])
    policy = LLMPolicy(model, Fallback())
    policy.set_budget(LLMBudget(max_tokens=10))
    assert policy.code(CandidateSpec(template="csr_rowsplit", origin="llm"), "src").source == "# expert"
    assert policy.diagnose(FailureReport(template="t", status="crash"), "src").rationale == "expert"
    assert model.calls == [] and policy.calls == []
    assert [e["event"] for e in policy.events] == ["llm_budget_reached", "fallback", "fallback"]
    assert {e["error_type"] for e in policy.events if e["event"] == "fallback"} == {"BudgetReached"}
    # a fact of the machine is not the model's to fix: no request, no fallback event
    n = len(policy.events)
    failure = FailureReport(template="t", status="compile_error", failure_class="backend_unavailable")
    assert policy.diagnose(failure, "src").rationale == "expert" and len(policy.events) == n


def test_prompt_limits_scale_with_floors():
    small = PromptLimits().scaled(0.01)
    assert small.source_chars == 200 and small.history == 1 and small.templates == 1
    assert PromptLimits().scaled(0.5).source_chars == PromptLimits().source_chars // 2


def test_usage_reducer_sums_the_per_role_totals():
    a = RunTokenUsage.of_calls([LLMCall(role="planner", prompt_hash="h", prompt_chars=1, prompt_tokens=10,
                                        completion_tokens=2, total_tokens=12, cost_usd=0.5)]).as_update()
    b = RunTokenUsage.of_calls([LLMCall(role="coder", prompt_hash="h", prompt_chars=1, total_tokens=7),
                                LLMCall(role="planner", prompt_hash="h", prompt_chars=1, total_tokens=3,
                                        outcome="error")]).as_update()
    total = RunTokenUsage.model_validate(add_usage(add_usage({}, a), b))
    assert total.total_tokens == 22 and total.calls == 2           # the failed request answered nothing
    assert total.by_role["planner"].total_tokens == 15 and total.by_role["coder"].total_tokens == 7
    assert total.cost_usd == 0.5


@pytest.mark.parametrize("price, ok", [((2.5, 10), True), ("2.5,10", True), ("1/4", True), ((1,), False),
                                       ((-1, 2), False), ("x,y", False)])
def test_price_is_checked(price, ok):
    if ok:
        assert len(check_price(price)) == 2
    else:
        with pytest.raises(ValueError, match="llm_price"):
            check_price(price)


def test_packed_bytes_count_each_storage_once_and_skip_scratch():
    base = torch.zeros(100, dtype=torch.float16)
    packed = {"a": base, "view": base[10:20], "idx": torch.zeros(8, dtype=torch.int32),
              "nested": {"ids": torch.zeros(4, dtype=torch.int16)}, "scratch": {"ws": torch.zeros(1000)},
              "shape": (10, 10)}
    assert packed_nbytes(packed) == 200 + 32 + 8


def test_measured_bytes_replace_the_template_model_of_a():
    A = generate.unstructured(256, 256, 0.9, dtype="float16", seed=1)
    report = analyze(A)
    t = get_template("csr_rowsplit")
    model = t.cost(report, 1, "float16", "A100", {})
    doubled = t.cost(report, 1, "float16", "A100", {}, a_bytes=2 * model.a_bytes)
    assert doubled.a_bytes == 2 * model.a_bytes and doubled.bytes == pytest.approx(model.bytes + model.a_bytes)
    assert doubled.seconds >= model.seconds and "measured" in doubled.notes


def test_context_budget_fields_are_described_for_studio():
    from sparseditto.graphs.build import compile_graph

    schema = compile_graph().get_context_jsonschema()["properties"]
    for name in ("max_llm_tokens", "max_llm_cost", "llm_price"):
        assert "expert" in schema[name]["description"] or "price" in schema[name]["description"].lower()


def test_older_memory_files_gain_the_transcript_table(tmp_path):
    path = tmp_path / "old.sqlite"
    with Memory(path) as mem:
        run = mem.start_run(signature="s", versions={})
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE llm_calls")
    conn.commit()
    conn.close()
    with Memory(path) as mem:
        assert mem.format_transcript(run).endswith("made no LLM call (expert policy, or the model was never asked).")
        assert mem.record_llm_call(run, "planner", LLMCall(role="planner", prompt_hash="h", prompt_chars=3)) == 0
        assert mem.get_run(run)["llm_calls"][0]["role"] == "planner"
