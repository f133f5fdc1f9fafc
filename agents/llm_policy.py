"""The LLM policy: any LangChain chat model plans, writes kernels and debugs, with a safety net.

Each decision of the :class:`~sparseditto.agents.policy.Policy` protocol becomes one bounded
conversation:

* ``plan``: the planner prompt (``prompts/planner.md``) + the pattern report, target, dense time and
  roofline, applicable templates with cost estimates, memory hits, the last few candidates tried
  (one line each) and the budget; the answer is a structured :class:`PlanDecision`, validated
  against the applicable templates and their legal parameters.
* ``code`` (for candidates the planner marked ``origin="llm"``; plain template instances and
  remembered kernels go to the fallback unchanged): the coder prompt (``prompts/coder.md``: the
  candidate contract and the static-check rules) + the template source being adapted + the last
  feedback; the model may call tools
  (``agents/tools.py``: triton API introspection, templates, memory, compile, verify) for a few
  rounds, then answers with one ```python block, which becomes a :class:`CodeProposal`
  (origin "llm"). The graph then treats it like any template instance: static checks, sandbox,
  verification.
* ``diagnose``: the debugger prompt (``prompts/debugger.md``) + the failure report + the source; the
  answer is a structured :class:`Diagnosis`.

Whatever goes wrong with the model (unreachable server, timeout, rate limit, an answer that does
not parse or names a template that does not exist) is logged, recorded as a ``fallback`` event in
``self.events`` and answered by the fallback policy (the expert) for that step: the graph never sees
an exception from a model. Every exchange is also recorded as an ``llm_call`` event (prompt, reply,
tool calls, tokens), which the graph copies into the trajectory memory, and token usage accumulates
in ``self.usage``.
"""
from __future__ import annotations

import functools
import importlib.resources
import json
import logging
import os
import re
from typing import Any, Callable, Literal

from pydantic import BaseModel, ValidationError

from sparseditto.llm import TokenUsage, describe_llm

from .policy import (
    CandidateSpec,
    CodeProposal,
    Diagnosis,
    FailureReport,
    PlanDecision,
    PlanningInput,
    Policy,
    TriedCandidate,
)
from .tools import ToolContext, build_tools, clip

log = logging.getLogger("sparseditto.llm_policy")

ROLE_MARKER = re.compile(r"\[sparseditto-role: (\w+)\]")
MAX_EVENT_TEXT = 16000


class InvalidAnswer(ValueError):
    """The model answered, but not with something the graph can use."""


@functools.lru_cache(maxsize=None)
def load_prompt(name: str) -> str:
    """A system prompt shipped in ``sparseditto.agents/prompts`` (planner, coder, debugger)."""
    return (importlib.resources.files(__package__) / "prompts" / f"{name}.md").read_text(encoding="utf-8")


# ---- parsing helpers ---------------------------------------------------------------------------
def message_text(message: Any) -> str:
    """The text of a chat reply (string content, or the text blocks of a list content)."""
    content = getattr(message, "content", message)
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict) and block.get("type") in ("text", "output_text"):
                parts.append(str(block.get("text", "")))
        return "".join(parts)
    return "" if content is None else str(content)


_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)


def extract_json(text: str) -> dict:
    """The first JSON object in a reply: a ```json block, a bare object, or one inside prose."""
    candidates = [body for lang, body in _FENCE.findall(text) if lang.lower() in ("json", "")]
    candidates.append(text)
    decoder = json.JSONDecoder()
    for chunk in candidates:
        for match in re.finditer(r"\{", chunk):
            try:
                obj, _ = decoder.raw_decode(chunk, match.start())
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                return obj
    raise InvalidAnswer(f"no JSON object in the reply: {clip(text.strip(), 200)!r}")


_DEF_PREPARE = re.compile(r"^def\s+prepare\s*\(", re.MULTILINE)
_DEF_SPMM = re.compile(r"^def\s+spmm\s*\(", re.MULTILINE)


