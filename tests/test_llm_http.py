"""The LLM path users take, for real: `run_graph(..., llm="model name")` builds ChatOpenAI, which
talks HTTP to an OpenAI-compatible server (here our scripted one on the loopback, tests/
openai_server.py) through planner, coder (with tool rounds) and debugger.

Each scenario is one a real server produces, and ends as the LLM policy documents it: a good
kernel is verified; a kernel that does not compile is fixed from the compiler's error; a cheat is
refused; HTTP 429 is retried after its Retry-After (and a Retry-After beyond the bound is not
waited for); HTTP 500, a reply slower than the timeout, malformed JSON (in the answer or the HTTP
body) fall back to the expert with an event; a context-length error is retried once with a
smaller prompt; a server without JSON-schema support gets JSON in the text. Every request is in
the transcript (memory, `sparseditto memory show RUN --llm`, `Result.llm_calls`), with tokens per
role, and the run's LLM budget hands the remaining steps to the expert.

Everything is bounded in time (small timeouts, short Retry-After values, small matrices).
"""
from __future__ import annotations

import json
import re

import pytest

from openai_server import (Reply, ScriptedOpenAIServer, context_length_error, message_text, rate_limited,
                           server_error, tool_call)
from sparseditto import generate
from sparseditto.api import run_graph
from sparseditto.cli import main as cli_main
from sparseditto.memory import Memory
from sparseditto.testing_kernels import (BROKEN_KERNEL, CHEATING_KERNEL, CUDA_KERNEL, ELL_KERNEL, ELL_KERNEL_COMPACT,
                                         GOOD_KERNEL)
from sparseditto.testing_llm import python_reply

pytestmark = [pytest.mark.timeout(180), pytest.mark.filterwarnings("ignore::UserWarning")]

MODEL = "scripted-gpt"
PLAN_LLM = {"action": "try", "rationale": "adapt the CSR template",
            "candidates": [{"template": "csr_rowsplit", "params": {}, "origin": "llm",
                            "rationale": "an LLM-written CSR kernel"}]}
STOP = {"action": "stop", "candidates": [], "rationale": "scripted: enough"}
GIVE_UP = {"failure_class": "unknown", "action": "give_up", "rationale": "scripted: give up"}


@pytest.fixture
def matrix():
    return generate.unstructured(48, 48, 0.8, dtype="float16", seed=11)


