"""The LLM policy, its tools and the scripted fake chat models (no network, except one refused
connection to a closed loopback port)."""
from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
import scipy.sparse as sp
from langchain_core.messages import AIMessage, ToolMessage

from sparseditto.agents.llm_answers import extract_json, extract_python
from sparseditto.agents.llm_policy import LLMPolicy
from sparseditto.agents.llm_prompts import compact_json, load_prompt, plan_prompt
from sparseditto.agents.policy import (
    CandidateSpec,
    CodeProposal,
    Diagnosis,
    FailureReport,
    PlanDecision,
    PlanningInput,
    TriedCandidate,
)
from sparseditto.agents.tools import ToolContext, past_kernels_text, triton_language_api_text
from sparseditto.llm import RunTokenUsage, TokenUsage, describe_llm, resolve_llm
from sparseditto.matrix import SparseMatrix
from sparseditto.memory import STEP_KINDS, Memory
from sparseditto.testing_llm import (
    BROKEN_KERNEL,
    CHEATING_KERNEL,
    GOOD_KERNEL,
    WRONG_KERNEL,
    ScriptedChatModel,
    ScriptExhausted,
    cheating_model,
    fix_after_error_model,
    good_kernel_model,
    python_reply,
    tool_call_message,
    unreachable_model,
    wrong_result_model,
)

REPORT = {"pattern": "unstructured", "shape": [64, 48], "nnz": 300, "density": 0.0977,
          "row_nnz": {"mean": 4.7, "max": 11, "cv": 0.41}, "signature": "sig-123"}
TEMPLATES = [
    {"name": "csr_rowsplit", "estimate_ms": 0.012, "bound": "memory", "format": "csr",
     "params": {"BLOCK_N": ["auto", 16, 32, 64], "num_warps": ["auto", 1, 2, 4]},
     "default_params": {"BLOCK_N": "auto", "num_warps": "auto"}},
    {"name": "bitmap_tiles", "estimate_ms": 0.02, "params": {"TILE": [16, 32]}},
    {"name": "dense", "estimate_ms": 0.03, "builtin": True},
]


class RecordingFallback:
    """A minimal Policy that records what it was asked (stands in for the expert in unit tests)."""

    name = "recording"

    def __init__(self):
        self.asked: list[str] = []

    def plan(self, inp):
        self.asked.append("plan")
        return PlanDecision(action="stop", rationale="fallback plan")

    def code(self, spec, template_source, feedback=None, brief=None):
        self.asked.append("code")
        return CodeProposal(source=spec.source or "# fallback source", origin=spec.origin)

    def diagnose(self, failure, source):
        self.asked.append("diagnose")
        return Diagnosis(failure_class=failure.status, action="give_up", rationale="fallback diagnosis")


def planning_input(n_tried: int = 0, **kw) -> PlanningInput:
    tried = [TriedCandidate(template="csr_rowsplit", params={"BLOCK_N": 16, "i": i}, status="verified",
                            median_ms=0.02 + i * 1e-4, speedup_vs_dense=1.2, pct_of_roofline=40.0,
                            bottleneck="dram") for i in range(n_tried)]
    fields = dict(report=REPORT, target={"name": "H200", "mem_bandwidth_gbs": 4800}, n_values=[16, 1],
                  dtype="float16", tried=tried, best=tried[0] if tried else None, dense_ms=0.03,
                  roofline_ms=0.008, budget_left=3, templates=TEMPLATES,
                  memory_hits=[{"kind": "neighbour", "matrix_name": "old", "distance": 0.1,
                                "template": "csr_rowsplit", "params": {"BLOCK_N": 32},
                                "source": "x" * 5000}])
    fields.update(kw)
    return PlanningInput(**fields)


def policy_with(responses, **kw) -> tuple[LLMPolicy, ScriptedChatModel, RecordingFallback]:
    model = responses if isinstance(responses, ScriptedChatModel) else ScriptedChatModel(responses=responses)
    fallback = RecordingFallback()
    return LLMPolicy(model, fallback, **kw), model, fallback


