"""Planner and finalize nodes: decide what to try next, and what the answer is.

The planner is visited first (it sends the run to the analyzer), then after the analysis and after
every profiled or abandoned candidate. Each visit after the analysis it hands the policy a
`PlanningInput` (applicable templates with roofline estimates at the main N, memory hits, what was
tried, the best so far, dense's time, the budget left) and routes on the answer: "try" -> coder,
"stop" -> finalize. Mechanical limits (candidate budget, wall-clock budget) are enforced here,
not left to the policy, so no policy can run away with the machine.

`finalize` picks the answer honestly: the fastest verified candidate only if it beats dense
measured in the same benchmark run (on the Triton interpreter, where timings are CPU timings, the
roofline cost model on the target decides and the result says so); else dense with the reason.
"""
from __future__ import annotations

import json
import threading
import time
from typing import Any, Literal

from langgraph.graph import END
from langgraph.runtime import Runtime
from langgraph.types import Command, interrupt

from sparseditto.agents.expert import params_key
from sparseditto.agents.policy import CandidateSpec, PlanningInput, TriedCandidate
from sparseditto.graphs.state import (
    Context,
    State,
    call_policy,
    decision,
    effective_context,
    emit,
    forget_run,
    main_n,
    policy_events,
    policy_for_step,
    resolved_backend,
    record_step,
    resolved_budget,
    run_hook,
    run_memory,
    run_policy,
)

GRID_LIMIT = 6
# A sparse kernel replaces dense only with a margin: a 1% "win" is timing noise (measured) or
# model error (cost model), and dense is the safer kernel to ship.
MEASURED_MARGIN = 1.02     # measured speedup over dense in the same run must exceed this
MODEL_MARGIN = 0.95        # cost-model estimate must be below this fraction of dense's


# ---- target and template tables -----------------------------------------------------------------

def plan_target(ctx: Context):
    """(Target the plan is for, note). 'auto' without a GPU falls back to A100 with a note."""
    from sparseditto.targets import resolve_target

    return resolve_target(ctx.target, fallback="A100")


def measured_target(ctx: Context):
    """The Target of the GPU that actually runs the benchmarks (None on the interpreter)."""
    if resolved_backend(ctx) != "cuda":
        return None
    from sparseditto.targets import detect_local_target

    try:
        return detect_local_target()
    except Exception:
        return None


def report_model(report: dict):
    from sparseditto.analysis import PatternReport

    return PatternReport.model_validate(report)


def _template_names() -> list[str]:
    from sparseditto.kernel_templates.registry import list_templates

    out = []
    for t in list_templates():
        out.append(t if isinstance(t, str) else t.name)
    return out


def _estimate(template, report, n: int, dtype: str, target, params: dict) -> Any:
    return template.cost(report, n, dtype, target, params)


_TABLE_CACHE: dict[tuple, tuple[list[dict], float | None]] = {}
_TABLE_LOCK = threading.Lock()


