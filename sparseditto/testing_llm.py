"""Scripted fake chat models: drive the LLM policy (and the whole graph) without any network.

Shipped in the package so that users can test their own integrations the way SparseDitto's tests
do. A :class:`ScriptedChatModel` is a real LangChain ``BaseChatModel`` that answers from a script
instead of a server, records every prompt it receives, and reports token usage.

Script items (consumed in order; each call takes one):

* a ``str``: the reply text (for structured output it is parsed as JSON);
* an ``AIMessage``: returned as is (use :func:`tool_call_message` for one that calls tools);
* a pydantic object or a ``dict``: a structured answer (plain calls get its JSON as text);
* an exception instance or class: raised, e.g. ``ConnectionError("Connection refused")`` to play
  an unreachable server;
* a callable ``f(messages) -> item``: a responder that looks at the prompt and returns any of the
  above (e.g. "write the fixed kernel when the prompt carries an error").

Scripts can be one list (``responses=[...]``: strict order, ideal for unit tests) or one list per
role (``roles={"planner": [...], "coder": [...], "debugger": [...]}``): the role is read from the
``[sparseditto-role: NAME]`` marker at the top of the policy's system prompts, so the order in
which a graph calls planner, coder and debugger does not matter. With ``repeat_last=True`` a
script that runs out keeps answering with its last item (handy when a graph calls a role an
unknown number of times); otherwise running out raises :class:`ScriptExhausted`, which the LLM
policy treats like any model failure (a fallback to the expert).

Scenarios from the issue, ready made (each returns a fresh model):

=======================  ==============================================================
``good_kernel_model``     plans one LLM-written candidate, writes a correct Triton CSR
                          kernel, then stops
``fix_after_error_model``  first writes a kernel calling a triton function that does not
                          exist; given the error (debugger, or coder with feedback), it
                          writes the correct kernel
``wrong_result_model``    writes a kernel that runs but drops the last nonzero of each row
``cheating_model``        writes a "kernel" that calls torch.mm (static checks reject it)
``unreachable_model``     every call raises ConnectionError (the policy falls back)
=======================  ==============================================================

Typical use::

    from sparseditto.testing_llm import good_kernel_model
    model = good_kernel_model()
    result = run_graph(matrix, llm=model, backend="interpret")
    assert any("[sparseditto-role: coder]" in p for p in model.prompts)

The kernel sources the scenarios write live in `sparseditto.testing_kernels`; `RoleScript` (how a
script is consumed, per role) is shared with the scripted OpenAI-compatible HTTP server of the
project's tests.

Inspection: ``model.calls`` (the message lists received), ``model.prompts`` (their text),
``model.roles_called`` (the role of each call), ``model.bound_tools`` (names given to
``bind_tools``), ``model.remaining()`` (items left per script).
"""
from __future__ import annotations

import json
import math
import re
from typing import Any, Callable

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableLambda
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

ROLE_RE = re.compile(r"\[sparseditto-role: (\w+)\]")


class ScriptExhausted(RuntimeError):
    """The scripted model was called more often than its script allows."""


from sparseditto.testing_kernels import BROKEN_KERNEL, CHEATING_KERNEL, GOOD_KERNEL, WRONG_KERNEL  # noqa: F401



def python_reply(source: str, note: str = "Here is the kernel.") -> str:
    """A coder reply the way a model writes it: one line, then one ```python block."""
    return f"{note}\n\n```python\n{source}```\n"


def tool_call_message(name: str, call_id: str | None = None, **args: Any) -> AIMessage:
    """An assistant turn that calls one tool (scripted tool-calling rounds)."""
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id or f"call_{name}"}])


# ---- the fake chat model -----------------------------------------------------------------------
def messages_text(messages: list[BaseMessage]) -> str:
    parts = []
    for m in messages:
        content = m.content if isinstance(m.content, str) else json.dumps(m.content, default=str)
        parts.append(f"[{m.type}] {content}")
    return "\n".join(parts)


def role_of(messages: list[BaseMessage]) -> str | None:
    """The role marker in the system prompt ('planner', 'coder', 'debugger'), if any."""
    for m in messages:
        if m.type == "system" and isinstance(m.content, str):
            match = ROLE_RE.search(m.content)
            if match:
                return match.group(1)
    return None


def _tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / 4))


def _as_text(item: Any) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, BaseModel):
        return item.model_dump_json()
    if isinstance(item, dict):
        return json.dumps(item, default=str)
    return str(item)