GOOD_PLAN = {"action": "try", "rationale": "csr first",
             "candidates": [{"template": "csr_rowsplit", "params": {"BLOCK_N": 32}, "rationale": "fits"},
                            {"template": "bitmap_tiles", "params": {}, "origin": "llm"}]}


# ---- plan --------------------------------------------------------------------------------------
def test_plan_parsed_and_validated():
    policy, model, fallback = policy_with([GOOD_PLAN])
    decision = policy.plan(planning_input())
    assert decision.action == "try"
    assert [(c.template, c.params, c.origin) for c in decision.candidates] == [
        ("csr_rowsplit", {"BLOCK_N": 32}, "template"), ("bitmap_tiles", {}, "llm")]
    assert fallback.asked == [] and model.structured_schemas == ["PlanDecision"]
    assert policy.events == [] and [c.role for c in policy.calls] == ["planner"]
    call = policy.calls[0]
    assert call.outcome == "ok" and "csr_rowsplit" in call.reply and call.fallback_reason is None
    assert call.prompt.startswith("## Matrix pattern report") and len(call.prompt_hash) == 64
    assert call.prompt_chars > len(call.prompt) and call.total_tokens == call.prompt_tokens + call.completion_tokens
    assert model.roles_called == ["planner"]


def test_plan_in_json_mode_parses_json_inside_prose():
    reply = "Sure. Here is my plan:\n```json\n" + json.dumps(GOOD_PLAN) + "\n```\nGood luck."
    policy, model, fallback = policy_with([reply], structured_output="json")
    decision = policy.plan(planning_input())
    assert decision.candidates[0].template == "csr_rowsplit" and fallback.asked == []
    assert model.structured_schemas == []  # plain invoke, JSON parsed from the text
    assert "JSON schema of the answer" in model.prompts[0]


def test_server_without_structured_output_switches_to_json_in_text():
    class BadRequestError(Exception):
        status_code = 400

    policy, model, fallback = policy_with([BadRequestError("response_format json_schema is not supported"),
                                           json.dumps(GOOD_PLAN), json.dumps(GOOD_PLAN)])
    assert policy.plan(planning_input()).candidates[0].template == "csr_rowsplit"
    assert policy.plan(planning_input()).candidates[0].template == "csr_rowsplit"
    assert fallback.asked == [] and policy.structured_output == "json"
    assert model.structured_schemas == ["PlanDecision"]  # asked natively once, then text
    assert [e["event"] for e in policy.events] == ["structured_output_switch"]
    assert [c.outcome for c in policy.calls] == ["error", "ok", "ok"]   # the refused request is in the transcript


def test_plan_is_trimmed_to_budget_and_stop_drops_candidates():
    policy, _, _ = policy_with([GOOD_PLAN, {"action": "stop", "rationale": "done", "candidates": GOOD_PLAN["candidates"]}])
    assert len(policy.plan(planning_input(budget_left=1)).candidates) == 1
    stopped = policy.plan(planning_input())
    assert stopped.action == "stop" and stopped.candidates == []


@pytest.mark.parametrize("bad_plan, why", [
    ({"action": "try", "rationale": "r", "candidates": [{"template": "magic_kernel", "params": {}}]},
     "unknown template 'magic_kernel'"),
    ({"action": "try", "rationale": "r", "candidates": [{"template": "csr_rowsplit", "params": {"BLOCK_N": 48}}]},
     "BLOCK_N=48 is not legal"),
    ({"action": "try", "rationale": "r", "candidates": [{"template": "csr_rowsplit", "params": {"TILE_Q": 2}}]},
     "has no parameter 'TILE_Q'"),
    ({"action": "try", "rationale": "r", "candidates": []}, "no candidates"),
    ({"action": "try", "rationale": "r", "candidates": [{"template": "csr_rowsplit", "params": [1, 2]}]},
     "does not fit PlanDecision"),
])
def test_invalid_plan_falls_back_with_the_reason(bad_plan, why):
    policy, _, fallback = policy_with([bad_plan])
    decision = policy.plan(planning_input())
    assert decision.rationale == "fallback plan" and fallback.asked == ["plan"]
    event = policy.events[-1]
    assert event["event"] == "fallback" and event["decision"] == "plan" and why in event["reason"]
    assert event["kind"] in STEP_KINDS