def template_table(report: dict, n: int, dtype: str, target, measure_target=None,
                   exec_backend: str = "cuda") -> tuple[list[dict], float | None]:
    """Applicable templates with roofline estimates at N on `target`, best grid point first.

    Returns (table, roofline_ms): roofline_ms is the best estimate of any applicable format,
    including dense, on the GPU that measures (the plan target when nothing measures). The dense
    entry carries ``builtin: True``. On the interpreter (``exec_backend='interpret'``) CUDA C++
    templates are left out: they cannot run there. Cached per (signature, N, dtype, targets).
    """
    key = (report.get("signature"), report.get("shape") and tuple(report["shape"]), n, dtype, target.name,
           measure_target.name if measure_target is not None else None, exec_backend)
    with _TABLE_LOCK:
        hit = _TABLE_CACHE.get(key)
    if hit is not None:
        return json.loads(json.dumps(hit[0])), hit[1]
    from sparseditto.kernel_templates.registry import get_template

    rep = report_model(report)
    table: list[dict] = []
    roof_ms: float | None = None
    for name in _template_names():
        t = get_template(name)
        backend = getattr(t, "backend", None)
        if backend == "cuda" and exec_backend != "cuda":
            continue
        ok, reason = t.applicable(rep)
        if not ok:
            continue
        meta = getattr(t, "meta", None) or {}
        entry: dict[str, Any] = {
            "name": name, "backend": backend, "format": getattr(t, "format", None),
            "description": getattr(t, "description", ""), "applicable_reason": reason,
            "patterns": list(meta.get("patterns") or getattr(t, "patterns", None) or []),
            "params": {k: list(v) for k, v in (getattr(t, "params", None) or {}).items()},
            "default_params": dict(meta.get("defaults") or getattr(t, "defaults", None) or {}),
            "builtin": backend == "builtin" or name == "dense",
        }
        try:
            grid = t.param_grid(rep, n, target, limit=GRID_LIMIT) if not entry["builtin"] else [{}]
        except TypeError:
            grid = t.param_grid(rep, n, target)[:GRID_LIMIT]
        points = []
        for params in grid or [entry["default_params"]]:
            est = _estimate(t, rep, n, dtype, target, params)
            points.append({"params": dict(params), "estimate_ms": est.seconds * 1e3, "bound": est.bound,
                           "bytes": float(est.bytes)})
        points.sort(key=lambda p: p["estimate_ms"])
        best = points[0]
        entry.update(estimate_ms=best["estimate_ms"], bound=best["bound"], bytes=best["bytes"],
                     unit=getattr(_estimate(t, rep, n, dtype, target, best["params"]), "unit", None),
                     grid=points)
        if measure_target is not None:
            on_gpu = _estimate(t, rep, n, dtype, measure_target, best["params"]).seconds * 1e3
        else:
            on_gpu = best["estimate_ms"]
        roof_ms = on_gpu if roof_ms is None else min(roof_ms, on_gpu)
        table.append(entry)
    if not any(e["name"] == "dense" for e in table):
        from sparseditto.targets import dense_gemm_roofline

        m, k = report["shape"]
        est = dense_gemm_roofline(target, m, k, n, dtype)
        table.append({"name": "dense", "builtin": True, "backend": "builtin", "format": "dense",
                      "description": "torch.matmul (cuBLAS) on the dense matrix", "estimate_ms": est.seconds * 1e3,
                      "bound": est.bound, "bytes": est.bytes, "grid": [], "params": {}, "default_params": {},
                      "patterns": []})
        gpu_est = dense_gemm_roofline(measure_target or target, m, k, n, dtype).seconds * 1e3
        roof_ms = gpu_est if roof_ms is None else min(roof_ms, gpu_est)
    with _TABLE_LOCK:
        _TABLE_CACHE[key] = (json.loads(json.dumps(table)), roof_ms)
    return table, roof_ms


def template_estimate(table: list[dict], template: str, params: dict) -> float | None:
    """The table's estimate for this exact parameter set, else the template's best estimate."""
    for t in table:
        if t["name"] != template:
            continue
        for p in t.get("grid") or []:
            if params_key(template, p["params"]) == params_key(template, params):
                return p["estimate_ms"]
        return t.get("estimate_ms")
    return None


# ---- planner node ---------------------------------------------------------------------------------

def tried_from_records(records: list[dict]) -> list[TriedCandidate]:
    out = []
    for r in records:
        out.append(TriedCandidate(
            template=r.get("template", "?"), params=r.get("params") or {}, status=r.get("status", "?"),
            failure_class=r.get("failure_class"), median_ms=r.get("median_ms"),
            speedup_vs_dense=r.get("speedup_vs_dense"), pct_of_roofline=r.get("pct_of_roofline"),
            bottleneck=r.get("bottleneck")))
    return out


def record_key(rec: dict) -> str:
    if rec.get("origin") == "llm" and rec.get("source_hash"):
        return "src:" + rec["source_hash"]
    return params_key(rec.get("template", "?"), rec.get("params"))


def spec_key(spec: dict) -> str:
    if spec.get("origin") == "llm" and spec.get("source"):
        from sparseditto.harness.source_loader import source_hash  # full sha256, as Candidate uses

        return "src:" + source_hash(spec["source"])
    return params_key(spec.get("template", "?"), spec.get("params"))


