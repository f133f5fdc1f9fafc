"""The LLM policy: any LangChain chat model plans, writes kernels and debugs, with a safety net.

Each decision of the :class:`~sparseditto.agents.policy.Policy` protocol becomes one bounded
conversation (the user messages are built in ``agents/llm_prompts.py``, the answers read in
``agents/llm_answers.py``, every request made through ``agents/llm_transport.py``):

* ``plan`` (role planner): the planner prompt (``prompts/planner.md``) + the pattern report, target,
  dense time and roofline, applicable templates with cost estimates, memory hits and lessons, the
  last few candidates tried, the current best kernel (source, bytes, byte roofline, bottleneck)
  and the budget; the answer is a structured :class:`PlanDecision`, validated against the
  applicable templates and their legal parameters.
* ``code`` (role coder; only for candidates the planner marked ``origin="llm"``: plain template
  instances and remembered kernels go to the fallback unchanged): the coder prompt (the candidate
  contract, Triton and CUDA C++) + the source to adapt + the best kernel and its profile + the
  last feedback; the model may call tools (``agents/tools.py``) for a few rounds, then answers with
  one ```python block, which becomes a :class:`CodeProposal` (origin "llm"): a Triton module or a
  CUDA C++ one through CuPy. The graph then treats it like any template instance: static checks,
  sandbox, verification.
* ``diagnose`` (role debugger): the debugger prompt + the failure report + the source; the answer
  is a structured :class:`Diagnosis`. A failure that is a fact of the machine
  (``backend_unavailable``: a CUDA candidate on the interpreter) is answered by the fallback
  without asking the model.

Whatever goes wrong with the model (see the transport's table: rate limits and server errors are
retried within bounds; timeouts, refused connections, answers that do not parse or name a
template that does not exist, the run's LLM budget spent) is logged, recorded as a ``fallback``
event in ``self.events`` and answered by the fallback policy (the expert) for that step: the graph
never sees an exception from a model. A context-length error gets one more try with a smaller
prompt (a ``prompt_shrunk`` event). Every request is an `LLMCall` in ``self.calls`` (the
transcript the graph stores in the memory), with the fallback reason of its step when it fell back.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import replace
from typing import Any, Callable, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from sparseditto.llm import LLMCall, TokenUsage, describe_llm, seconds_from_env

from .llm_answers import (InvalidAnswer, extract_json, extract_python, first_prose_line, is_complete_source,
                          message_text, validate_diagnosis, validate_plan)
from .llm_prompts import DEFAULT_LIMITS, PromptLimits, code_prompt, diagnose_prompt, load_prompt, plan_prompt
from .llm_transport import BudgetReached, ContextTooLong, LLMBudget, LLMCallFailed, ModelCaller, RetryPolicy
from .policy import CandidateSpec, CodeProposal, CodingBrief, Diagnosis, FailureReport, PlanDecision, PlanningInput, Policy
from .tools import ToolContext, build_tools, clip

log = logging.getLogger("sparseditto.llm_policy")

T = TypeVar("T")
#: Failure classes no model can fix: a fact of the machine, answered by the fallback directly.
MACHINE_FAILURES = ("backend_unavailable",)


class LLMPolicy:
    """A chat model behind the Policy protocol, falling back to ``fallback`` on any failure.

    Parameters
    ----------
    model: a LangChain chat model (``sparseditto.llm.resolve_llm`` builds one from a name).
    fallback: the policy answering a step the model could not (the expert policy).
    max_history: candidates tried that the planner prompt shows (the last ones, plus the best).
    max_tool_rounds: tool-calling rounds the coder gets before it must answer.
    structured_output: "native" uses ``model.with_structured_output`` (JSON schema / function
        calling); "json" asks for a JSON object in the reply text and parses it, for servers
        without structured-output support. Default: ``$SPARSEDITTO_LLM_STRUCTURED`` or "native".
        A native request the server refuses (HTTP 400) switches to "json" for the rest of the run.
    use_tools: bind the coder tools (``agents/tools.py``) when the model supports tool calling.
    retry: bounds of the retries (`RetryPolicy`; ``$SPARSEDITTO_LLM_MAX_RETRY_WAIT`` sets the
        longest Retry-After honoured).
    limits: the prompt sections' size limits (`PromptLimits`).

    The graph sets the tools' :class:`ToolContext` with ``set_context(...)`` and the run's LLM
    budget with ``set_budget(...)`` before each step.
    """

    name = "llm"

    def __init__(self, model: Any, fallback: Policy, *, max_history: int = 8, max_tool_rounds: int = 4,
                 structured_output: Literal["native", "json"] | None = None, use_tools: bool = True,
                 context: ToolContext | None = None, retry: RetryPolicy | None = None,
                 limits: PromptLimits = DEFAULT_LIMITS):
        if model is None:
            raise ValueError("LLMPolicy needs a chat model; use the expert policy when there is none.")
        if fallback is None:
            raise ValueError("LLMPolicy needs a fallback policy (the expert) for steps the model cannot answer.")
        mode = structured_output or os.environ.get("SPARSEDITTO_LLM_STRUCTURED") or "native"
        if mode not in ("native", "json"):
            raise ValueError(f"Unknown structured_output mode '{mode}'; expected 'native' or 'json'.")
        self.model = model
        self.fallback = fallback
        self.limits = replace(limits, history=int(max_history))
        self.max_tool_rounds = int(max_tool_rounds)
        self.structured_output = mode
        self.use_tools = use_tools
        self.context = context or ToolContext()
        self.events: list[dict] = []
        self.calls: list[LLMCall] = []
        self.usage = TokenUsage()
        self.model_info = describe_llm(model)
        self.caller = ModelCaller(model_name=self.model_info.get("model"), retry=retry or _retry_from_env())
        self._templates: list[str] = []
        self._tools = build_tools(lambda: self.context)
        self._budget_announced = False

    # -- plumbing --
    def set_context(self, context: ToolContext | None = None, **fields: Any) -> ToolContext:
        """Replace the tool context, or update some of its fields (matrix, dtype, backend, ...)."""
        if context is not None:
            self.context = context
        unknown = [k for k in fields if not hasattr(self.context, k)]
        if unknown:
            raise ValueError(f"Unknown ToolContext field(s) {unknown}.")
        for key, value in fields.items():
            setattr(self.context, key, value)
        return self.context

    def set_budget(self, budget: LLMBudget) -> None:
        """The run's LLM budget and what the run spent before this step (the graph's totals)."""
        self.caller.budget = budget

    @property
    def tools(self) -> list:
        return list(self._tools)

    def _step(self, decision: str, answer: Callable[[], T], fallback: Callable[[], T]) -> T:
        """Run one decision; on any failure, record why (on this step's calls and as a fallback
        event) and let the fallback policy answer."""
        first_call = len(self.calls)
        try:
            return answer()
        except Exception as exc:
            # a failed request carries the model's own error (RateLimitError, APITimeoutError, ...)
            error_type = exc.failure.error_type if isinstance(exc, LLMCallFailed) else type(exc).__name__
            reason = clip(str(exc) if isinstance(exc, LLMCallFailed) else f"{error_type}: {exc}", 500)
            for call in self.calls[first_call:]:
                call.fallback_reason = reason
            if isinstance(exc, BudgetReached) and not self._budget_announced:
                self._budget_announced = True
                self.events.append({"event": "llm_budget_reached", "kind": "event", "decision": decision,
                                    "reason": str(exc), "fallback": getattr(self.fallback, "name", "fallback")})
            log.warning("LLM %s step failed (%s); the %s policy answers this step", decision, clip(reason, 300),
                        getattr(self.fallback, "name", "fallback"))
            self.events.append({"event": "fallback", "kind": "event", "decision": decision,
                                "error_type": error_type, "reason": reason,
                                "fallback": getattr(self.fallback, "name", type(self.fallback).__name__)})
            return fallback()

    def _invoke(self, role: str, runnable: Any, messages: list, prompt_text: str, round_no: int = 0):
        """One request through the transport; its record joins the transcript whatever happens."""
        try:
            result, record = self.caller.invoke(role, runnable, messages, prompt_text, round_no=round_no)
        except LLMCallFailed as exc:
            self.calls.append(exc.record)
            raise
        self.calls.append(record)
        message = result["raw"] if isinstance(result, dict) and "raw" in result else result
        if message is not None:
            self.usage.add(message)
        return result, record

    def _shrinking(self, decision: str, build: Callable[[PromptLimits], str], ask: Callable[[str], T]) -> T:
        """``ask`` the prompt built with the normal limits; after a context-length error, once more
        with the limits scaled down to fit."""
        try:
            return ask(build(self.limits))
        except ContextTooLong as exc:
            factor = exc.shrink_factor()
            self.events.append({"event": "prompt_shrunk", "kind": "event", "decision": decision,
                                "factor": round(factor, 3), "reason": clip(str(exc), 300)})
            return ask(build(self.limits.scaled(factor)))

    def _structured(self, role: str, system: str, prompt: str, schema: type[BaseModel]) -> BaseModel:
        """One structured answer: native structured output, or JSON parsed from the reply text."""
        from langchain_core.messages import HumanMessage, SystemMessage

        messages = [SystemMessage(content=system), HumanMessage(content=prompt)]
        runnable = None
        if self.structured_output == "native":
            try:
                runnable = self.model.with_structured_output(schema, include_raw=True)
            except NotImplementedError:
                runnable = None
        if runnable is not None:
            try:
                out, record = self._invoke(role, runnable, messages, prompt)
            except LLMCallFailed as exc:
                if isinstance(exc, ContextTooLong) or exc.failure.kind != "bad_request":
                    raise
                # The server rejects structured-output requests (response_format / tools): ask
                # for JSON in the text from now on, and answer this step that way.
                self.structured_output = "json"
                self.events.append({"event": "structured_output_switch", "kind": "event", "role": role,
                                    "reason": clip(str(exc), 500), "mode": "json"})
                log.warning("the model server rejected a structured-output request (%s); using JSON in text",
                            clip(str(exc), 200))
                return self._structured(role, system, prompt, schema)
            raw, parsed, error = (out.get("raw"), out.get("parsed"), out.get("parsing_error")) \
                if isinstance(out, dict) and "raw" in out else (None, out, None)
            reply = message_text(raw) if raw is not None else ""
            if raw is not None and not reply and getattr(raw, "tool_calls", None):
                reply = json.dumps(raw.tool_calls[0].get("args", {}), default=str)
            record.reply = clip(reply or json.dumps(_as_jsonable(parsed), default=str), 16000)
            if parsed is None:
                if not reply:
                    raise InvalidAnswer(f"unparsable structured answer ({error})")
                parsed = extract_json(reply)
        else:
            schema_text = json.dumps(schema.model_json_schema(), separators=(",", ":"))
            text = prompt + "\n\nJSON schema of the answer: " + schema_text
            messages[-1] = HumanMessage(content=text)
            reply_msg, record = self._invoke(role, self.model, messages, text)
            reply = message_text(reply_msg)
            record.reply = clip(reply, 16000)
            parsed = extract_json(reply)
        if isinstance(parsed, schema):
            return parsed
        try:
            return schema.model_validate(_as_jsonable(parsed))
        except ValidationError as exc:
            raise InvalidAnswer(f"answer does not fit {schema.__name__}: {clip(str(exc), 400)}") from None

    def _converse_with_tools(self, role: str, system: str, prompt: str) -> str:
        """Up to ``max_tool_rounds`` rounds of tool calls, then the final text answer."""
        from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage

        messages: list = [SystemMessage(content=system), HumanMessage(content=prompt)]
        runnable = self.model
        if self.use_tools and self._tools:
            try:
                runnable = self.model.bind_tools(self._tools)
            except NotImplementedError:
                runnable = self.model
        by_name = {t.name: t for t in self._tools}
        sent = prompt          # what this round adds to the conversation (the transcript's prompt)
        for round_no in range(self.max_tool_rounds + 1):
            last_round = round_no == self.max_tool_rounds
            reply, record = self._invoke(role, runnable, messages, sent, round_no)
            messages.append(reply)
            tool_calls = list(getattr(reply, "tool_calls", None) or [])
            record.reply = clip(message_text(reply) or json.dumps([{"name": c.get("name"), "args": c.get("args")}
                                                                   for c in tool_calls], default=str), 16000)
            if not tool_calls:
                return message_text(reply)
            results = []
            for call in tool_calls:
                name, args = call.get("name"), call.get("args") or {}
                if last_round:
                    result = "tool budget spent: answer now with the complete module in one ```python block"
                elif name not in by_name:
                    result = f"error: unknown tool '{name}'; available: {', '.join(by_name)}"
                else:
                    try:
                        result = str(by_name[name].invoke(args))
                    except Exception as exc:  # a tool must never end the step
                        result = f"error: {type(exc).__name__}: {clip(str(exc), 1000, keep='tail')}"
                record.tool_calls.append({"name": name, "args": {k: clip(str(v), 300) for k, v in args.items()},
                                          "result": clip(result, 600)})
                messages.append(ToolMessage(content=clip(result, 8000), tool_call_id=call.get("id") or name or "call"))
                results.append(f"[tool {name}] {clip(result, 8000)}")
            sent = "\n\n".join(results)
            if last_round:
                reply, record = self._invoke(role, self.model, messages, sent, round_no + 1)  # unbound: must answer
                record.reply = clip(message_text(reply), 16000)
                return message_text(reply)
        return ""   # pragma: no cover - the loop always returns

    def _known_templates(self) -> list[str]:
        if self._templates:
            return self._templates
        from sparseditto.kernel_templates.registry import list_templates

        return sorted(t.name for t in list_templates())

    # -- the three decisions --
    def plan(self, inp: PlanningInput) -> PlanDecision:
        names = [t.get("name") for t in inp.templates if t.get("name")]
        if names:
            self._templates = sorted(set(names) | {"dense"})

        def answer() -> PlanDecision:
            decision = self._shrinking("plan", lambda limits: plan_prompt(inp, limits),
                                       lambda prompt: self._structured("planner", load_prompt("planner"), prompt,
                                                                       PlanDecision))
            problems = validate_plan(decision, inp)
            if problems:
                raise InvalidAnswer("invalid plan: " + "; ".join(problems[:4]))
            if decision.action == "stop":
                return decision.model_copy(update={"candidates": []})
            if inp.budget_left > 0 and len(decision.candidates) > inp.budget_left:
                decision = decision.model_copy(update={"candidates": decision.candidates[: inp.budget_left]})
            return decision

        return self._step("plan", answer, lambda: self.fallback.plan(inp))

    def code(self, spec: CandidateSpec, template_source: str, feedback: str | None = None,
             brief: CodingBrief | None = None) -> CodeProposal:
        # Only origin "llm" asks the model to write code. A plain template instance ("template":
        # the planner chose parameters, not new code) is instantiated as is, a kernel remembered
        # from an earlier run is reused exactly as stored ("ditto"), and a full source the
        # planner already wrote needs no second opinion: the fallback policy does all three.
        if spec.origin != "llm" or (spec.source and is_complete_source(spec.source)):
            return self.fallback.code(spec, template_source, feedback, brief)
        spec_backend = _template_backend(spec.template)

        def answer() -> CodeProposal:
            text = self._shrinking(
                "code", lambda limits: code_prompt(spec, template_source, feedback, self.context, brief, limits,
                                                   spec_backend=spec_backend),
                lambda prompt: self._converse_with_tools("coder", load_prompt("coder"), prompt))
            source = extract_python(text)
            if source is None:
                raise InvalidAnswer("the reply has no ```python block defining prepare() and spmm(): "
                                    f"{clip(text.strip(), 200)!r}")
            rationale = first_prose_line(text) or f"LLM-written {spec.template} variant"
            return CodeProposal(source=source, rationale=clip(rationale, 300), origin="llm")

        return self._step("code", answer, lambda: self.fallback.code(spec, template_source, feedback, brief))

    def diagnose(self, failure: FailureReport, source: str) -> Diagnosis:
        if failure.failure_class in MACHINE_FAILURES:
            return self.fallback.diagnose(failure, source)

        def answer() -> Diagnosis:
            known = self._known_templates()
            diag = self._shrinking("diagnose", lambda limits: diagnose_prompt(failure, source, known, limits),
                                   lambda prompt: self._structured("debugger", load_prompt("debugger"), prompt,
                                                                   Diagnosis))
            if diag.source:
                fixed = extract_python(diag.source) if "```" in diag.source else diag.source
                diag = diag.model_copy(update={"source": fixed or diag.source})
            problems = validate_diagnosis(diag, known)
            if problems:
                raise InvalidAnswer("invalid diagnosis: " + "; ".join(problems))
            return diag

        return self._step("diagnose", answer, lambda: self.fallback.diagnose(failure, source))


def _template_backend(name: str) -> str | None:
    """The kernel language of a registry template ('triton', 'cuda', 'builtin'); None if unknown."""
    from sparseditto.kernel_templates.registry import get_template

    try:
        return get_template(name).backend
    except ValueError:
        return None


def _retry_from_env() -> RetryPolicy:
    return RetryPolicy(max_wait_s=seconds_from_env("SPARSEDITTO_LLM_MAX_RETRY_WAIT", RetryPolicy.max_wait_s,
                                                   allow_zero=True))


def _as_jsonable(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump()
    return obj