def test_quoted_numbers_are_normalized_to_legal_values():
    plan = {"action": "try", "rationale": "r",
            "candidates": [{"template": "csr_rowsplit", "params": {"BLOCK_N": "32", "num_warps": 4.0}}]}
    policy, _, fallback = policy_with([plan])
    decision = policy.plan(planning_input())
    assert decision.candidates[0].params == {"BLOCK_N": 32, "num_warps": 4} and fallback.asked == []
    assert type(decision.candidates[0].params["num_warps"]) is int


def test_garbage_answer_falls_back():
    policy, _, fallback = policy_with(["I think you should try a faster kernel!!"])
    assert policy.plan(planning_input()).rationale == "fallback plan"
    assert "no JSON object" in policy.events[-1]["reason"]
    policy, _, fallback = policy_with(["{not json at all"], structured_output="json")
    assert policy.plan(planning_input()).rationale == "fallback plan"


def test_unreachable_server_falls_back_for_every_decision():
    policy, model, fallback = policy_with(unreachable_model())
    spec = CandidateSpec(template="csr_rowsplit", origin="llm")
    assert policy.plan(planning_input()).rationale == "fallback plan"
    assert policy.code(spec, "# template", None).source == "# fallback source"
    assert policy.diagnose(FailureReport(template="csr_rowsplit", status="crash"), "src").rationale == "fallback diagnosis"
    assert fallback.asked == ["plan", "code", "diagnose"]
    fallbacks = [e for e in policy.events if e["event"] == "fallback"]
    assert [e["decision"] for e in fallbacks] == ["plan", "code", "diagnose"]
    assert {e["error_type"] for e in fallbacks} == {"ConnectionError"}
    assert len(model.calls) == 3 and policy.usage.calls == 0   # a refused connection is not retried
    assert [(c.outcome, c.error_type, c.attempts) for c in policy.calls] == [("error", "ConnectionError", 1)] * 3
    assert all("Connection refused" in c.fallback_reason for c in policy.calls)


def test_real_openai_client_against_a_closed_port_falls_back(monkeypatch):
    """ChatOpenAI built by resolve_llm, pointed at a loopback port nobody listens on."""
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    model = resolve_llm("some-local-model", timeout=5)
    policy = LLMPolicy(model, RecordingFallback())
    assert policy.plan(planning_input()).rationale == "fallback plan"
    assert "onnection" in policy.events[-1]["reason"]


def test_exhausted_script_falls_back():
    policy, model, fallback = policy_with([])
    assert policy.plan(planning_input()).rationale == "fallback plan"
    assert policy.events[-1]["error_type"] == "ScriptExhausted"


# ---- prompts -----------------------------------------------------------------------------------
def test_plan_prompt_contains_the_facts_and_stays_bounded():
    policy, model, _ = policy_with([GOOD_PLAN])
    policy.plan(planning_input(n_tried=3))
    system, human = model.calls[0][0].content, model.calls[0][1].content
    assert system == load_prompt("planner") and "[sparseditto-role: planner]" in system
    assert json.dumps(REPORT, separators=(",", ":")) in human          # the report JSON, compact
    assert "- csr_rowsplit: " in human and "0.012" in human              # templates + estimates
    assert "Budget left: 3" in human and "Dense cuBLAS: 0.03 ms" in human
    assert '"matrix_name":"old"' in human and "x" * 100 not in human     # memory hit, no source
    assert "3. csr_rowsplit" in human and "Best so far" in human

    short = plan_prompt(planning_input(n_tried=9))
    long = plan_prompt(planning_input(n_tried=300))
    assert "(292 earlier candidate(s) omitted)" in long
    assert '"i":299' in long and '"i":5}' not in long.split("Best so far")[0]
    assert abs(len(long) - len(short)) < 200 and len(long) < 8000


