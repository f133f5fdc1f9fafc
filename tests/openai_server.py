"""A small OpenAI-compatible chat completions server on the loopback, scripted per test.

Why our own: the LLM path users take is ``ChatOpenAI`` talking HTTP to OpenAI, vLLM, Ollama or a
proxy. An in-process fake chat model skips everything that breaks in practice (the request shape
the openai client sends for tools and structured output, the wire format of tool calls and
streamed chunks, status codes, Retry-After, timeouts, token usage). This server speaks that wire
format on ``127.0.0.1`` (an ephemeral port, nothing leaves the machine):

* ``POST /v1/chat/completions`` with ``messages``, ``tools`` (answers with ``tool_calls``),
  ``response_format`` (``json_schema`` / ``json_object``; with ``json_schema=False`` the server
  refuses them with HTTP 400, like local servers that need the plain-JSON fallback), ``usage`` in
  every answer, and ``stream: true`` as server-sent events (content and tool-call deltas, the
  finish chunk, a usage chunk when ``stream_options.include_usage``, ``[DONE]``);
* ``GET /v1/models``.

The script: one list per role (``roles={"planner": [...], "coder": [...], "debugger": [...]}``,
the role read from the ``[sparseditto-role: NAME]`` marker of the system prompt) and/or one list
for everything (``responses=[...]``). Each request takes the next item of its list; with
``repeat_last`` (the default) a list that runs out keeps answering with its last item. Items:

* ``str``: the assistant's text; ``dict``: a JSON answer (sent as the text, as servers do);
* :class:`Reply`: full control (text, tool calls, status code and error body, headers, a delay,
  a raw body that is not JSON, usage);
* a callable ``f(request_body) -> item``: looks at the request (e.g. "fix the kernel once the
  error is in the prompt").

Every request is kept in ``server.requests`` (its body, role, arrival time, the status answered
and the usage reported), so tests can assert what the client really sent and what it was told.
"""
from __future__ import annotations

import json
import math
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sparseditto.testing_llm import RoleScript, ScriptExhausted

ROLE_RE = re.compile(r"\[sparseditto-role: (\w+)\]")
CHUNK_CHARS = 48   # streamed text is cut into pieces of this many characters


@dataclass
class Reply:
    """One scripted answer. ``status`` != 200 sends an OpenAI-style error body (``error`` is its
    message, ``code`` / ``error_type`` its fields) unless ``raw_body`` is given."""

    content: str | None = None
    tool_calls: list[tuple[str, dict]] = field(default_factory=list)   # (tool name, arguments)
    status: int = 200
    error: str = ""
    code: str | None = None
    error_type: str = "invalid_request_error"
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0             # wait this long before answering (a slow server)
    raw_body: bytes | None = None    # sent as is (e.g. malformed JSON)
    usage: dict | None = None        # default: about 4 characters per token


def json_reply(obj: Any) -> Reply:
    return Reply(content=json.dumps(obj))


def tool_call(tool: str, **args: Any) -> Reply:
    """An assistant turn calling one tool."""
    return Reply(tool_calls=[(tool, args)])


def rate_limited(retry_after_s: float) -> Reply:
    return Reply(status=429, error="Rate limit reached for requests. Please try again later.",
                 code="rate_limit_exceeded", error_type="requests",
                 headers={"retry-after": f"{retry_after_s:g}"})


def server_error(message: str = "The server had an error while processing your request.") -> Reply:
    return Reply(status=500, error=message, code=None, error_type="server_error")


def context_length_error(max_tokens: int, requested: int) -> Reply:
    """What OpenAI (and vLLM, in the same words) answers for a prompt over the context window."""
    return Reply(status=400, code="context_length_exceeded", error_type="invalid_request_error",
                 error=f"This model's maximum context length is {max_tokens} tokens. However, your messages "
                       f"resulted in {requested} tokens. Please reduce the length of the messages.")


def tokens_of(text: str) -> int:
    return max(1, math.ceil(len(text) / 4))


def message_text(body: dict) -> str:
    """All message contents of a request, as one string (what the usage estimate counts)."""
    parts = []
    for m in body.get("messages") or []:
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
        parts.append(str(content or ""))
        for call in m.get("tool_calls") or []:
            parts.append(json.dumps(call.get("function") or {}))
    return "\n".join(parts)


def role_of(body: dict) -> str | None:
    for m in body.get("messages") or []:
        if m.get("role") in ("system", "developer") and isinstance(m.get("content"), str):
            found = ROLE_RE.search(m["content"])
            if found:
                return found.group(1)
    return None


class _LoopbackServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def handle_error(self, request, client_address) -> None:
        """A client that gave up (its timeout) closes the socket under a slow answer: not an error."""
        import sys

        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


