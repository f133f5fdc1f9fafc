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

from sparseditto.agents.kit import call_policy, decision, emit, policy_events, policy_for_step, record_step, run_hook
from sparseditto.agents.policy import CandidateSpec
from sparseditto.agents.records import build_record, make_candidate
from sparseditto.agents.state import Context, State, effective_context


def template_source(name: str) -> str:
    """The template's default instance (what an LLM edits); '' for dense and for names not in the
    registry (an LLM's own kernel)."""
    from sparseditto.kernel_templates.registry import get_template

    try:
        t = get_template(name)
    except ValueError:
        return ""
    return "" if t.backend == "builtin" else t.instantiate({}).source


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
        return _codegen_failed(ctx, state, {**current, "origin": origin}, exc, events, usage)
    current.update(source=source, source_hash=candidate.source_hash, backend=candidate.backend, origin=origin,
                   fixed_source=None, format=candidate.format)
    d = decision("coder", "code", why, template=spec["template"], attempt=current.get("attempt", 1),
                 source_hash=candidate.source_hash)
    emit("coder", f"{spec['template']} attempt {current.get('attempt', 1)}: {why} "
                  f"({len(source.splitlines())} lines, {candidate.source_hash[:10]})")
    record_step(ctx, state, "coder", "code", {**d, "origin": origin, "params": spec.get("params") or {}})
    return Command(goto="debugger", update={"current": current, "decisions": [d], "events": events,
                                            "token_usage": usage})


def _codegen_failed(ctx: Context, state: dict, current: dict, exc: Exception, events: list, usage: dict) -> Command:
    spec = current["spec"]
    why = f"{spec['template']} {spec.get('params') or {}}: no source could be generated ({exc})"
    # no source came out of this attempt (a retry's `current` may still carry the previous one's)
    record = build_record(current, "codegen_error", failure_class="invalid_spec", message=str(exc)[:2000],
                          source=None, source_hash=None, backend=None)
    d = decision("coder", "give_up", why, template=spec["template"], attempt=current.get("attempt", 1))
    emit("coder", why)
    record_step(ctx, state, "coder", "feedback", {**d, "status": "codegen_error"})
    return Command(goto="planner", update={"candidates": [record.model_dump(mode="json")], "current": None,
                                           "decisions": [d], "events": events, "token_usage": usage})
