"""Debugger node: prove the candidate right, or find out why it is wrong and what to do about it.

Every candidate, whoever wrote it (template, memory, LLM), passes the same gate: static checks
(no vendor GEMM, no I/O, no escapes), compilation, and a sandboxed run verified against an fp64
reference on fresh random values, at the requested N values plus an odd N (tails and masks are
where kernels break). A failure is classified by the policy (`Diagnosis`) and routed:

* ``retry_params``  -> coder with the new parameters (e.g. smaller tiles on shared-memory overflow)
* ``retry_source``  -> coder with a fixed source (LLM policy)
* ``switch_template`` -> planner, with the suggested template pinned first
* ``give_up``       -> planner, which moves on

Retries are bounded by ``max_debug_attempts``; every failed attempt is recorded with its class.
"""
from __future__ import annotations

from typing import Any, Literal

from langgraph.runtime import Runtime
from langgraph.types import Command

from sparseditto.agents.kit import ask_policy, decision, emit, record_step, remember_candidate, run_hook
from sparseditto.agents.policy import FailureReport
from sparseditto.agents.records import build_record, candidate_of
from sparseditto.agents.state import Context, State, effective_context, resolved_backend, verify_n_values

LOG_TAIL = 4000


def check_candidate(candidate, matrix, ctx: Context) -> dict:
    """Static checks, compile, run and verify. Returns a plain dict: ok, status, message, log, ...

    The static checks run first (in-process, milliseconds, once per source: the harness's later
    gates reuse the verdict) so a cheating or malformed source never reaches a worker; compilation
    and the numeric checks run in the harness's sandboxed worker (a crash or an illegal address
    kills the worker, not the graph).
    """
    from sparseditto import harness

    backend = resolved_backend(ctx)
    static = harness.check_source(candidate.source)
    if not static.ok:
        why = static.syntax_error or "; ".join(static.violations) or "rejected"
        status = "compile_error" if static.syntax_error else "static_rejected"
        return {"ok": False, "status": status, "failure_class": "syntax_error" if static.syntax_error else
                "static_violation", "message": f"static checks: {why}", "log": "",
                "violations": list(static.violations)}
    # On a GPU, compile against the real matrix (Triton JIT-compiles on first launch); on the
    # interpreter there is nothing to compile beyond the import, and a trial launch would cost as
    # much as the verification that follows.
    comp = harness.compile_candidate(candidate, backend=backend, matrix=matrix if backend == "cuda" else None,
                                     dtype=ctx.dtype, timeout=ctx.verify_timeout_s)
    if not comp.ok:
        return {"ok": False, "status": "compile_error", "failure_class": comp.failure_class or "compile_error",
                "message": _first_lines(comp.log), "log": comp.log[-LOG_TAIL:], "violations": list(comp.violations)}
    # No seed: the harness draws a fresh one per verification (ctx.seed is for pattern-file values;
    # a predictable verification input is one a kernel can recognise). The result records it.
    vr = harness.run_and_verify(candidate, matrix, n_values=verify_n_values(ctx), dtype=ctx.dtype, backend=backend,
                                timeout=ctx.verify_timeout_s)
    out = vr.model_dump(mode="json")
    out["log"] = (out.get("log") or "")[-LOG_TAIL:]
    return out


def _first_lines(text: str, n: int = 3, limit: int = 600) -> str:
    lines = [ln for ln in (text or "").splitlines() if ln.strip()]
    # Compiler errors put the useful line last more often than first.
    picked = lines[-n:] if lines else []
    return "\n".join(picked)[:limit]


def debugger(state: State, runtime: Runtime[Context]) -> Command[Literal["coder", "profiler", "planner"]]:
    ctx = effective_context(runtime.context, state)
    run_hook(ctx, "debugger", state)
    from sparseditto.artifacts import get_matrix

    current = dict(state["current"])
    spec = current["spec"]
    attempt = int(current.get("attempt", 1))
    matrix = get_matrix(state["matrix_key"])
    emit("debugger", f"verifying {spec['template']} (attempt {attempt}) on {resolved_backend(ctx)} at N="
                     f"{verify_n_values(ctx)}")
    outcome = check_candidate(candidate_of(current), matrix, ctx)

    if outcome["ok"]:
        checks = outcome.get("checks") or []
        worst = max((c.get("tol_ratio", 0.0) for c in checks), default=0.0)
        why = (f"{spec['template']} verified: {len(checks)} numeric checks at N={verify_n_values(ctx)}, "
               f"worst error {worst:.2f} of tolerance")
        d = decision("debugger", "verified", why, template=spec["template"], attempt=attempt)
        emit("debugger", why)
        record_step(ctx, state, "debugger", "feedback", {**d, "status": "verified"})
        current["verify"] = {"status": "verified", "checks": len(checks), "worst_tol_ratio": worst,
                             "seconds": outcome.get("seconds")}
        return Command(goto="profiler", update={"current": current, "decisions": [d]})

    # ---- failure: classify, record, route ---------------------------------------------------------
    failure = FailureReport(template=spec["template"], params=spec.get("params") or {}, status=outcome["status"],
                            failure_class=outcome.get("failure_class"), message=outcome.get("message") or "",
                            log=outcome.get("log") or "", attempt=attempt)
    diag, llm = ask_policy(ctx, state, "diagnose", failure, current["source"], node="debugger")
    failure_class = diag.failure_class or outcome.get("failure_class") or outcome["status"]
    record = build_record(current, outcome["status"], failure_class=failure_class,
                          message=(outcome.get("message") or "")[:4000], diagnosis=diag.rationale)
    remember_candidate(ctx, state, record, "debugger")

    can_retry = attempt <= ctx.max_debug_attempts
    update: dict[str, Any] = {"candidates": [record.model_dump(mode="json")], **llm}
    last_failure = {"status": outcome["status"], "failure_class": failure_class,
                    "message": record.message, "log": outcome.get("log", "")[-LOG_TAIL:],
                    "diagnosis": diag.rationale}
    if diag.action == "retry_params" and diag.params and can_retry:
        new_spec = dict(spec, params=diag.params, source=None,
                        rationale=f"{spec.get('rationale', '')} [retry: {diag.rationale}]".strip())
        nxt = dict(current, spec=new_spec, attempt=attempt + 1, last_failure=last_failure, source=None)
        goto, action = "coder", "retry_params"
    elif diag.action == "retry_source" and can_retry:
        nxt = dict(current, attempt=attempt + 1, last_failure=last_failure, fixed_source=diag.source)
        goto, action = "coder", "retry_source"
    else:
        nxt = None
        goto = "planner"
        action = diag.action if diag.action in ("switch_template", "give_up") else "give_up"
        if diag.action in ("retry_params", "retry_source") and not can_retry:
            action = "give_up"
        if action == "switch_template" and diag.template and diag.template != spec["template"]:
            update["queue"] = [{"template": diag.template, "params": {}, "origin": "template", "pinned": True,
                                "rationale": f"debugger: switch from {spec['template']} ({diag.rationale})"}] + \
                list(state.get("queue") or [])
    why = f"{spec['template']} attempt {attempt} failed ({failure_class}): {diag.rationale}"
    if diag.action in ("retry_params", "retry_source") and not can_retry:
        why += f"; out of debug attempts ({ctx.max_debug_attempts})"
    d = decision("debugger", action, why, template=spec["template"], attempt=attempt, failure_class=failure_class)
    emit("debugger", why)
    record_step(ctx, state, "debugger", "feedback", {**d, "status": outcome["status"],
                                                 "message": record.message[:1000]})
    update.update(current=nxt, decisions=[d])
    return Command(goto=goto, update=update)