class ScriptedOpenAIServer:
    """The server (see the module docstring). Use as a context manager, or start()/stop()."""

    def __init__(self, roles: dict[str, list] | None = None, responses: list | None = None, *,
                 repeat_last: bool = True, json_schema: bool = True, model: str = "scripted-gpt"):
        self._script = RoleScript(responses or [], roles, repeat_last)
        self.json_schema = json_schema
        self.model = model
        self.requests: list[dict] = []
        self.errors: list[str] = []      # script problems (reported as HTTP 599 to the client too)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle --
    def start(self) -> "ScriptedOpenAIServer":
        handler = type("Handler", (_Handler,), {"server_ref": self})
        self._httpd = _LoopbackServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="scripted-openai", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()   # wakes handlers that are sleeping through a scripted delay
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> "ScriptedOpenAIServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    # -- what tests inspect --
    def roles_called(self) -> list[str | None]:
        return [r["role"] for r in self.requests]

    def requests_of(self, role: str) -> list[dict]:
        return [r["body"] for r in self.requests if r["role"] == role]

    # -- the script --
    def next_item(self, body: dict) -> tuple[dict, Any]:
        """(the request's record in ``requests``, the scripted item answering it)."""
        role = role_of(body)
        entry = {"role": role, "body": body, "t": time.time(), "status": None, "usage": None}
        with self._lock:
            self.requests.append(entry)
            try:
                item = self._script.next(role, len(self.requests))
            except ScriptExhausted as exc:
                self.errors.append(str(exc))
                return entry, Reply(status=599, error=str(exc), error_type="script_exhausted")
        while callable(item) and not isinstance(item, Reply):
            item = item(body)
        return entry, item


def as_reply(item: Any) -> Reply:
    if isinstance(item, Reply):
        return item
    if isinstance(item, str):
        return Reply(content=item)
    return json_reply(item)


class _Handler(BaseHTTPRequestHandler):
    server_ref: ScriptedOpenAIServer
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args: Any) -> None:   # keep test output clean
        pass

    def _send_json(self, status: int, obj: Any, headers: dict | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), headers)

    def _send(self, status: int, data: bytes, headers: dict | None = None,
              content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            self._send_json(200, {"object": "list", "data": [{"id": self.server_ref.model, "object": "model"}]})
        else:
            self._send_json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._send_json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
            return
        try:
            body = json.loads(raw)
        except json.JSONDecodeError as exc:
            self._send_json(400, {"error": {"message": f"request body is not JSON: {exc}",
                                            "type": "invalid_request_error"}})
            return
        srv = self.server_ref
        fmt = (body.get("response_format") or {}).get("type")
        if fmt in ("json_schema", "json_object") and not srv.json_schema:
            with srv._lock:   # refused before the script: it consumes no scripted answer
                srv.requests.append({"role": role_of(body), "body": body, "t": time.time(), "status": 400,
                                     "usage": None})
            self._send_json(400, {"error": {"message": f"response_format type '{fmt}' is not supported by this "
                                                       "server", "type": "invalid_request_error",
                                            "param": "response_format", "code": None}})
            return
        entry, item = srv.next_item(body)
        reply = as_reply(item)
        entry["status"] = reply.status
        if reply.delay_s and srv._stopping.wait(reply.delay_s):
            return
        if reply.raw_body is not None:
            self._send(reply.status, reply.raw_body, reply.headers)
            return
        if reply.status != 200:
            self._send_json(reply.status, {"error": {"message": reply.error, "type": reply.error_type,
                                                     "param": None, "code": reply.code}}, reply.headers)
            return
        usage = entry["usage"] = reply.usage or self._usage(body, reply)
        if body.get("stream"):
            self._stream(body, reply, usage)
        else:
            self._send_json(200, self._completion(body, reply, usage), reply.headers)

    # -- answers --
    @staticmethod
    def _usage(body: dict, reply: Reply) -> dict:
        prompt = tokens_of(message_text(body))
        completion = tokens_of((reply.content or "") + json.dumps(reply.tool_calls))
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    @staticmethod
    def _tool_calls(reply: Reply) -> list[dict]:
        return [{"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                 "function": {"name": name, "arguments": json.dumps(args)}} for name, args in reply.tool_calls]

    def _completion(self, body: dict, reply: Reply, usage: dict) -> dict:
        message: dict[str, Any] = {"role": "assistant", "content": reply.content, "refusal": None}
        finish = "stop"
        if reply.tool_calls:
            message["tool_calls"] = self._tool_calls(reply)
            finish = "tool_calls"
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:16]}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model") or self.server_ref.model, "system_fingerprint": "fp_scripted",
                "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
                "usage": usage}

    def _stream(self, body: dict, reply: Reply, usage: dict) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        for key, value in reply.headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.close_connection = True
        cid, created, model = f"chatcmpl-{uuid.uuid4().hex[:16]}", int(time.time()), body.get("model") or "m"

        def event(delta: dict | None, finish: str | None = None, with_usage: dict | None = None) -> None:
            chunk: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk", "created": created,
                                     "model": model, "system_fingerprint": "fp_scripted",
                                     "choices": [] if delta is None else
                                     [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
            if with_usage is not None:
                chunk["usage"] = with_usage
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.flush()

        event({"role": "assistant", "content": "", "refusal": None})
        text = reply.content or ""
        for i in range(0, len(text), CHUNK_CHARS):
            event({"content": text[i:i + CHUNK_CHARS]})
        for index, call in enumerate(self._tool_calls(reply)):
            args = call["function"]["arguments"]
            event({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                   "function": {"name": call["function"]["name"], "arguments": ""}}]})
            for i in range(0, len(args), CHUNK_CHARS):
                event({"tool_calls": [{"index": index, "function": {"arguments": args[i:i + CHUNK_CHARS]}}]})
        event({}, "tool_calls" if reply.tool_calls else "stop")
        if (body.get("stream_options") or {}).get("include_usage"):
            event(None, with_usage=usage)
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


__all__ = ["ScriptedOpenAIServer", "Reply", "json_reply", "tool_call", "rate_limited", "server_error",
           "context_length_error"]
