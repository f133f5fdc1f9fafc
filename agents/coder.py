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

from sparseditto.agents.kit import (ask_policy, decision, emit, plan_target, policy_name, record_step, run_hook,
                                    run_lessons)
from sparseditto.agents.policy import CandidateSpec, CodingBrief
from sparseditto.agents.records import build_record, kernel_profile, make_candidate
from sparseditto.agents.state import Context, State, effective_context, resolved_backend


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


def coding_brief(ctx: Context, state: dict) -> CodingBrief:
    """What the coder is told beyond the spec: the current best kernel and its profile, the
    memory's lessons for this pattern, the target and the execution backend."""
    target, _ = plan_target(ctx)
    return CodingBrief(best=kernel_profile(state.get("best"), (state.get("report") or {}).get("nnz")),
                       lessons=run_lessons(ctx, state), target=target.name, backend=resolved_backend(ctx))


def coder(state: State, runtime: Runtime[Context]) -> Command[Literal["debugger", "planner"]]:
    ctx = effective_context(runtime.context, state)
    run_hook(ctx, "coder", state)
    current = dict(state["current"])
    spec = dict(current["spec"])
    llm: dict = {}   # what asking the policy added: events, llm_calls, token_usage
    origin = spec.get("origin") or "template"
    try:
        if current.get("fixed_source"):
            source, why, origin = current["fixed_source"], "use the debugger's fixed source", "llm"
        elif spec.get("source") and current.get("attempt", 1) == 1:
            source, why = spec["source"], f"use the ready {origin} source"
        else:
            proposal, llm = ask_policy(
                ctx, state, "code", CandidateSpec.model_validate(spec), template_source(spec["template"]),
                format_feedback(current.get("last_failure")), coding_brief(ctx, state), node="coder")
            why = proposal.rationale or f"{policy_name(ctx, state)} wrote {spec['template']}"
            source = proposal.source
            origin = proposal.origin   # "template" when the fallback instantiated the template instead
        candidate = make_candidate(spec, source, origin)
    except (ValueError, LookupError) as exc:
        # No source could be made: an unknown template or illegal parameters (from a plan or a
        # debugger's retry). A failed candidate, not a crashed graph: back to the planner.
        return _codegen_failed(ctx, state, {**current, "origin": origin}, exc, llm)
    current.update(source=source, source_hash=candidate.source_hash, backend=candidate.backend, origin=origin,
                   fixed_source=None, format=candidate.format)
    d = decision("coder", "code", why, template=spec["template"], attempt=current.get("attempt", 1),
                 source_hash=candidate.source_hash)
    emit("coder", f"{spec['template']} attempt {current.get('attempt', 1)}: {why} "
                  f"({len(source.splitlines())} lines, {candidate.source_hash[:10]})")
    record_step(ctx, state, "coder", "code", {**d, "origin": origin, "params": spec.get("params") or {}})
    return Command(goto="debugger", update={"current": current, "decisions": [d], **llm})


def _codegen_failed(ctx: Context, state: dict, current: dict, exc: Exception, llm: dict) -> Command:
    spec = current["spec"]
    why = f"{spec['template']} {spec.get('params') or {}}: no source could be generated ({exc})"
    # no source came out of this attempt (a retry's `current` may still carry the previous one's)
    record = build_record(current, "codegen_error", failure_class="invalid_spec", message=str(exc)[:2000],
                          source=None, source_hash=None, backend=None)
    d = decision("coder", "give_up", why, template=spec["template"], attempt=current.get("attempt", 1))
    emit("coder", why)
    record_step(ctx, state, "coder", "feedback", {**d, "status": "codegen_error"})
    return Command(goto="planner", update={"candidates": [record.model_dump(mode="json")], "current": None,
                                           "decisions": [d], **llm})