@pytest.fixture
def http(tmp_path, monkeypatch):
    """``http(roles, A, **run_graph kwargs) -> (result, server)``: one run against a fresh server."""
    monkeypatch.setenv("SPARSEDITTO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-key")
    monkeypatch.setenv("SPARSEDITTO_LLM_TIMEOUT", "20")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    for name in ("SPARSEDITTO_LLM_MODEL", "SPARSEDITTO_LLM_STRUCTURED", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
                 "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)

    def go(roles, A, *, server_options=None, llm=MODEL, **kw):
        srv = ScriptedOpenAIServer(roles=roles, **(server_options or {})).start()
        try:
            monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
            model = llm(srv) if callable(llm) else llm
            result = run_graph(A, target=kw.pop("target", "A100"), n=kw.pop("n", 1),
                               backend=kw.pop("backend", "interpret"), budget=kw.pop("budget", 1), llm=model,
                               memory=go.memory_path, checkpoint=tmp_path / "checkpoints.sqlite", **kw)
        finally:
            srv.stop()
        assert not srv.errors, srv.errors   # every request found its scripted answer
        return result, srv

    go.memory_path = tmp_path / "memory.sqlite"
    go.monkeypatch = monkeypatch
    return go


def transcript_text(memory_path, run_id: str, capsys) -> str:
    """What `sparseditto memory show RUN --llm` prints."""
    capsys.readouterr()
    assert cli_main(["memory", "show", run_id, "--llm", "--memory", str(memory_path)]) == 0
    return capsys.readouterr().out


def fallbacks(result) -> list[dict]:
    return [e for e in result.events if e.get("event") == "fallback"]


# ---- the agents over HTTP ----------------------------------------------------------------------
@pytest.mark.slow
def test_good_kernel_through_planner_and_coder_with_tool_rounds(http, matrix, capsys):
    roles = {"planner": [PLAN_LLM, STOP],
             "coder": [tool_call("triton_language_api", query="sum"),
                       tool_call("compile_kernel", source=GOOD_KERNEL),
                       python_reply(GOOD_KERNEL, "A row-wise CSR kernel; tl.sum exists and the draft compiles.")]}
    result, srv = http(roles, matrix, budget=2, llm_price=(2.0, 8.0))
    first = result.candidates[0]
    assert (first.origin, first.status, first.source) == ("llm", "verified", GOOD_KERNEL)
    assert srv.roles_called() == ["planner", "coder", "coder", "coder", "planner"]

    plan_req, coder_reqs = srv.requests_of("planner")[0], srv.requests_of("coder")
    assert plan_req["model"] == MODEL and plan_req["response_format"]["type"] == "json_schema"
    assert plan_req["response_format"]["json_schema"]["name"] == "PlanDecision"
    assert {t["function"]["name"] for t in coder_reqs[0]["tools"]} == {
        "triton_language_api", "describe_template", "instantiate_template", "past_kernels", "compile_kernel",
        "verify_kernel"}
    # the tool results went back as tool messages answering the server's tool-call ids
    tool_msgs = [m for m in coder_reqs[1]["messages"] if m["role"] == "tool"]
    assistant = [m for m in coder_reqs[1]["messages"] if m["role"] == "assistant"][0]
    assert tool_msgs[0]["tool_call_id"] == assistant["tool_calls"][0]["id"] and "tl.sum" in tool_msgs[0]["content"]
    compiled = [m for m in coder_reqs[2]["messages"] if m["role"] == "tool"][-1]["content"]
    assert json.loads(compiled)["ok"] is True   # compile_kernel ran the draft through the harness

    # transcript and usage: one record per request, tokens as the server reported them, per role
    assert [c.role for c in result.llm_calls] == srv.roles_called()
    assert [c.round for c in result.llm_calls if c.role == "coder"] == [0, 1, 2]
    usage = result.token_usage
    for role in ("planner", "coder"):
        served = [r["usage"] for r in srv.requests if r["role"] == role]
        assert usage.by_role[role].prompt_tokens == sum(u["prompt_tokens"] for u in served)
        assert usage.by_role[role].completion_tokens == sum(u["completion_tokens"] for u in served)
    assert usage.total_tokens == sum(r["usage"]["total_tokens"] for r in srv.requests)
    served = [r["usage"] for r in srv.requests]
    assert usage.cost_usd == pytest.approx(sum(u["prompt_tokens"] * 2.0 + u["completion_tokens"] * 8.0
                                               for u in served) / 1e6)   # priced with llm_price
    assert "llm: 5 request(s)" in result.summary()

    text = transcript_text(http.memory_path, result.run_id, capsys)
    assert "5 request(s)" in text and "coder round 2" in text and "--- tool triton_language_api" in text
    assert "CSR SpMM written by the scripted LLM" in text        # the answer, in full
    assert "## Applicable templates" in text                      # the planner's prompt, in full
    assert re.search(r"coder: 3 request\(s\), \d+ \+ \d+ tokens", text)


def test_kernel_that_does_not_compile_is_fixed_from_the_compiler_error(http, matrix):
    def debugger(body):
        prompt = message_text(body)
        assert "reduce_sum" in prompt and "## Failure report" in prompt
        return {"failure_class": "compile_error", "action": "retry_source", "source": GOOD_KERNEL,
                "rationale": "tl.reduce_sum does not exist in triton.language; tl.sum reduces along an axis"}

    roles = {"planner": [PLAN_LLM, STOP], "coder": [python_reply(BROKEN_KERNEL)], "debugger": [debugger]}
    result, srv = http(roles, matrix, budget=1)
    generated = [c for c in result.candidates if c.origin != "vendor"]
    broken, fixed = generated[0], generated[-1]
    assert broken.status != "verified" and "reduce_sum" in broken.message + broken.source
    assert (fixed.status, fixed.attempt, fixed.source) == ("verified", 2, GOOD_KERNEL)
    assert srv.roles_called().count("debugger") == 1
    assert any(d["node"] == "debugger" and d["action"] == "retry_source" for d in result.decisions)
    assert not fallbacks(result)


def test_cheating_kernel_is_refused_with_a_streaming_model(http, matrix):
    from langchain_openai import ChatOpenAI

    def streaming_model(srv):
        return ChatOpenAI(model=MODEL, base_url=srv.base_url, api_key="sk-test", timeout=20, max_retries=0,
                          streaming=True, stream_usage=True, temperature=0)

    roles = {"planner": [PLAN_LLM, STOP], "coder": [python_reply(CHEATING_KERNEL, "Use the fastest matmul.")],
             "debugger": [{"failure_class": "cheating", "action": "give_up", "rationale": "it calls torch.mm"}]}
    result, srv = http(roles, matrix, llm=streaming_model)
    cheat = result.candidates[0]
    assert cheat.status == "static_rejected" and "torch.mm" in cheat.source
    assert result.best.template == "dense" and not any(c.status == "verified" for c in result.candidates
                                                       if c.origin != "vendor")
    assert all(r["body"].get("stream") in (True, None) for r in srv.requests)
    assert srv.requests_of("coder")[0]["stream"] is True             # the coder's call streamed
    assert all(c.total_tokens > 0 for c in result.llm_calls)         # usage arrived in the stream


@pytest.mark.parametrize("transient, status, wait_s, error_type", [
    (rate_limited(0.3), 429, 0.3, "OpenAIRateLimitError"),     # waits what Retry-After says
    (server_error(), 500, 0.5, "OpenAIAPIError"),             # waits the back-off
])
def test_transient_errors_are_retried_within_the_bound(http, matrix, transient, status, wait_s, error_type):
    result, srv = http({"planner": [transient, STOP]}, matrix)
    t = [r["t"] for r in srv.requests]
    assert [r["status"] for r in srv.requests] == [status, 200] and t[1] - t[0] >= wait_s
    [call] = result.llm_calls
    assert (call.outcome, call.attempts) == ("ok", 2) and call.retries[0]["wait_s"] == wait_s
    assert call.retries[0]["error_type"] == error_type and call.retries[0]["status"] == status
    assert not fallbacks(result) and result.stop_reason == STOP["rationale"]
    assert call.latency_s >= wait_s   # the wait is part of the call's latency


@pytest.mark.parametrize("scenario, answers, error_type, reason", [
    ("HTTP 500 three times", [server_error()] * 3, "OpenAIAPIError", "Error code: 500"),
    ("Retry-After beyond the bound", [rate_limited(3600)], "OpenAIRateLimitError", "beyond the 20 s bound"),
    ("slower than the timeout", [Reply(content=json.dumps(STOP), delay_s=4.0)], "OpenAITimeoutError", "timed out"),
    ("malformed JSON answer", ['{"action": "try", "candidates": [{"template": "csr_rowsplit", '],
     "ValidationError", "Invalid JSON"),
    ("malformed HTTP body", [Reply(raw_body=b'{"id": "chatcmpl-1", "choices": [{"message": ')],
     "JSONDecodeError", "Expecting value"),
])
def test_failing_server_falls_back_to_the_expert(http, matrix, scenario, answers, error_type, reason):
    http.monkeypatch.setenv("SPARSEDITTO_LLM_TIMEOUT", "1.5")
    result, srv = http({"planner": answers}, matrix)
    [event] = fallbacks(result)
    assert event["decision"] == "plan" and re.fullmatch(error_type, event["error_type"]), event
    assert reason in event["reason"]
    call = result.llm_calls[0]
    assert call.fallback_reason == event["reason"]
    assert len(srv.requests) == (3 if "500" in scenario else 1)      # only server errors are retried
    assert call.attempts == len(srv.requests) and len(call.retries) == len(srv.requests) - 1
    if "timeout" in scenario:
        assert call.latency_s < 3.5                                   # the timeout bounded the wait
    # the expert answered the step: its template candidate was verified
    generated = [c for c in result.candidates if c.origin != "vendor"]
    assert generated and all(c.origin == "template" for c in generated)
    assert any(c.status == "verified" for c in result.candidates)


def test_context_length_error_is_retried_once_with_a_smaller_prompt(http, matrix):
    result, srv = http({"planner": [context_length_error(1000, 4000), STOP]}, matrix)
    first, second = (message_text(b) for b in srv.requests_of("planner"))
    assert len(second) < 0.75 * len(first)
    [shrunk] = [e for e in result.events if e["event"] == "prompt_shrunk"]
    assert shrunk["factor"] == pytest.approx(0.2) and "maximum context length" in shrunk["reason"]
    assert [c.outcome for c in result.llm_calls] == ["error", "ok"] and not fallbacks(result)
    assert result.stop_reason == STOP["rationale"]


def test_server_without_json_schema_gets_json_in_the_text(http, matrix):
    result, srv = http({"planner": [STOP]}, matrix, server_options={"json_schema": False})
    refused, answered = srv.requests
    assert refused["status"] == 400 and refused["body"]["response_format"]["type"] == "json_schema"
    assert "response_format" not in answered["body"] and "JSON schema of the answer" in message_text(answered["body"])
    assert [e["event"] for e in result.events] == ["structured_output_switch"]
    assert result.stop_reason == STOP["rationale"]


# ---- budgets -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_llm_token_budget_hands_the_remaining_steps_to_the_expert(http, matrix):
    roles = {"planner": [PLAN_LLM], "coder": [python_reply(GOOD_KERNEL)]}
    # the planner's request (~1.9k tokens) fits; the coder's (it carries a whole template source,
    # ~5k tokens) would pass the budget, so it is not made (the cost budget works the same way:
    # tests/test_llm_transport.py)
    result, srv = http(roles, matrix, max_llm_tokens=4500)
    assert srv.roles_called() == ["planner"]
    [reached] = [e for e in result.events if e["event"] == "llm_budget_reached"]
    assert reached["decision"] == "code" and "token budget" in reached["reason"]
    assert fallbacks(result)[0]["error_type"] == "BudgetReached"
    assert result.candidates[0].origin == "template" and result.candidates[0].status == "verified"
    assert 0 < result.token_usage.total_tokens <= 4500


def test_budget_settings_are_checked_before_any_work(matrix, capsys):
    from sparseditto.cli.commands import EXAMPLE_DIR

    example = str(EXAMPLE_DIR / "pruned_2of4_256x256.mtx.gz")
    assert cli_main(["run", example, "--backend", "interpret", "--max-llm-cost", "1", "--quiet"]) == 2
    assert "max_llm_cost needs llm_price" in capsys.readouterr().err
    assert cli_main(["run", example, "--backend", "interpret", "--llm-price", "2,x", "--quiet"]) == 2
    assert "llm_price must be two numbers" in capsys.readouterr().err
    with pytest.raises(ValueError, match="max_llm_cost needs llm_price"):
        run_graph(matrix, backend="interpret", llm=MODEL, max_llm_cost=1.0)
    with pytest.raises(ValueError, match="max_llm_tokens to be a positive number"):
        run_graph(matrix, backend="interpret", llm=MODEL, max_llm_tokens=0)
    with pytest.raises(ValueError, match="llm_price must be two"):
        run_graph(matrix, backend="interpret", llm=MODEL, llm_price=(1.0,))


# ---- LLM-written CUDA C++ ----------------------------------------------------------------------
def test_cuda_candidate_is_routed_as_cuda_and_refused_by_the_interpreter(http, matrix):
    roles = {"planner": [PLAN_LLM, STOP], "coder": [python_reply(CUDA_KERNEL, "A thread per element, in CUDA C++.")]}
    result, srv = http(roles, matrix)
    cand = result.candidates[0]
    assert (cand.origin, cand.backend, cand.source) == ("llm", "cuda", CUDA_KERNEL)
    assert (cand.status, cand.failure_class) == ("compile_error", "backend_unavailable")   # static checks passed
    assert "debugger" not in srv.roles_called()   # a fact of the machine: the model is not asked
    coder_prompt = message_text(srv.requests_of("coder")[0])
    assert "backend 'interpret'" in coder_prompt and "CUDA C++ (CuPy) candidate cannot run here" in coder_prompt


def test_cuda_candidate_is_accepted_by_the_sandboxed_worker(pool, matrix):
    """The sandboxed worker (audit hook, allow-listed imports) imports the CUDA candidate and runs
    its prepare() on the CPU (CuPy absent: the module's guarded import); only its launch needs a GPU."""
    from sparseditto.harness import check_source
    from sparseditto.harness.candidate_spec import as_spec

    assert check_source(CUDA_KERNEL).ok
    spec = as_spec(CUDA_KERNEL)
    assert spec.backend == "cuda"
    reply = pool.call("compile", {"spec": spec, "matrix": matrix, "dtype": "float16", "backend": "interpret"},
                      backend="interpret", timeout=120)
    assert reply.status == "ok", reply.error
    value = reply.value
    assert "import: ok" in value["log"] and "prepare on (48, 48)" in value["log"], value["log"]
    assert not value["ok"] and "runs on a CUDA device" in value["log"]   # the launch, not the sandbox, says no
    assert value["failure_class"] not in ("refused", "static_violation")


@pytest.mark.gpu
def test_cuda_candidate_written_by_the_llm_is_verified_and_profiled_on_the_gpu(http):
    """On a GPU (the H200): the coder sees the CUDA template csr_vector as the example and answers a
    CUDA C++ kernel through CuPy; it is verified and benchmarked like any candidate."""
    A = generate.unstructured(1024, 1024, 0.9, dtype="float16", seed=3)
    plan = {"action": "try", "rationale": "CUDA C++",
            "candidates": [{"template": "csr_vector", "params": {}, "origin": "llm", "rationale": "adapt csr_vector"}]}
    roles = {"planner": [plan, STOP], "coder": [python_reply(CUDA_KERNEL, "A thread per element of C.")],
             "debugger": [GIVE_UP]}
    result, srv = http(roles, A, n=16, target="auto", backend="cuda")
    cand = result.candidates[0]
    assert (cand.origin, cand.backend, cand.status) == ("llm", "cuda", "verified"), cand.message
    assert cand.median_ms > 0 and cand.a_bytes_measured and cand.timings_are_gpu
    coder_prompt = message_text(srv.requests_of("coder")[0])
    assert "CUDA C++ candidate (CuPy RawModule)" in coder_prompt and "csr_vector" in coder_prompt


# ---- the LLM improves a kernel from the profiler's feedback -------------------------------------
_BYTES_PER_NNZ = re.compile(r"= ([0-9.]+) bytes per nonzero")


def improving_planner(body):
    """Try an LLM kernel; once one is measured, read its bytes per nonzero from the profile and ask
    for a version that packs A in fewer bytes; stop after two."""
    prompt = message_text(body)
    verified = len(re.findall(r"^\d+\. .* -> verified", prompt, re.MULTILINE))   # the "tried so far" lines
    if verified >= 2:
        return STOP
    if verified == 0:
        return PLAN_LLM
    per_nnz = float(_BYTES_PER_NNZ.search(prompt).group(1))
    return {"action": "try", "rationale": f"the best kernel reads {per_nnz:.1f} bytes per nonzero of A; halve it",
            "candidates": [{"template": "csr_rowsplit", "params": {}, "origin": "llm",
                            "rationale": "values in the run's dtype and 16-bit column ids"}]}


def improving_coder(body):
    prompt = message_text(body)
    if "(origin llm)" in prompt and "bytes per nonzero" in prompt:
        assert "fp32 values, int32 ids" in prompt                      # it sees the best kernel's source
        return python_reply(ELL_KERNEL_COMPACT, "Same ELL kernel; A packed in the run's dtype with int16 ids.")
    return python_reply(ELL_KERNEL, "An ELL kernel: rows padded to the longest one.")


@pytest.mark.slow
def test_llm_improves_its_kernel_from_the_profile(http, capsys):
    # sparse enough that the ELL kernel beats dense in the CPU cost model (the csr_rowsplit template it
    # adapts carries a measured per-nonzero floor, scaled by the bytes the kernel packs)
    A = generate.unstructured(1024, 1024, 0.97, dtype="float16", seed=3)
    result, srv = http({"planner": [improving_planner], "coder": [improving_coder]}, A, budget=3)
    v1, v2 = [c for c in result.candidates if c.origin != "vendor"]
    assert (v1.status, v2.status) == ("verified", "verified") and (v1.source, v2.source) == (ELL_KERNEL,
                                                                                             ELL_KERNEL_COMPACT)
    assert v1.a_bytes_measured and v2.a_bytes == pytest.approx(v1.a_bytes / 2)
    assert v2.expected_ms < v1.expected_ms                      # faster by the interpreter's cost model
    assert result.best.source == ELL_KERNEL_COMPACT and result.best.selection == "cost_model"
    assert srv.roles_called() == ["planner", "coder", "planner", "coder", "planner"]
    plan2 = message_text(srv.requests_of("planner")[1])
    assert "## Current best kernel" in plan2 and "measured from prepare()" in plan2
    coder2 = message_text(srv.requests_of("coder")[1])
    assert "## Source to adapt (the current best kernel" in coder2 and "BLOCK_NNZ" not in coder2   # one source
    text = transcript_text(http.memory_path, result.run_id, capsys)
    assert text.count("coder [coder]") == 2 and "halve it" in text and "int16 ids" in text
    with Memory(http.memory_path) as mem:          # the run left a lesson for similar patterns
        lesson = mem.lessons(result.report["pattern"])[0]["text"]
    assert "csr_rowsplit" in lesson and "(llm)" in lesson
    # prompt sizes per role stay bounded (tokens as the server counted them)
    sizes = {role: [c.prompt_tokens for c in result.llm_calls if c.role == role] for role in ("planner", "coder")}
    print("prompt tokens per role:", sizes)
    assert max(sizes["planner"]) < 4000 and max(sizes["coder"]) < 8000, sizes
    # the next run on a similar pattern reads that lesson in its planner prompt
    other = generate.unstructured(64, 64, 0.85, dtype="float16", seed=8)
    _, srv2 = http({"planner": [STOP]}, other)
    assert "## Lessons from the memory" in message_text(srv2.requests[0]["body"]) and lesson[:40] in \
        message_text(srv2.requests[0]["body"])