def test_huge_report_is_compacted():
    report = dict(REPORT, histogram=list(range(5000)), note="y" * 20000)
    text = compact_json(report, 2000)
    assert len(text) <= 2000 + 20 and '"pattern":"unstructured"' in text
    assert len(plan_prompt(planning_input(report=report))) < 10000


# ---- code --------------------------------------------------------------------------------------
def test_coder_extracts_the_python_block_and_sees_contract_and_feedback():
    reply = python_reply(GOOD_KERNEL, "Row-wise CSR with chunked loads.") + "\nAnything else?"
    policy, model, fallback = policy_with([reply])
    spec = CandidateSpec(template="csr_rowsplit", params={"BLOCK_N": 32}, rationale="adapt it", origin="llm")
    proposal = policy.code(spec, "# TEMPLATE SOURCE MARKER\n", "CompilationError: at 12:4 bad thing")
    assert proposal.source == GOOD_KERNEL and proposal.origin == "llm"
    assert proposal.rationale == "Row-wise CSR with chunked loads." and fallback.asked == []
    system, human = model.calls[0][0].content, model.calls[0][1].content
    assert "def prepare(A, dtype, device) -> dict" in system and "torch.matmul" in system
    assert "# TEMPLATE SOURCE MARKER" in human and "CompilationError: at 12:4 bad thing" in human
    assert "'csr_rowsplit'" in human and '"BLOCK_N": 32' in human


def test_coder_reply_without_a_complete_module_falls_back():
    policy, _, fallback = policy_with(["```python\ndef spmm(packed, B, out):\n    pass\n```"])
    assert policy.code(CandidateSpec(template="t", origin="llm"), "src").source == "# fallback source"
    assert "no ```python block" in policy.events[-1]["reason"] and fallback.asked == ["code"]


def test_plain_template_instances_and_remembered_kernels_do_not_ask_the_model():
    policy, model, fallback = policy_with([])
    spec = CandidateSpec(template="csr_rowsplit", origin="memory", source=GOOD_KERNEL)
    assert policy.code(spec, "src").source == GOOD_KERNEL
    assert policy.code(CandidateSpec(template="csr_rowsplit", params={"BLOCK_N": 32}), "src").source == "# fallback source"
    assert model.calls == [] and fallback.asked == ["code", "code"] and policy.events == []


def test_extract_helpers():
    assert extract_python(GOOD_KERNEL) == GOOD_KERNEL  # bare code
    two = f"draft:\n```python\nx = 1\n```\nfinal:\n```python\n{GOOD_KERNEL}```"
    assert extract_python(two) == GOOD_KERNEL
    assert extract_python("no code here") is None
    assert extract_json('the answer is {"a": {"b": 1}} ok') == {"a": {"b": 1}}


# ---- tools -------------------------------------------------------------------------------------
def test_tool_loop_runs_triton_language_api_and_returns_real_names():
    model = ScriptedChatModel(responses=[
        tool_call_message("triton_language_api", query="dot"),
        AIMessage(content="", tool_calls=[
            {"name": "triton_language_api", "args": {"query": "load"}, "id": "c2"},
            {"name": "no_such_tool", "args": {}, "id": "c3"}]),
        python_reply(GOOD_KERNEL),
    ])
    policy = LLMPolicy(model, RecordingFallback())
    proposal = policy.code(CandidateSpec(template="csr_rowsplit", origin="llm"), "src")
    assert proposal.source == GOOD_KERNEL
    assert set(model.bound_tools) == {"triton_language_api", "describe_template", "instantiate_template",
                                      "past_kernels", "compile_kernel", "verify_kernel"}
    tool_msgs = [m for m in model.calls[-1] if isinstance(m, ToolMessage)]
    assert "tl.dot(input, other" in tool_msgs[0].content
    assert "tl.load(pointer" in tool_msgs[1].content
    assert "unknown tool 'no_such_tool'" in tool_msgs[2].content
    assert [c.round for c in policy.calls] == [0, 1, 2]   # one transcript entry per request
    calls = [t for c in policy.calls for t in c.tool_calls]
    assert [c["name"] for c in calls] == ["triton_language_api", "triton_language_api", "no_such_tool"]
    assert "[tool triton_language_api]" in policy.calls[2].prompt   # round 2 sent the tool results
    assert policy.usage.calls == 3