def planning_input(state: dict, ctx: Context) -> PlanningInput:
    target, note = plan_target(ctx)
    n = main_n(ctx)
    backend = resolved_backend(ctx)
    table, roof_ms = template_table(state["report"], n, ctx.dtype, target, measured_target(ctx), backend)
    tdict = target.model_dump(mode="json")
    tdict.update(backend=backend, timings_are_gpu=backend == "cuda", note=note)
    records = list(state.get("candidates") or [])
    best = state.get("best")
    dense = state.get("dense") or {}
    return PlanningInput(
        report=_compact_report(state["report"]), target=tdict, n_values=list(ctx.n_values), dtype=ctx.dtype,
        memory_hits=list(state.get("memory_hits") or []), tried=tried_from_records(records),
        best=tried_from_records([best])[0] if best else None, dense_ms=dense.get("median_ms"),
        roofline_ms=roof_ms, budget_left=resolved_budget(ctx) - int(state.get("iteration") or 0),
        templates=table)


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

    tried = {record_key(r) for r in state.get("candidates") or []}
    queue = [q for q in (state.get("queue") or []) if spec_key(q) not in tried]
    events: list[dict] = []
    usage: dict = {}
    pinned = [q for q in queue if q.get("pinned")]
    if pinned:
        spec = pinned[0]
        rest = [q for q in queue if q is not spec]
        d = decision("planner", "try", spec.get("rationale") or f"pinned candidate {spec['template']}",
                     template=spec["template"], params=spec.get("params") or {}, origin=spec.get("origin"))
    else:
        inp = planning_input(state, ctx)
        policy = policy_for_step(ctx, state)
        plan, events, usage = call_policy(policy, "plan", inp, node="planner")
        events = policy_events(ctx, state, "planner", events)
        if plan.action == "stop":
            return _stop(state, ctx, plan.rationale, events=events, usage=usage)
        fresh = [c.model_dump(mode="json") for c in plan.candidates]
        if fresh and all(c["template"] == "dense" for c in fresh):
            return _stop(state, ctx, f"the policy chose dense ({plan.rationale})", events=events, usage=usage)
        # dense is measured with every benchmark already; it is never a candidate to code
        fresh = [c for c in fresh if spec_key(c) not in tried and c["template"] != "dense"]
        if not fresh:
            return _stop(state, ctx, f"the policy proposed only candidates already tried ({plan.rationale})",
                         events=events, usage=usage)
        spec, rest = fresh[0], fresh[1:]
        d = decision("planner", "try", plan.rationale, template=spec["template"], params=spec.get("params") or {},
                     origin=spec.get("origin"), policy=getattr(policy, "name", "?"))
    spec = {k: v for k, v in spec.items() if k != "pinned"}
    emit("planner", f"candidate {iteration + 1}/{budget}: {spec['template']} {spec.get('params') or {}} "
                    f"- {d['rationale']}")
    record_step(ctx, state, "planner", "decision", d)
    current = {"spec": spec, "attempt": 1, "last_failure": None, "index": iteration + 1}
    return Command(goto="coder", update={
        "current": current, "queue": rest, "iteration": iteration + 1, "decisions": [d],
        "events": events, "token_usage": usage})


def _stop(state: dict, ctx: Context, why: str, events=None, usage=None) -> Command:
    d = decision("planner", "stop", why)
    emit("planner", f"stop: {why}")
    record_step(ctx, state, "planner", "decision", d)
    return Command(goto="finalize", update={"decisions": [d], "stop_reason": d["rationale"], "queue": [],
                                            "current": None, "events": events or [], "token_usage": usage or {}})


# ---- finalize node ------------------------------------------------------------------------------

def choose_best(state: dict, ctx: Context) -> dict:
    """The answer: the best verified candidate if it beats dense, else dense, with the reason."""
    backend = resolved_backend(ctx)
    gpu = backend == "cuda"
    verified = [c for c in state.get("candidates") or [] if c.get("status") == "verified"]
    dense = state.get("dense") or {}
    if not verified:
        failed = [c for c in state.get("candidates") or []]
        why = ("no candidate was tried" if not failed else
               f"none of {len(failed)} candidate attempt(s) verified "
               f"({', '.join(sorted({c.get('failure_class') or c.get('status') for c in failed}))})")
        stop = state.get("stop_reason")
        if stop and not failed:
            why = stop
        return {"template": "dense", "selection": "no_candidate", "reason": f"dense is best: {why}", "record": None}
    if gpu:
        best = min(verified, key=lambda c: c.get("median_ms") or float("inf"))
        speed = best.get("speedup_vs_dense")
        if speed is not None and speed > MEASURED_MARGIN:
            return {"template": best["template"], "selection": "measured", "record": best,
                    "reason": f"{best['template']} beat dense {speed:.2f}x in the same benchmark run "
                              f"({best['median_ms'] * 1e3:.1f} us vs {best['dense_ms'] * 1e3:.1f} us)"}
        return {"template": "dense", "selection": "measured", "record": None,
                "reason": (f"dense is best: the fastest verified candidate {best['template']} ran at "
                           f"{best['median_ms'] * 1e3:.1f} us vs dense {best.get('dense_ms', float('nan')) * 1e3:.1f} us "
                           f"in the same run (a kernel must beat dense by {MEASURED_MARGIN - 1:.0%})")}
    # Interpreter: CPU timings say nothing about the GPU; rank verified kernels by the cost model.
    target, _ = plan_target(ctx)
    table, _ = template_table(state["report"], main_n(ctx), ctx.dtype, target, exec_backend=resolved_backend(ctx))
    dense_est = next((t["estimate_ms"] for t in table if t["name"] == "dense"), None)
    with_est = [c for c in verified if c.get("expected_ms") is not None]
    if not with_est:
        return {"template": "dense", "selection": "cost_model", "record": None,
                "reason": "dense is best: no verified candidate has a cost-model estimate, and interpreter "
                          "timings cannot rank kernels for a GPU"}
    best = min(with_est, key=lambda c: c["expected_ms"])
    if dense_est is not None and best["expected_ms"] < dense_est * MODEL_MARGIN:
        return {"template": best["template"], "selection": "cost_model", "record": best,
                "reason": (f"{best['template']} verified; chosen by the roofline cost model on {target.name} "
                           f"({best['expected_ms'] * 1e3:.1f} us vs dense {dense_est * 1e3:.1f} us estimated) because "
                           "interpreter timings are CPU timings, not GPU timings")}
    return {"template": "dense", "selection": "cost_model", "record": None,
            "reason": (f"dense is best: the best verified candidate {best['template']} is estimated at "
                       f"{best['expected_ms'] * 1e3:.1f} us vs dense {dense_est * 1e3:.1f} us on {target.name} "
                       f"(needs {1 - MODEL_MARGIN:.0%} better; interpreter timings cannot rank GPU kernels)")}