def is_complete_source(source: str) -> bool:
    """Defines both contract functions at module level (syntax is the harness's job)."""
    return bool(_DEF_PREPARE.search(source) and _DEF_SPMM.search(source))


def extract_python(text: str) -> str | None:
    """The one complete candidate module in a reply: the ```python block defining prepare() and
    spmm() (the longest such block if the model wrote several), or the whole reply when it is bare
    code. None when no complete module is there."""
    blocks = [body for lang, body in _FENCE.findall(text) if lang.lower() in ("python", "py", "python3", "")]
    complete = [b for b in blocks if is_complete_source(b)]
    if complete:
        return max(complete, key=len).strip("\n") + "\n"
    if "```" not in text and is_complete_source(text):
        return text.strip("\n") + "\n"
    return None


# ---- prompt building ---------------------------------------------------------------------------
def compact_json(obj: Any, limit: int) -> str:
    """Compact JSON of ``obj`` within ``limit`` characters: long lists and strings are shortened
    first (so the scalar facts survive), a hard clip is the last resort."""
    def dumps(o):
        return json.dumps(o, separators=(",", ":"), default=str)

    text = dumps(obj)
    if len(text) <= limit:
        return text

    def shrink(o, n_items, n_chars):
        if isinstance(o, dict):
            return {k: shrink(v, n_items, n_chars) for k, v in o.items()}
        if isinstance(o, list):
            head = [shrink(v, n_items, n_chars) for v in o[:n_items]]
            return head + ([f"... {len(o) - n_items} more"] if len(o) > n_items else [])
        if isinstance(o, str) and len(o) > n_chars:
            return o[:n_chars] + "..."
        return o

    for n_items, n_chars in ((16, 400), (8, 200), (4, 80), (2, 40)):
        text = dumps(shrink(obj, n_items, n_chars))
        if len(text) <= limit:
            return text
    return text[:limit] + "...(cut)"


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "?"
    if isinstance(value, float):
        return f"{value:.4g}{unit}"
    return f"{value}{unit}"


def tried_line(t: TriedCandidate) -> str:
    """One line per tried candidate: what, outcome, time, speedup, roofline %, bottleneck."""
    parts = [f"{t.template} {json.dumps(t.params, separators=(',', ':'), default=str)} -> {t.status}"]
    if t.failure_class:
        parts.append(f"({t.failure_class})")
    if t.median_ms is not None:
        parts.append(f"{_fmt(t.median_ms)} ms")
    if t.speedup_vs_dense is not None:
        parts.append(f"{_fmt(t.speedup_vs_dense)}x dense")
    if t.pct_of_roofline is not None:
        parts.append(f"{_fmt(t.pct_of_roofline)}% roofline")
    if t.bottleneck:
        parts.append(f"bottleneck: {t.bottleneck}")
    return clip(" ".join(parts), 300)


def template_line(t: dict) -> str:
    keys = ("estimate_ms", "bound", "format", "backend", "default_params", "params", "description")
    info = {k: t[k] for k in keys if t.get(k) not in (None, "", {}, [])}
    grid = t.get("grid") or []
    if grid:
        info["grid_best"] = [{"params": g.get("params"), "estimate_ms": g.get("estimate_ms")} for g in grid[:3]]
    return clip(f"- {t.get('name')}: {compact_json(info, 600)}", 700)


def memory_line(hit: dict) -> str:
    keys = ("kind", "matrix_name", "pattern", "distance", "template", "params", "speedup_vs_dense",
            "best_speedup_vs_dense", "median_ms", "gpu", "dtype", "n_bucket", "tried")
    return clip("- " + compact_json({k: hit[k] for k in keys if k in hit and hit[k] is not None}, 400), 420)