class RoleScript:
    """Scripted answers consumed in order: one list per role and/or one list for every call
    (``"*"``); with ``repeat_last`` a list that ran out repeats its last item. Shared by the fake
    chat model here and the tests' scripted HTTP server, so both read a script the same way."""

    def __init__(self, responses: list | tuple = (), roles: dict[str, list] | None = None, repeat_last: bool = False):
        self._queues = {"*": list(responses), **{role: list(items) for role, items in (roles or {}).items()}}
        self._last: dict[str, Any] = {}
        self.repeat_last = repeat_last

    def next(self, role: str | None, call_no: int) -> Any:
        """The next item for ``role`` (ScriptExhausted when there is none)."""
        key = role if role in self._queues and role != "*" else "*"
        queue = self._queues[key]
        if queue:
            item = queue.pop(0)
            self._last[key] = item
            return item
        if self.repeat_last and key in self._last:
            return self._last[key]
        where = f"role '{role}'" if key != "*" else "the script"
        raise ScriptExhausted(f"no response left for {where} (call #{call_no}).")

    def remaining(self) -> dict[str, int]:
        return self._script.remaining()


class ScriptedChatModel(BaseChatModel):
    """A chat model that answers from a script (see the module docstring)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    responses: list[Any] = Field(default_factory=list)
    roles: dict[str, list[Any]] = Field(default_factory=dict)
    repeat_last: bool = False
    model_name: str = "scripted-chat-model"

    _script: RoleScript = PrivateAttr(default_factory=RoleScript)
    _calls: list[list[BaseMessage]] = PrivateAttr(default_factory=list)
    _roles_called: list[str | None] = PrivateAttr(default_factory=list)
    _bound_tools: list[str] = PrivateAttr(default_factory=list)
    _structured_schemas: list[str] = PrivateAttr(default_factory=list)

    def model_post_init(self, __context: Any) -> None:
        self._script = RoleScript(self.responses, self.roles, self.repeat_last)

    # -- what tests inspect --
    @property
    def calls(self) -> list[list[BaseMessage]]:
        return self._calls

    @property
    def prompts(self) -> list[str]:
        return [messages_text(m) for m in self._calls]

    @property
    def roles_called(self) -> list[str | None]:
        return self._roles_called

    @property
    def bound_tools(self) -> list[str]:
        return self._bound_tools

    @property
    def structured_schemas(self) -> list[str]:
        return self._structured_schemas

    def remaining(self) -> dict[str, int]:
        return {key: len(queue) for key, queue in self._queues.items()}

    # -- the script --
    def _next_item(self, messages: list[BaseMessage]) -> Any:
        role = role_of(messages)
        self._calls.append(list(messages))
        self._roles_called.append(role)
        try:
            item = self._script.next(role, len(self._calls))
        except ScriptExhausted as exc:
            raise ScriptExhausted(f"ScriptedChatModel: {exc}") from None
        if callable(item) and not isinstance(item, (BaseModel, type)) and not isinstance(item, BaseException):
            item = item(list(messages))
        if isinstance(item, type) and issubclass(item, BaseException):
            raise item(f"scripted {item.__name__}")
        if isinstance(item, BaseException):
            raise item
        return item

    def _to_message(self, item: Any, messages: list[BaseMessage]) -> AIMessage:
        if isinstance(item, AIMessage):
            msg = item.model_copy()
        else:
            msg = AIMessage(content=_as_text(item))
        if not msg.usage_metadata:
            prompt = _tokens(messages_text(messages))
            completion = _tokens(_as_text(msg.content) + json.dumps(msg.tool_calls, default=str))
            msg.usage_metadata = {"input_tokens": prompt, "output_tokens": completion,
                                  "total_tokens": prompt + completion}
        return msg

    # -- BaseChatModel --
    @property
    def _llm_type(self) -> str:
        return "scripted-chat-model"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": self.model_name}

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        item = self._next_item(messages)
        return ChatResult(generations=[ChatGeneration(message=self._to_message(item, messages))])

    def bind_tools(self, tools: Any, *, tool_choice: str | None = None, **kwargs: Any) -> "ScriptedChatModel":
        """Records the tool names and returns the model itself: the script decides tool calls."""
        self._bound_tools = [getattr(t, "name", None) or getattr(t, "__name__", str(t)) for t in tools]
        return self

    def with_structured_output(self, schema: Any, *, include_raw: bool = False, **kwargs: Any):
        """A runnable that pops the next item and validates it into ``schema`` (a pydantic class,
        or anything else for a plain dict); with ``include_raw`` parsing errors are returned, not
        raised, as LangChain's chat models do."""
        self._structured_schemas.append(getattr(schema, "__name__", str(schema)))

        def answer(value: Any) -> Any:
            messages = self._convert_input(value).to_messages()
            item = self._next_item(messages)
            raw = self._to_message(item, messages)
            try:
                parsed = self._parse(item, schema)
            except Exception as exc:
                if include_raw:
                    return {"raw": raw, "parsed": None, "parsing_error": exc}
                raise
            return {"raw": raw, "parsed": parsed, "parsing_error": None} if include_raw else parsed

        return RunnableLambda(answer, name="ScriptedStructuredOutput")

    @staticmethod
    def _parse(item: Any, schema: Any) -> Any:
        if isinstance(item, AIMessage):
            item = item.content if item.content else (item.tool_calls[0]["args"] if item.tool_calls else "")
        if isinstance(item, BaseModel):
            item = item.model_dump()
        if isinstance(item, str):
            item = json.loads(item)
        if isinstance(schema, type) and issubclass(schema, BaseModel):
            return schema.model_validate(item)
        return item