def test_tool_rounds_are_bounded():
    looping = [tool_call_message("triton_language_api", query="sum")] * 3
    model = ScriptedChatModel(responses=[*looping, python_reply(GOOD_KERNEL)])
    policy = LLMPolicy(model, RecordingFallback(), max_tool_rounds=2)
    assert policy.code(CandidateSpec(template="t", origin="llm"), "src").source == GOOD_KERNEL
    assert len(model.calls) == 4
    assert "tool budget spent" in model.calls[-1][-1].content


def test_triton_language_api_introspects_the_installed_triton():
    import triton.language as tl

    everything = triton_language_api_text("")
    assert "dot" in everything and "load" in everything and "program_id" in everything
    atomic = triton_language_api_text("atomic_add")
    assert "tl.atomic_add(pointer, val" in atomic and "_semantic" not in atomic
    assert hasattr(tl, "atomic_add")
    assert "no name in triton.language" in triton_language_api_text("reduce_sum")
    assert "tl.math." in triton_language_api_text("math.exp") or "tl.exp(" in triton_language_api_text("exp")


def test_past_kernels_tool_reads_memory(tmp_path):
    with Memory(tmp_path / "m.sqlite") as mem:
        ctx = ToolContext(memory=mem, signature="sig-123", pattern="unstructured")
        assert "no verified kernel" in past_kernels_text(ctx)
        run = mem.start_run(signature="sig-123", pattern="unstructured", versions={})
        cand = mem.record_candidate(run, template="csr_rowsplit", status="verified", source=GOOD_KERNEL)
        mem.finish_run(run, "ok", cand, best_speedup_vs_dense=1.4)
        text = past_kernels_text(ctx, "unstructured")
        assert "csr_rowsplit" in text and "def spmm(" in text and "1.4" in text
    assert "memory is off" in past_kernels_text(ToolContext())


def test_template_tools_when_the_registry_is_there():
    registry = pytest.importorskip("sparseditto.kernel_templates.registry")
    from sparseditto.agents.tools import describe_template_text, instantiate_template_text

    assert "BLOCK_N" in describe_template_text("csr_rowsplit")
    unknown = describe_template_text("no_such_template")
    assert unknown.startswith("error:") and "csr_rowsplit" in unknown  # names the known templates
    source = instantiate_template_text("csr_rowsplit", '{"BLOCK_N": 32}')
    assert "def spmm(" in source
    assert any(line.startswith("PARAMS = ") and "'BLOCK_N': 32" in line for line in source.splitlines())
    assert instantiate_template_text("csr_rowsplit", '{"BLOCK_N": 48}').startswith("error:")
    assert instantiate_template_text("csr_rowsplit", "{bad").startswith("error: params_json")
    assert "csr_rowsplit" in {t.name for t in registry.list_templates()}