def plan_prompt(inp: PlanningInput, *, max_history: int = 8, max_report_chars: int = 6000) -> str:
    """The planner's user message. Bounded: the report is compacted, and of the candidates tried
    only the last ``max_history`` (plus the best) appear, so long runs do not grow the prompt."""
    n_main = inp.n_values[0] if inp.n_values else None
    lines = [
        "## Matrix pattern report (JSON)",
        compact_json(inp.report, max_report_chars),
        "",
        "## Target GPU",
        compact_json(inp.target, 1500),
        "",
        f"## Workload: N values {inp.n_values} (main N = {n_main}), dtype {inp.dtype}",
        f"Dense cuBLAS: {_fmt(inp.dense_ms, ' ms')}; best roofline over templates: {_fmt(inp.roofline_ms, ' ms')}.",
        f"Budget left: {inp.budget_left} candidate(s).",
        "",
        "## Applicable templates (name: cost estimate at the main N, legal params, ...)",
    ]
    lines += [template_line(t) for t in inp.templates[:24]] or ["(none reported)"]
    lines += ["", "## Memory hits (past runs on this or similar patterns)"]
    lines += [memory_line(h) for h in inp.memory_hits[:5]] or ["(none)"]
    lines += ["", f"## Candidates tried so far: {len(inp.tried)}"]
    recent = inp.tried[-max_history:] if max_history > 0 else []
    if len(inp.tried) > len(recent):
        lines.append(f"({len(inp.tried) - len(recent)} earlier candidate(s) omitted)")
    lines += [f"{len(inp.tried) - len(recent) + i + 1}. {tried_line(t)}" for i, t in enumerate(recent)] or ["(none yet)"]
    if inp.best is not None:
        lines.append(f"Best so far: {tried_line(inp.best)}")
    lines += ["", "Decide the next candidates (or stop). Answer with the JSON object only."]
    return "\n".join(lines)


def code_prompt(spec: CandidateSpec, template_source: str, feedback: str | None, ctx: ToolContext, *,
                max_source_chars: int = 16000, max_feedback_chars: int = 4000) -> str:
    lines = [f"## Candidate to write: template '{spec.template}' with params "
             f"{json.dumps(spec.params, default=str)}"]
    if spec.rationale:
        lines.append(f"Planner's reason: {spec.rationale}")
    if ctx.matrix is not None:
        m = ctx.matrix
        lines.append(f"Matrix: {getattr(m, 'name', '?')} shape {tuple(m.shape)}, nnz {m.nnz}, "
                     f"pattern {ctx.pattern or '?'}; dtype {ctx.dtype}; N values {ctx.n_values}; "
                     f"backend {ctx.backend}.")
    else:
        lines.append(f"dtype {ctx.dtype}; N values {ctx.n_values}; backend {ctx.backend}.")
    lines += ["", "## Source to adapt (a working, verified template instance)", "```python",
              clip(template_source or "# (no template source given: write the module from scratch)",
                   max_source_chars), "```"]
    if feedback:
        lines += ["", "## Feedback on the previous attempt (errors, verification, profile)",
                  clip(feedback, max_feedback_chars, keep="tail")]
    lines += ["", "Write the complete module now: one line of explanation, then one ```python block."]
    return "\n".join(lines)


def diagnose_prompt(failure: FailureReport, source: str, known_templates: list[str], *,
                    max_source_chars: int = 16000, max_log_chars: int = 4000) -> str:
    report = failure.model_dump()
    report["log"] = clip(failure.log or "", max_log_chars, keep="tail")
    report["message"] = clip(failure.message or "", 1500)
    lines = ["## Failure report", json.dumps(report, default=str), "",
             "## Source of the failed candidate", "```python", clip(source or "", max_source_chars), "```"]
    if known_templates:
        lines += ["", f"Templates you may switch to: {', '.join(known_templates)}"]
    lines += ["", "Diagnose it. Answer with the JSON object only."]
    return "\n".join(lines)


# ---- validation --------------------------------------------------------------------------------
def _legal_params(entry: dict | None, name: str) -> dict | None:
    """Legal values per parameter for a template: from its planning entry, else the registry."""
    if entry and isinstance(entry.get("params"), dict) and all(isinstance(v, (list, tuple)) for v in entry["params"].values()):
        return entry["params"]
    from sparseditto.kernel_templates.registry import get_template

    try:
        return dict(get_template(name).params)
    except ValueError:   # not a registry template
        return None


