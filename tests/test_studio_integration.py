"""LangGraph Studio's server really serves the graph: `langgraph dev` + langgraph_sdk, end to end.

Starts the real development server from the repository root (langgraph.json) on a free port, reads
the schemas Studio draws its forms from (the run context with a description for every field and
dropdown choices, no internal objects), runs the `sparseditto` graph on a small matrix file through
the SDK with stream_mode updates + custom, and checks that every agent node streamed its update.
The server is always stopped.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import scipy.io

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
LANGGRAPH = Path(sys.executable).parent / "langgraph"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ok(url: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"langgraph dev exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/ok", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"langgraph dev did not answer {url}/ok within {timeout:.0f} s")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("studio")
    if not LANGGRAPH.exists():
        pytest.skip(f"langgraph CLI not installed at {LANGGRAPH} (pip install -e '.[dev]')")
    port = free_port()
    env = dict(os.environ, LANGGRAPH_CLI_NO_ANALYTICS="1", LANGSMITH_TRACING="false", LANGCHAIN_TRACING_V2="false",
               SPARSEDITTO_CACHE_DIR=str(tmp_path / "cache"), SPARSEDITTO_MEMORY=str(tmp_path / "memory.sqlite"))
    env.pop("SPARSEDITTO_LLM_MODEL", None)
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen([str(LANGGRAPH), "dev", "--no-browser", "--no-reload", "--port", str(port)],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ok(url, proc)
        yield url
    except Exception:
        log.flush()
        print((tmp_path / "server.log").read_text()[-4000:])
        raise
    finally:
        # The server runs in its own session: stop it and the kernel workers it spawned, by group.
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        log.close()


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