# ---- diagnose ----------------------------------------------------------------------------------
def test_diagnose_structured_and_validated():
    fix = Diagnosis(failure_class="compile_error", action="retry_source", source=GOOD_KERNEL, rationale="fix")
    policy, model, fallback = policy_with([fix, {"failure_class": "x", "action": "retry_source", "source": "pass"},
                                           GOOD_PLAN,
                                           {"failure_class": "x", "action": "switch_template", "template": "nope"},
                                           {"failure_class": "x", "action": "switch_template", "template": "bitmap_tiles"},
                                           {"failure_class": "oom", "action": "retry_params", "params": {"BLOCK_N": 16}}])
    failure = FailureReport(template="csr_rowsplit", status="compile_error", message="boom", log="L" * 50000)
    got = policy.diagnose(failure, BROKEN_KERNEL)
    assert got.action == "retry_source" and got.source == GOOD_KERNEL and fallback.asked == []
    human = model.calls[0][1].content
    assert "tl.reduce_sum" in human and len(human) < 30000  # the log tail is clipped
    assert "[sparseditto-role: debugger]" in model.calls[0][0].content
    assert policy.diagnose(failure, BROKEN_KERNEL).rationale == "fallback diagnosis"
    assert "does not define prepare() and spmm()" in policy.events[-1]["reason"]
    policy.plan(planning_input())  # the templates a diagnosis may switch to come from the last plan
    assert policy.diagnose(failure, BROKEN_KERNEL).rationale == "fallback diagnosis"
    assert "unknown template 'nope'" in policy.events[-1]["reason"]
    assert policy.diagnose(failure, BROKEN_KERNEL).template == "bitmap_tiles"
    assert "Templates you may switch to: bitmap_tiles, csr_rowsplit, dense" in model.calls[-1][1].content
    assert policy.diagnose(failure, BROKEN_KERNEL).params == {"BLOCK_N": 16}


# ---- usage -------------------------------------------------------------------------------------
def test_token_usage_is_accumulated_from_every_reply():
    usage = {"input_tokens": 100, "output_tokens": 20, "total_tokens": 120}
    policy, model, _ = policy_with([
        AIMessage(content=json.dumps(GOOD_PLAN), usage_metadata=usage),
        AIMessage(content="", tool_calls=[{"name": "triton_language_api", "args": {"query": "dot"}, "id": "a"}],
                  usage_metadata={"input_tokens": 50, "output_tokens": 5, "total_tokens": 55}),
        AIMessage(content=python_reply(GOOD_KERNEL), usage_metadata=usage),
    ])
    policy.plan(planning_input())
    policy.code(CandidateSpec(template="csr_rowsplit", origin="llm"), "src")
    assert policy.usage == TokenUsage(prompt_tokens=250, completion_tokens=45, total_tokens=295, calls=3)
    run = RunTokenUsage.of_calls(policy.calls)
    assert run.by_role["coder"] == TokenUsage(prompt_tokens=150, completion_tokens=25, total_tokens=175, calls=2)
    assert run.by_role["planner"].total_tokens == 120 and run.total_tokens == 295
    # the fake estimates usage when a script item carries none
    policy2, _, _ = policy_with([GOOD_PLAN])
    policy2.plan(planning_input())
    assert policy2.usage.calls == 1 and policy2.usage.prompt_tokens > 100


def test_token_usage_add_variants():
    u = TokenUsage()
    u.add({"prompt_tokens": 3, "completion_tokens": 4})
    u.add(AIMessage(content="x"))
    assert u == TokenUsage(prompt_tokens=3, completion_tokens=4, total_tokens=7, calls=2)


def test_events_and_calls_can_be_recorded_in_the_memory(tmp_path):
    policy, _, _ = policy_with([GOOD_PLAN, ConnectionError("down")])
    policy.plan(planning_input())
    policy.plan(planning_input())
    with Memory(tmp_path / "m.sqlite") as mem:
        run = mem.start_run(signature="s", versions={})
        for event in policy.events:
            mem.record_step(run, "planner", event["kind"], event)
        for call in policy.calls:
            mem.record_llm_call(run, "planner", call)
        stored = mem.get_run(run)
    assert [s["payload"]["event"] for s in stored["steps"]] == ["fallback"]
    assert [(c["idx"], c["outcome"], c["error_type"]) for c in stored["llm_calls"]] == [
        (0, "ok", None), (1, "error", "ConnectionError")]
    assert "down" in stored["llm_calls"][1]["fallback_reason"]