def finalize(state: State, runtime: Runtime[Context]) -> Command[Literal["__end__"]]:
    """Measure dense if nothing did, choose the answer, optionally ask a human, close the run."""
    ctx = effective_context(runtime.context, state)
    run_hook(ctx, "finalize", state)
    update: dict[str, Any] = {}
    if not state.get("dense") and state.get("matrix_key"):
        dense = measure_dense(state, ctx)
        if dense is not None:
            update["dense"] = dense
            state = {**state, "dense": dense}
    verdict = choose_best(state, ctx)
    if ctx.approve and verdict["record"] is not None:
        answer = interrupt({
            "question": f"Accept {verdict['template']} as the kernel for this matrix? (true / false)",
            "chosen": {k: verdict["record"].get(k) for k in ("template", "params", "median_ms", "speedup_vs_dense",
                                                             "expected_ms", "bottleneck")},
            "reason": verdict["reason"],
        })
        accepted = answer is True or (isinstance(answer, str) and answer.strip().lower() in ("y", "yes", "true", "ok", "accept"))
        if isinstance(answer, dict):
            accepted = bool(answer.get("accept", answer.get("approved", False)))
        if not accepted:
            verdict = {"template": "dense", "selection": "rejected", "record": None,
                       "reason": f"dense is best: the reviewer rejected {verdict['template']} ({answer!r})"}
    d = decision("finalize", "choose", verdict["reason"], template=verdict["template"])
    emit("finalize", verdict["reason"])
    record_step(ctx, state, "finalize", "outcome", d)
    final = {"template": verdict["template"], "selection": verdict["selection"], "reason": verdict["reason"],
             "candidate": verdict["record"]}
    _finish_memory(ctx, state, final)
    forget_run(state.get("run_id", ""))
    update.update(final=final, best=verdict["record"], done=True, decisions=[d], current=None)
    return Command(goto=END, update=update)


def measure_dense(state: dict, ctx: Context) -> dict | None:
    """Time dense alone (no candidate was benchmarked, so nothing measured it yet)."""
    from sparseditto.agents.profiler import bench_dense

    try:
        return bench_dense(state, ctx)
    except Exception as exc:
        emit("finalize", f"dense timing failed: {exc}")
        return None


def _finish_memory(ctx: Context, state: dict, final: dict) -> None:
    mem = run_memory(ctx)
    run_id = state.get("memory_run_id")
    if mem is None or not run_id:
        return
    rec = final.get("candidate") or {}
    try:
        mem.finish_run(
            run_id, "ok", rec.get("memory_candidate_id") or None,
            best_template=final["template"],
            best_speedup_vs_dense=rec.get("speedup_vs_dense") if rec else None,
            wall_seconds=time.time() - float(state.get("started_at") or time.time()),
            token_usage=state.get("token_usage") or None)
    except Exception as exc:  # pragma: no cover
        emit("finalize", f"memory: could not finish run ({exc})")