# ---- responders and scenario builders ----------------------------------------------------------
_TEMPLATE_LINE = re.compile(r"^- ([A-Za-z0-9_.-]+): ", re.MULTILINE)


def templates_in_prompt(messages: list[BaseMessage]) -> list[str]:
    """Template names listed under "Applicable templates" in a planner prompt, in order."""
    text = messages_text(messages)
    start = text.find("## Applicable templates")
    if start < 0:
        return []
    end = text.find("\n## ", start + 5)
    return _TEMPLATE_LINE.findall(text[start: end if end > 0 else None])


def plan_first_template(origin: str = "llm", prefer: tuple[str, ...] = ("csr_rowsplit",),
                        fallback_template: str = "csr_rowsplit") -> Callable:
    """A planner responder: try one applicable template listed in the prompt (the first of
    ``prefer`` that is listed, else the first non-dense one). The scenario kernels are CSR
    kernels, so adapting the CSR template keeps the trajectory's template names honest."""
    def respond(messages: list[BaseMessage]) -> dict:
        names = [n for n in templates_in_prompt(messages) if n != "dense"]
        preferred = [n for n in prefer if n in names]
        template = preferred[0] if preferred else (names[0] if names else fallback_template)
        return {"action": "try", "rationale": f"scripted: adapt {template}",
                "candidates": [{"template": template, "params": {}, "origin": origin,
                                "rationale": f"scripted LLM candidate from {template}"}]}
    return respond


STOP_PLAN = {"action": "stop", "candidates": [], "rationale": "scripted: one candidate is enough"}


def _with_feedback(messages: list[BaseMessage]) -> bool:
    return "## Feedback on the previous attempt" in messages_text(messages)


def _scenario(coder: list[Any], debugger: list[Any], planner: list[Any] | None = None) -> ScriptedChatModel:
    return ScriptedChatModel(
        roles={"planner": planner if planner is not None else [plan_first_template(), STOP_PLAN],
               "coder": coder, "debugger": debugger},
        repeat_last=True)


def good_kernel_model() -> ScriptedChatModel:
    """Plans one LLM candidate, writes a correct kernel for it, then stops."""
    return _scenario(
        coder=[python_reply(GOOD_KERNEL, "A row-wise CSR kernel with chunked nonzero loads.")],
        debugger=[{"failure_class": "unknown", "action": "give_up", "rationale": "scripted: give up"}])


def fix_after_error_model() -> ScriptedChatModel:
    """Writes a kernel that does not compile (tl.reduce_sum does not exist); fixes it when the
    error comes back, through the debugger (retry_source) or the coder (feedback)."""
    def coder(messages):
        if _with_feedback(messages):
            return python_reply(GOOD_KERNEL, "Replaced the non-existent tl.reduce_sum with tl.sum.")
        return python_reply(BROKEN_KERNEL, "A row-wise CSR kernel using tl.reduce_sum.")

    fix = {"failure_class": "compile_error", "action": "retry_source", "source": GOOD_KERNEL,
           "rationale": "tl.reduce_sum does not exist in triton.language; tl.sum reduces along an axis"}
    return _scenario(coder=[coder], debugger=[fix])


def wrong_result_model() -> ScriptedChatModel:
    """Writes a kernel that runs but computes a wrong result (drops each row's last nonzero)."""
    return _scenario(
        coder=[python_reply(WRONG_KERNEL, "A row-wise CSR kernel.")],
        debugger=[{"failure_class": "wrong_result", "action": "give_up",
                   "rationale": "scripted: cannot find the bug"}])


def cheating_model() -> ScriptedChatModel:
    """Writes a 'kernel' that calls torch.mm: the static checks must reject it."""
    return _scenario(
        coder=[python_reply(CHEATING_KERNEL, "Use the fastest matmul available.")],
        debugger=[{"failure_class": "static_rejected", "action": "give_up",
                   "rationale": "scripted: the source uses a vendor matmul"}])


def unreachable_model() -> ScriptedChatModel:
    """Every call raises ConnectionError, like a server that is down."""
    return ScriptedChatModel(
        responses=[lambda messages: ConnectionError("Connection refused: http://127.0.0.1:9/v1 (scripted)")],
        repeat_last=True)