# ---- configuration -----------------------------------------------------------------------------
def test_resolve_llm(monkeypatch):
    monkeypatch.delenv("SPARSEDITTO_LLM_MODEL", raising=False)
    assert resolve_llm() is None and resolve_llm("expert") is None
    fake = ScriptedChatModel(responses=[])
    assert resolve_llm(fake) is fake
    monkeypatch.setenv("SPARSEDITTO_LLM_MODEL", "qwen2.5-coder:7b")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:11434/v1")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    model = resolve_llm()
    info = describe_llm(model)
    assert info["model"] == "qwen2.5-coder:7b" and info["base_url"] == "http://127.0.0.1:11434/v1"
    assert info["temperature"] == 0 and info["max_retries"] == 0   # the policy retries, within its bounds
    assert "not-needed" not in json.dumps(info)  # never the key
    with pytest.raises(ValueError, match="Expected a LangChain chat model, a model name or None"):
        resolve_llm(42)
    monkeypatch.setenv("SPARSEDITTO_LLM_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="SPARSEDITTO_LLM_TIMEOUT must be a number"):
        resolve_llm("m")
    with pytest.raises(ValueError, match="structured_output mode 'xml'"):
        LLMPolicy(fake, RecordingFallback(), structured_output="xml")


# ---- the scripted fakes ------------------------------------------------------------------------
def test_scripted_model_roles_repeat_and_exhaustion():
    from langchain_core.messages import HumanMessage, SystemMessage

    model = ScriptedChatModel(responses=["generic"], roles={"coder": ["c1", "c2"]}, repeat_last=False)
    coder = [SystemMessage(content="[sparseditto-role: coder]\nwrite"), HumanMessage(content="go")]
    assert model.invoke(coder).content == "c1"
    assert model.invoke("hello").content == "generic"
    assert model.invoke(coder).content == "c2"
    with pytest.raises(ScriptExhausted, match="no response left for role 'coder'"):
        model.invoke(coder)
    assert model.roles_called == ["coder", None, "coder", "coder"]

    repeating = ScriptedChatModel(responses=["again", ValueError], repeat_last=False)
    assert repeating.invoke("x").content == "again"
    with pytest.raises(ValueError, match="scripted ValueError"):
        repeating.invoke("x")
    sticky = ScriptedChatModel(responses=["same"], repeat_last=True)
    assert [sticky.invoke("x").content for _ in range(3)] == ["same"] * 3

    structured = ScriptedChatModel(responses=["not json", '{"action": "stop", "rationale": "r"}'])
    out = structured.with_structured_output(PlanDecision, include_raw=True).invoke("x")
    assert out["parsed"] is None and out["parsing_error"] is not None and out["raw"].content == "not json"
    assert structured.with_structured_output(PlanDecision).invoke("x").action == "stop"


def _run_source(source: str, matrix: SparseMatrix, n: int, tmp_path, name: str):
    """Import a candidate source from a real file (as the harness does) and run it on the CPU."""
    import torch

    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"cand_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    B = torch.randn(matrix.cols, n, generator=torch.Generator().manual_seed(1))
    out = torch.full((matrix.rows, n), float("nan"))
    module.spmm(module.prepare(matrix, "float32", "cpu"), B, out)
    return out.double().numpy(), matrix.to_dense() @ B.double().numpy()


@pytest.fixture(scope="module")
def small_matrix():
    keep = np.ones(24)
    keep[5] = 0  # an empty row must still be written
    m = sp.diags(keep) @ sp.random(24, 20, density=0.2, random_state=3, format="csr")
    m.eliminate_zeros()
    return SparseMatrix.from_scipy(m, name="small")


def test_scripted_kernels_behave_as_advertised(small_matrix, tmp_path):
    got, ref = _run_source(GOOD_KERNEL, small_matrix, 5, tmp_path, "good")
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    got, ref = _run_source(WRONG_KERNEL, small_matrix, 5, tmp_path, "wrong")
    assert not np.isnan(got).any() and np.abs(got - ref).max() > 1e-2
    with pytest.raises(Exception, match="reduce_sum"):
        _run_source(BROKEN_KERNEL, small_matrix, 5, tmp_path, "broken")
    assert "torch.mm(" in CHEATING_KERNEL


def test_scripted_kernels_against_the_static_checks():
    checks = pytest.importorskip("sparseditto.harness.static_checks")
    assert checks.check_source(GOOD_KERNEL).ok
    assert checks.check_source(WRONG_KERNEL).ok and checks.check_source(BROKEN_KERNEL).ok
    rejected = checks.check_source(CHEATING_KERNEL)
    assert not rejected.ok and any("mm" in v for v in rejected.violations)


def test_scenario_models_through_the_policy():
    inp = planning_input()
    spec = CandidateSpec(template="csr_rowsplit", origin="llm")

    good = LLMPolicy(good_kernel_model(), RecordingFallback())
    plan = good.plan(inp)
    assert plan.candidates[0].template == "csr_rowsplit" and plan.candidates[0].origin == "llm"
    assert good.code(spec, "src").source == GOOD_KERNEL
    assert good.plan(inp).action == "stop"

    fixing = LLMPolicy(fix_after_error_model(), RecordingFallback())
    assert fixing.code(spec, "src").source == BROKEN_KERNEL
    failure = FailureReport(template="csr_rowsplit", status="compile_error",
                            message="AttributeError: module 'triton.language' has no attribute 'reduce_sum'")
    diag = fixing.diagnose(failure, BROKEN_KERNEL)
    assert diag.action == "retry_source" and diag.source == GOOD_KERNEL
    assert fixing.code(spec, "src", feedback=failure.message).source == GOOD_KERNEL

    assert LLMPolicy(wrong_result_model(), RecordingFallback()).code(spec, "src").source == WRONG_KERNEL
    cheat = LLMPolicy(cheating_model(), RecordingFallback())
    assert cheat.code(spec, "src").source == CHEATING_KERNEL
    assert cheat.diagnose(FailureReport(template="t", status="static_rejected"), CHEATING_KERNEL).action == "give_up"
    for policy in (good, fixing, cheat):
        assert not [e for e in policy.events if e["event"] == "fallback"]


def test_coder_can_verify_its_draft_through_the_harness(small_matrix):
    """The model calls verify_kernel on a broken draft, reads the error, verifies the fix."""
    pytest.importorskip("sparseditto.harness.verify")
    model = ScriptedChatModel(responses=[
        tool_call_message("verify_kernel", source=BROKEN_KERNEL),
        tool_call_message("verify_kernel", source=GOOD_KERNEL),
        tool_call_message("compile_kernel", source=CHEATING_KERNEL),
        python_reply(GOOD_KERNEL, "Fixed the call to tl.reduce_sum."),
    ])
    policy = LLMPolicy(model, RecordingFallback())
    policy.set_context(matrix=small_matrix, dtype="float16", backend="interpret", n_values=[1, 7])
    assert policy.code(CandidateSpec(template="csr_rowsplit", origin="llm"), "src").source == GOOD_KERNEL
    broken, good, cheat = [json.loads(m.content) for m in model.calls[-1] if isinstance(m, ToolMessage)]
    assert not broken["ok"] and "reduce_sum" in broken["message"]
    assert good["ok"] and good["status"] == "verified" and {c["n"] for c in good["checks"]} >= {1, 7}
    assert not cheat["ok"] and cheat["stage"] == "static_check" and "torch.mm" in " ".join(cheat["violations"])
    with pytest.raises(ValueError, match="Unknown ToolContext field"):
        policy.set_context(colour="red")


def test_scripted_planner_reads_the_templates_from_the_prompt():
    listed = [dict(TEMPLATES[1]), {"name": "csr_balanced", "estimate_ms": 0.02}, TEMPLATES[2]]
    policy = LLMPolicy(good_kernel_model(), RecordingFallback())
    assert policy.plan(planning_input(templates=listed)).candidates[0].template == "bitmap_tiles"
    policy = LLMPolicy(good_kernel_model(), RecordingFallback())
    assert policy.plan(planning_input()).candidates[0].template == "csr_rowsplit"  # preferred when listed
