"""Coder node: turn the planned candidate into kernel source.

With the expert policy that is a template instance (the template file with its ``PARAMS`` line
rewritten); with an LLM policy it is whatever complete source the model returns, possibly an edit
of the template informed by the debugger's feedback. Either way the source then goes through the
same static checks, sandboxed verification and benchmarks: the coder is trusted with nothing.

A source that arrives ready (a memory exact hit, an LLM plan that carried code, a debugger's
``retry_source`` fix) is used as is on its first attempt.
"""
from __future__ import annotations

from typing import Literal

from langgraph.runtime import Runtime
from langgraph.types import Command

from sparseditto.agents.policy import CandidateSpec
from sparseditto.graphs.state import (
    Context,
    State,
    call_policy,
    decision,
    effective_context,
    emit,
    policy_events,
    policy_for_step,
    record_step,
    run_hook,
)


def template_source(name: str) -> str:
    """The template's default instance (what an LLM edits); '' for names not in the registry."""
    try:
        from sparseditto.kernel_templates.registry import get_template

        t = get_template(name)
        if getattr(t, "backend", None) == "builtin":
            return ""
        return t.instantiate({}).source
    except Exception:
        return ""


def make_candidate(spec: dict, source: str, origin: str):
    """The harness's `Candidate` for this source: the registry's own instance when the source is
    the plain template instance, else a candidate built around the given source."""
    from sparseditto.kernel_templates.registry import Candidate, get_template

    template = None
    try:
        template = get_template(spec["template"])
    except Exception:
        template = None
    if template is not None and origin != "llm":
        try:
            inst = template.instantiate(spec.get("params") or {})
            if inst.source == source:
                return inst.model_copy(update={"origin": origin}) if hasattr(inst, "model_copy") else inst
        except Exception:
            pass
    backend = getattr(template, "backend", None) if template is not None else None
    if backend in (None, "builtin"):
        backend = "cuda" if "RawModule" in source or "RawKernel" in source else "triton"
    fields = dict(template=spec["template"], params=spec.get("params") or {}, source=source,
                  backend=backend, origin=origin,
                  format=getattr(template, "format", None) if template is not None else None)
    known = getattr(Candidate, "model_fields", None)
    if known:
        fields = {k: v for k, v in fields.items() if k in known}
    return Candidate(**fields)


def format_feedback(failure: dict | None) -> str | None:
    if not failure:
        return None
    parts = [f"previous attempt failed: {failure.get('status')}"]
    if failure.get("failure_class"):
        parts.append(f"class {failure['failure_class']}")
    if failure.get("message"):
        parts.append(str(failure["message"])[:2000])
    if failure.get("log"):
        parts.append("log tail:\n" + str(failure["log"])[-3000:])
    if failure.get("diagnosis"):
        parts.append(f"debugger: {failure['diagnosis']}")
    return "\n".join(parts)


def coder(state: State, runtime: Runtime[Context]) -> Command[Literal["debugger", "planner"]]:
    ctx = effective_context(runtime.context, state)
    run_hook(ctx, "coder", state)
    current = dict(state["current"])
    spec = dict(current["spec"])
    events: list[dict] = []
    usage: dict = {}
    origin = spec.get("origin") or "template"
    try:
        if current.get("fixed_source"):
            source, why, origin = current["fixed_source"], "use the debugger's fixed source", "llm"
        elif spec.get("source") and current.get("attempt", 1) == 1:
            source, why = spec["source"], f"use the ready {origin} source"
        else:
            policy = policy_for_step(ctx, state)
            proposal, events, usage = call_policy(
                policy, "code", CandidateSpec.model_validate(spec), template_source(spec["template"]),
                format_feedback(current.get("last_failure")), node="coder")
            events = policy_events(ctx, state, "coder", events)
            source, why = proposal.source, proposal.rationale or f"{policy.name} wrote {spec['template']}"
            if proposal.origin == "llm":
                origin = "llm"
        candidate = make_candidate(spec, source, origin)
    except (ValueError, LookupError) as exc:
        # No source could be made: an unknown template or illegal parameters (from a plan or a
        # debugger's retry). A failed candidate, not a crashed graph: back to the planner.
        return _codegen_failed(ctx, state, current, spec, origin, exc, events, usage)
    current.update(source=source, source_hash=candidate.source_hash, backend=candidate.backend, origin=origin,
                   fixed_source=None, format=getattr(candidate, "format", None))
    d = decision("coder", "code", why, template=spec["template"], attempt=current.get("attempt", 1),
                 source_hash=candidate.source_hash)
    emit("coder", f"{spec['template']} attempt {current.get('attempt', 1)}: {why} "
                  f"({len(source.splitlines())} lines, {candidate.source_hash[:10]})")
    record_step(ctx, state, "coder", "code", {**d, "origin": origin, "params": spec.get("params") or {}})
    return Command(goto="debugger", update={"current": current, "decisions": [d], "events": events,
                                            "token_usage": usage})


def _codegen_failed(ctx: Context, state: dict, current: dict, spec: dict, origin: str, exc: Exception,
                    events: list, usage: dict) -> Command:
    why = f"{spec['template']} {spec.get('params') or {}}: no source could be generated ({exc})"
    record = {"index": current.get("index"), "attempt": current.get("attempt", 1), "template": spec["template"],
              "params": spec.get("params") or {}, "origin": origin, "rationale": spec.get("rationale", ""),
              "source": None, "source_hash": None, "status": "codegen_error", "failure_class": "invalid_spec",
              "message": str(exc)[:2000], "expected_ms": spec.get("expected_ms")}
    d = decision("coder", "give_up", why, template=spec["template"], attempt=current.get("attempt", 1))
    emit("coder", why)
    record_step(ctx, state, "coder", "feedback", {**d, "status": "codegen_error"})
    return Command(goto="planner", update={"candidates": [record], "current": None, "decisions": [d],
                                           "events": events, "token_usage": usage})
