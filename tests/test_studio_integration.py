"""LangGraph Studio's server really serves the graph: `langgraph dev` + langgraph_sdk, end to end.

Starts the real development server from the repository root (langgraph.json) on a free port, reads
the schemas Studio draws its forms from (the run context with a description for every field and
dropdown choices, no internal objects), runs the `sparseditto` graph on a small matrix file through
the SDK with stream_mode updates + custom, and checks that every agent node streamed its update;
a run whose context names a model talks to a scripted OpenAI-compatible server on the loopback
and shows its LLM calls and token usage in the state. The server is always stopped.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import scipy.io

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from langgraph_server import LANGGRAPH, langgraph_dev  # noqa: E402  (the same server the screenshot uses)


PLAN_LLM = {"action": "try", "rationale": "adapt the CSR template",
            "candidates": [{"template": "csr_rowsplit", "params": {}, "origin": "llm", "rationale": "LLM kernel"}]}
STOP = {"action": "stop", "candidates": [], "rationale": "scripted: enough"}


@pytest.fixture(scope="module")
def llm_server():
    """The scripted OpenAI-compatible server a run of the Studio server may talk to (context llm)."""
    from openai_server import ScriptedOpenAIServer

    from sparseditto.testing_llm import GOOD_KERNEL, python_reply

    with ScriptedOpenAIServer(roles={"planner": [PLAN_LLM, STOP], "coder": [python_reply(GOOD_KERNEL)]}) as srv:
        yield srv


@pytest.fixture(scope="module")
def server(tmp_path_factory, llm_server):
    """One `langgraph dev` for the module's runs (starting it is most of a test's time)."""
    tmp_path = tmp_path_factory.mktemp("studio")
    if not LANGGRAPH.exists():
        pytest.skip(f"langgraph CLI not installed at {LANGGRAPH} (pip install -e '.[dev]')")
    env = dict(os.environ, SPARSEDITTO_CACHE_DIR=str(tmp_path / "cache"),
               SPARSEDITTO_MEMORY=str(tmp_path / "memory.sqlite"), OPENAI_BASE_URL=llm_server.base_url,
               OPENAI_API_KEY="sk-test-not-a-key", NO_PROXY="127.0.0.1,localhost", SPARSEDITTO_LLM_TIMEOUT="20")
    for name in ("SPARSEDITTO_LLM_MODEL", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        env.pop(name, None)
    with langgraph_dev(env, tmp_path / "server.log") as url:
        yield url


def test_langgraph_dev_streams_every_agent(server, tmp_path):
    from langgraph_sdk import get_sync_client

    from sparseditto import generate

    A = generate.unstructured(64, 64, 0.8, dtype="float16", seed=5)
    path = tmp_path / "weight.mtx"
    scipy.io.mmwrite(str(path), A.to_scipy())

    client = get_sync_client(url=server)
    assert "sparseditto" in {a["graph_id"] for a in client.assistants.search()}
    thread = client.threads.create()
    updated, messages = [], []
    for part in client.runs.stream(thread["thread_id"], "sparseditto",
                                   input={"matrix_path": str(path), "n": 1, "backend": "interpret", "budget": 2},
                                   stream_mode=["updates", "custom"]):
        if part.event == "updates":
            updated.extend(part.data.keys())
        elif part.event == "custom":
            messages.append(part.data)
        elif part.event == "error":
            pytest.fail(f"run failed in the server: {part.data}")
    assert {"load_input", "planner", "analyzer", "coder", "debugger", "profiler", "finalize"} <= set(updated)
    assert updated[0] == "load_input" and updated[-1] == "finalize"
    assert {m["node"] for m in messages} >= {"analyzer", "debugger", "profiler"}
    state = client.threads.get_state(thread["thread_id"])["values"]
    assert state["done"] and state["report"]["pattern"] == "unstructured"
    assert any(c["status"] == "verified" for c in state["candidates"])
    assert not state.get("llm_calls")   # the expert made no LLM call


def test_studio_run_with_an_llm_shows_its_calls_in_the_state(server, llm_server, tmp_path):
    """A run whose context names a model (what Studio's configuration panel sets): the LLM policy
    talks to the scripted OpenAI-compatible server, and the thread's state carries every request
    (role, tokens, latency, outcome; the text is in the memory) and the per-role token usage."""
    from langgraph_sdk import get_sync_client

    from sparseditto import generate

    A = generate.unstructured(48, 48, 0.8, dtype="float16", seed=5)
    path = tmp_path / "weight.mtx"
    scipy.io.mmwrite(str(path), A.to_scipy())
    client = get_sync_client(url=server)
    thread = client.threads.create()
    for part in client.runs.stream(thread["thread_id"], "sparseditto", context={"llm": "scripted-gpt"},
                                   input={"matrix_path": str(path), "n": 1, "backend": "interpret", "budget": 1},
                                   stream_mode=["updates"]):
        if part.event == "error":
            pytest.fail(f"run failed in the server: {part.data}")
    state = client.threads.get_state(thread["thread_id"])["values"]
    assert [c["role"] for c in state["llm_calls"]] == llm_server.roles_called() == ["planner", "coder"]
    assert all(c["outcome"] == "ok" and c["prompt_tokens"] > 0 and "prompt" not in c for c in state["llm_calls"])
    assert set(state["token_usage"]["by_role"]) == {"planner", "coder"}
    first = state["candidates"][0]
    assert (first["origin"], first["status"]) == ("llm", "verified")


def test_studio_reads_the_context_schema_with_descriptions(server):
    """What Studio shows under "Manage Assistants" -> context, and in the input form."""
    from langgraph_sdk import get_sync_client

    from sparseditto.agents.state import Context

    client = get_sync_client(url=server)
    assistant = next(a for a in client.assistants.search() if a["graph_id"] == "sparseditto")
    schemas = client.assistants.get_schemas(assistant["assistant_id"])
    context = schemas["context_schema"]["properties"]
    fields = {f.name: f for f in Context.__dataclass_fields__.values()}
    assert set(context) == set(fields)                      # every setting, nothing else
    assert not {"policy", "memory", "hooks", "chat_model"} & set(context)
    for name, prop in context.items():
        assert prop.get("description") == fields[name].metadata["description"], name
    assert context["dtype"]["enum"] == ["float16", "bfloat16", "float32"]
    assert context["backend"]["enum"] == ["auto", "cuda", "interpret"]
    assert context["ncu"]["enum"] == ["all", "best", "off"]
    assert context["target"]["default"] == "A100"
    form = schemas["input_schema"]["properties"]
    assert {"matrix_path", "tensor", "target", "n", "dtype", "backend", "budget"} <= set(form)
    assert all(form[k].get("description") for k in form)
    assert form["dtype"]["enum"] == ["float16", "bfloat16", "float32"]