def validate_plan(decision: PlanDecision, inp: PlanningInput) -> list[str]:
    """Problems that make a plan unusable (empty list = valid). Parameter values that spell a
    legal value ("32" for 32) are normalized in place."""
    problems: list[str] = []
    if decision.action == "stop":
        return problems
    if not decision.candidates:
        return ["action 'try' with no candidates"]
    entries = {t.get("name"): t for t in inp.templates if t.get("name")}
    names = set(entries) | {"dense"}
    if not entries:
        from sparseditto.kernel_templates.registry import list_templates

        names |= {t.name for t in list_templates()}
    for i, spec in enumerate(decision.candidates):
        if names and spec.template not in names:
            problems.append(f"candidate {i + 1}: unknown template '{spec.template}' "
                            f"(applicable: {', '.join(sorted(names))})")
            continue
        if spec.template == "dense":
            continue
        if spec.origin == "llm" and spec.source is not None and not is_complete_source(spec.source):
            problems.append(f"candidate {i + 1}: 'source' does not define prepare() and spmm()")
        legal = _legal_params(entries.get(spec.template), spec.template)
        if legal is None:
            continue
        for key, value in list(spec.params.items()):
            if key not in legal:
                problems.append(f"candidate {i + 1}: {spec.template} has no parameter '{key}' "
                                f"(parameters: {', '.join(legal)})")
                continue
            choices = list(legal[key])
            fixed = _coerce_choice(value, choices)
            if fixed is _ILLEGAL:
                problems.append(f"candidate {i + 1}: {spec.template}.{key}={value!r} is not legal "
                                f"(legal: {choices})")
            else:
                spec.params[key] = fixed
    return problems


_ILLEGAL = object()


def _coerce_choice(value: Any, choices: list) -> Any:
    """``value`` if legal, else the legal choice it spells ("32" or 32.0 for 32, "True" for True);
    models often quote numbers in JSON. ``_ILLEGAL`` when nothing matches."""
    for choice in choices:  # the legal value itself (so 4.0 comes back as the legal 4)
        if choice == value and isinstance(choice, bool) == isinstance(value, bool):
            return choice
    text = str(value).strip()
    for choice in choices:
        if str(choice) == text or (isinstance(choice, (int, float)) and not isinstance(choice, bool)
                                   and _as_number(text) == choice):
            return choice
    return _ILLEGAL


def _as_number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def validate_diagnosis(diag: Diagnosis, known_templates: list[str]) -> list[str]:
    if diag.action == "retry_params" and not diag.params:
        return ["action 'retry_params' without params"]
    if diag.action == "retry_source":
        if not diag.source:
            return ["action 'retry_source' without a source"]
        if not is_complete_source(diag.source):
            return ["'source' does not define prepare() and spmm()"]
    if diag.action == "switch_template":
        if not diag.template:
            return ["action 'switch_template' without a template"]
        if known_templates and diag.template not in known_templates:
            return [f"unknown template '{diag.template}' (known: {', '.join(known_templates)})"]
    return []


