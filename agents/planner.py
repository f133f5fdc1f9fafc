"""Planner node: decide what to try next.

The planner is visited first (it sends the run to the analyzer), then after the analysis and after
every profiled or abandoned candidate. Each visit after the analysis it hands the policy a
`PlanningInput` (applicable templates with roofline estimates at the main N, memory hits, what was
tried, the best so far, dense's time, the budget left) and routes on the answer: "try" -> coder,
"stop" -> finalize. Mechanical limits (candidate budget, wall-clock budget) are enforced here,
not left to the policy, so no policy can run away with the machine.
"""
from __future__ import annotations

import time
from typing import Literal

from langgraph.runtime import Runtime
from langgraph.types import Command

from sparseditto.agents.costing import arch_exclusion_line, arch_exclusions, runnable_templates, template_table
from sparseditto.agents.kit import (ask_policy, decision, emit, measured_target, plan_target, policy_name,
                                    record_step, run_hook, run_lessons)
from sparseditto.agents.policy import PlanningInput
from sparseditto.agents.records import kernel_profile, record_key, spec_key, tried
from sparseditto.agents.state import (Context, State, effective_context, main_n, resolved_backend,
                                      resolved_budget)


def planning_input(state: dict, ctx: Context) -> PlanningInput:
    target, note = plan_target(ctx)
    backend = resolved_backend(ctx)
    measuring = measured_target(ctx)
    table, roof_ms = template_table(state["report"], main_n(ctx), ctx.dtype, target, measuring, backend)
    first_visit = not state.get("candidates")
    left_out = arch_exclusions(target, measuring) if backend == "cuda" else {}
    if first_visit and left_out:
        emit("planner", f"left out: {arch_exclusion_line(left_out)}")
    table = runnable_templates(table, backend, announce=first_visit)
    # the memory is keyed by the GPU that measured, not the target: an H200 run's tc_words must not reach
    # the policy (an LLM reads every hit) for a run that plans for an A100 on the same H200 (exact hits of
    # such templates never settle: costing.exact_hit_usable; this drops the neighbours too)
    hits = [h for h in state.get("memory_hits") or [] if h.get("template") not in left_out]
    tdict = target.model_dump(mode="json")
    tdict.update(backend=backend, timings_are_gpu=backend == "cuda", note=note)
    best = state.get("best")
    dense = state.get("dense") or {}
    return PlanningInput(
        report=_compact_report(state["report"]), target=tdict, n_values=list(ctx.n_values), dtype=ctx.dtype,
        memory_hits=hits, tried=tried(list(state.get("candidates") or [])),
        best=tried([best])[0] if best else None, dense_ms=dense.get("median_ms"),
        roofline_ms=roof_ms, budget_left=resolved_budget(ctx) - int(state.get("iteration") or 0),
        templates=table, best_kernel=kernel_profile(best, (state.get("report") or {}).get("nnz")),
        lessons=run_lessons(ctx, state))


def _compact_report(report: dict) -> dict:
    """The report without its bulky histograms (what a plan needs, and what fits in a prompt)."""
    drop = {"row_stats", "col_stats", "blocks", "evidence"}
    out = {k: v for k, v in report.items() if k not in drop}
    for key in ("row_stats", "col_stats"):
        stats = report.get(key)
        if isinstance(stats, dict):
            out[key] = {k: v for k, v in stats.items() if not isinstance(v, (list, dict))}
    return out


def planner(state: State, runtime: Runtime[Context]) -> Command[Literal["analyzer", "coder", "finalize"]]:
    """Route: analyze first, then ask the policy for the next candidate or stop."""
    ctx = effective_context(runtime.context, state)
    run_hook(ctx, "planner", state)
    if not state.get("report"):
        d = decision("planner", "analyze", "first visit: the pattern report must come before any kernel choice")
        emit("planner", d["rationale"])
        return Command(goto="analyzer", update={"decisions": [d]})

    iteration = int(state.get("iteration") or 0)
    budget = resolved_budget(ctx)
    started = state.get("started_at") or time.time()
    if iteration >= budget:
        return _stop(state, ctx, f"budget exhausted: {iteration} of {budget} candidates tried")
    if ctx.time_budget_s is not None and time.time() - started > ctx.time_budget_s:
        return _stop(state, ctx, f"time budget of {ctx.time_budget_s:.0f} s used up after {iteration} candidates")

    done = {record_key(r) for r in state.get("candidates") or []}
    queue = [q for q in (state.get("queue") or []) if spec_key(q) not in done]
    llm: dict = {}   # what asking the policy added: events, llm_calls, token_usage
    pinned = [q for q in queue if q.get("pinned")]
    if pinned:
        spec = pinned[0]
        rest = [q for q in queue if q is not spec]
        d = decision("planner", "try", spec.get("rationale") or f"pinned candidate {spec['template']}",
                     template=spec["template"], params=spec.get("params") or {}, origin=spec.get("origin"))
    else:
        plan, llm = ask_policy(ctx, state, "plan", planning_input(state, ctx), node="planner")
        if plan.action == "stop":
            return _stop(state, ctx, plan.rationale, llm)
        fresh = [c.model_dump(mode="json") for c in plan.candidates]
        if fresh and all(c["template"] == "dense" for c in fresh):
            return _stop(state, ctx, f"the policy chose dense ({plan.rationale})", llm)
        # dense is measured with every benchmark already; it is never a candidate to code
        fresh = [c for c in fresh if spec_key(c) not in done and c["template"] != "dense"]
        if not fresh:
            return _stop(state, ctx, f"the policy proposed only candidates already tried ({plan.rationale})", llm)
        spec, rest = fresh[0], fresh[1:]
        d = decision("planner", "try", plan.rationale, template=spec["template"], params=spec.get("params") or {},
                     origin=spec.get("origin"), policy=policy_name(ctx, state))
    spec = {k: v for k, v in spec.items() if k != "pinned"}
    emit("planner", f"candidate {iteration + 1}/{budget}: {spec['template']} {spec.get('params') or {}} "
                    f"- {d['rationale']}")
    record_step(ctx, state, "planner", "decision", d)
    current = {"spec": spec, "attempt": 1, "last_failure": None, "index": iteration + 1}
    return Command(goto="coder", update={
        "current": current, "queue": rest, "iteration": iteration + 1, "decisions": [d], **llm})


def _stop(state: dict, ctx: Context, why: str, llm: dict | None = None) -> Command:
    d = decision("planner", "stop", why)
    emit("planner", f"stop: {why}")
    record_step(ctx, state, "planner", "decision", d)
    return Command(goto="finalize", update={"decisions": [d], "stop_reason": d["rationale"], "queue": [],
                                            "current": None, **(llm or {})})