# ---- the policy --------------------------------------------------------------------------------
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
    use_tools: bind the coder tools (``agents/tools.py``) when the model supports tool calling.

    The graph sets the tools' :class:`ToolContext` before a step with ``set_context(...)``.
    """

    name = "llm"

    def __init__(self, model: Any, fallback: Policy, *, max_history: int = 8, max_tool_rounds: int = 4,
                 structured_output: Literal["native", "json"] | None = None, use_tools: bool = True,
                 context: ToolContext | None = None):
        if model is None:
            raise ValueError("LLMPolicy needs a chat model; use the expert policy when there is none.")
        if fallback is None:
            raise ValueError("LLMPolicy needs a fallback policy (the expert) for steps the model cannot answer.")
        mode = structured_output or os.environ.get("SPARSEDITTO_LLM_STRUCTURED") or "native"
        if mode not in ("native", "json"):
            raise ValueError(f"Unknown structured_output mode '{mode}'; expected 'native' or 'json'.")
        self.model = model
        self.fallback = fallback
        self.max_history = int(max_history)
        self.max_tool_rounds = int(max_tool_rounds)
        self.structured_output = mode
        self.use_tools = use_tools
        self.context = context or ToolContext()
        self.events: list[dict] = []
        self.usage = TokenUsage()
        self.model_info = describe_llm(model)
        self._templates: list[str] = []
        self._tools = build_tools(lambda: self.context)

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

    @property
    def tools(self) -> list:
        return list(self._tools)

    def _record_call(self, decision: str, prompt: str, reply: str, tool_calls: list[dict], usage: dict) -> None:
        self.events.append({
            "event": "llm_call", "kind": "prompt", "decision": decision, "model": self.model_info.get("model"),
            "prompt": clip(prompt, MAX_EVENT_TEXT), "reply": clip(reply, MAX_EVENT_TEXT),
            "tool_calls": tool_calls, "usage": usage,
        })

    def _fallback(self, decision: str, exc: BaseException, answer: Callable[[], Any]) -> Any:
        reason = f"{type(exc).__name__}: {exc}"
        log.warning("LLM %s step failed (%s); the %s policy answers this step", decision, clip(reason, 300),
                    getattr(self.fallback, "name", "fallback"))
        self.events.append({"event": "fallback", "kind": "event", "decision": decision,
                            "error_type": type(exc).__name__, "reason": clip(reason, 500),
                            "fallback": getattr(self.fallback, "name", type(self.fallback).__name__)})
        return answer()

    def _count(self, message: Any) -> dict:
        before = self.usage.model_dump()
        self.usage.add(message)
        after = self.usage.model_dump()
        return {k: after[k] - before[k] for k in after}

    def _structured(self, decision: str, system: str, prompt: str, schema: type[BaseModel]) -> BaseModel:
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
                out = runnable.invoke(messages)
            except Exception as exc:
                if not _is_bad_request(exc):
                    raise
                # The server rejects structured-output requests (response_format / tools): ask
                # for JSON in the text from now on, and answer this step that way.
                self.structured_output = "json"
                self.events.append({"event": "structured_output_switch", "kind": "event", "decision": decision,
                                    "reason": clip(f"{type(exc).__name__}: {exc}", 500), "mode": "json"})
                log.warning("the model server rejected a structured-output request (%s); using JSON in text",
                            clip(str(exc), 200))
                return self._structured(decision, system, prompt, schema)
            raw, parsed, error = (out.get("raw"), out.get("parsed"), out.get("parsing_error")) \
                if isinstance(out, dict) and "raw" in out else (None, out, None)
            usage = self._count(raw) if raw is not None else {}
            reply = message_text(raw) if raw is not None else ""
            if raw is not None and not reply and getattr(raw, "tool_calls", None):
                reply = json.dumps(raw.tool_calls[0].get("args", {}), default=str)
            self._record_call(decision, prompt, reply or json.dumps(_as_jsonable(parsed), default=str), [], usage)
            if parsed is None:
                if not reply:
                    raise InvalidAnswer(f"unparsable structured answer ({error})")
                parsed = extract_json(reply)
        else:
            schema_text = json.dumps(schema.model_json_schema(), separators=(",", ":"))
            messages[-1] = HumanMessage(content=prompt + "\n\nJSON schema of the answer: " + schema_text)
            reply_msg = self.model.invoke(messages)
            usage = self._count(reply_msg)
            reply = message_text(reply_msg)
            self._record_call(decision, prompt, reply, [], usage)
            parsed = extract_json(reply)
        if isinstance(parsed, schema):
            return parsed
        try:
            return schema.model_validate(_as_jsonable(parsed))
        except ValidationError as exc:
            raise InvalidAnswer(f"answer does not fit {schema.__name__}: {clip(str(exc), 400)}") from None

    def _converse_with_tools(self, decision: str, system: str, prompt: str) -> str:
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
        calls_log: list[dict] = []
        usage: dict[str, int] = {}
        reply = None
        for round_no in range(self.max_tool_rounds + 1):
            reply = runnable.invoke(messages)
            for k, v in self._count(reply).items():
                usage[k] = usage.get(k, 0) + v
            messages.append(reply)
            tool_calls = list(getattr(reply, "tool_calls", None) or [])
            if not tool_calls:
                break
            last_round = round_no == self.max_tool_rounds
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
                calls_log.append({"name": name, "args": {k: clip(str(v), 300) for k, v in args.items()},
                                  "result": clip(result, 600)})
                messages.append(ToolMessage(content=clip(result, 8000), tool_call_id=call.get("id") or name or "call"))
            if last_round:
                reply = self.model.invoke(messages)  # unbound: no more tool calls possible
                for k, v in self._count(reply).items():
                    usage[k] = usage.get(k, 0) + v
                break
        text = message_text(reply)
        self._record_call(decision, prompt, text, calls_log, usage)
        return text

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
        try:
            prompt = plan_prompt(inp, max_history=self.max_history)
            decision = self._structured("plan", load_prompt("planner"), prompt, PlanDecision)
            problems = validate_plan(decision, inp)
            if problems:
                raise InvalidAnswer("invalid plan: " + "; ".join(problems[:4]))
            if decision.action == "stop":
                return decision.model_copy(update={"candidates": []})
            if inp.budget_left > 0 and len(decision.candidates) > inp.budget_left:
                decision = decision.model_copy(update={"candidates": decision.candidates[: inp.budget_left]})
            return decision
        except Exception as exc:
            return self._fallback("plan", exc, lambda: self.fallback.plan(inp))

    def code(self, spec: CandidateSpec, template_source: str, feedback: str | None = None) -> CodeProposal:
        # Only origin "llm" asks the model to write code. A plain template instance ("template":
        # the planner chose parameters, not new code) is instantiated as is, a kernel remembered
        # from an earlier run is reused exactly as stored ("ditto"), and a full source the
        # planner already wrote needs no second opinion: the fallback policy does all three.
        if spec.origin != "llm" or (spec.source and is_complete_source(spec.source)):
            return self.fallback.code(spec, template_source, feedback)
        try:
            prompt = code_prompt(spec, template_source, feedback, self.context)
            text = self._converse_with_tools("code", load_prompt("coder"), prompt)
            source = extract_python(text)
            if source is None:
                raise InvalidAnswer("the reply has no ```python block defining prepare() and spmm(): "
                                    f"{clip(text.strip(), 200)!r}")
            prose = _FENCE.sub("", text).strip().splitlines()
            rationale = clip(prose[0].strip(), 300) if prose else f"LLM-written {spec.template} variant"
            return CodeProposal(source=source, rationale=rationale, origin="llm")
        except Exception as exc:
            return self._fallback("code", exc, lambda: self.fallback.code(spec, template_source, feedback))

    def diagnose(self, failure: FailureReport, source: str) -> Diagnosis:
        try:
            known = self._known_templates()
            prompt = diagnose_prompt(failure, source, known)
            diag = self._structured("diagnose", load_prompt("debugger"), prompt, Diagnosis)
            if diag.source:
                fixed = extract_python(diag.source) if "```" in diag.source else diag.source
                diag = diag.model_copy(update={"source": fixed or diag.source})
            problems = validate_diagnosis(diag, known)
            if problems:
                raise InvalidAnswer("invalid diagnosis: " + "; ".join(problems))
            return diag
        except Exception as exc:
            return self._fallback("diagnose", exc, lambda: self.fallback.diagnose(failure, source))


def _is_bad_request(exc: BaseException) -> bool:
    """An HTTP 400 from the model server (e.g. openai.BadRequestError): the request shape, not the
    connection, is the problem."""
    return "BadRequest" in type(exc).__name__ or getattr(exc, "status_code", None) == 400


def _as_jsonable(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump()
    return obj
