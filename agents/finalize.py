"""Finalize node: what the answer is, how it was chosen, and how much faster it is.

It picks the answer honestly: the fastest verified candidate only if it beats dense measured in
the same benchmark run, and again in an independent re-timing (on the Triton interpreter, where
timings are CPU timings, the roofline cost model on the target decides and the result says so);
else dense with the reason. The verdict
carries the speedups too (measured on a GPU, estimated by the cost model on the interpreter), so
`Result` only reads them. With ``approve`` a human accepts or rejects the kernel first.
"""
from __future__ import annotations

from typing import Any, Literal

from langgraph.graph import END
from langgraph.runtime import Runtime
from langgraph.types import Command, interrupt

from sparseditto.agents.costing import dense_estimate_ms
from sparseditto.agents.kit import (bench_dense, decision, emit, finish_memory_run, forget_run, plan_target,
                                    record_step, retime_speedup, run_hook)
from sparseditto.agents.state import Context, State, effective_context, resolved_backend

# A sparse kernel replaces dense only with a margin: a 1% "win" is timing noise (measured) or
# model error (cost model), and dense is the safer kernel to ship.
MEASURED_MARGIN = 1.02     # measured speedup over dense in the same run must exceed this
MODEL_MARGIN = 0.95        # cost-model estimate must be below this fraction of dense's


def choose_best(state: dict, ctx: Context) -> dict:
    """The answer: the best verified candidate if it beats dense, else dense, with the reason."""
    gpu = resolved_backend(ctx) == "cuda"
    verified = [c for c in state.get("candidates") or [] if c.get("status") == "verified"]
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
                           f"{best['median_ms'] * 1e3:.1f} us vs dense {(best.get('dense_ms') or float('nan')) * 1e3:.1f} us "
                           f"in the same run (a kernel must beat dense by {MEASURED_MARGIN - 1:.0%})")}
    # Interpreter: CPU timings say nothing about the GPU; rank verified kernels by the cost model.
    target, _ = plan_target(ctx)
    dense_est = dense_estimate_ms(state, ctx)
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


def confirmed(verdict: dict, retimed: float | None, error: str | None = None) -> dict:
    """The measured verdict after the winner's independent re-timing: the kernel stays the answer
    only if both measured speedups clear MEASURED_MARGIN, and the lower one is what it reports."""
    rec = verdict["record"]
    first = float(rec["speedup_vs_dense"])
    name = verdict["template"]
    if error is not None or retimed is None:
        return {"template": "dense", "selection": "measured", "record": None,
                "reason": f"dense is best: {name} beat dense {first:.2f}x but failed when re-timed ({error})"}
    low = min(first, float(retimed))
    if low > MEASURED_MARGIN:
        return {**verdict, "record": {**rec, "speedup_vs_dense": low},
                "reason": (f"{name} beat dense {first:.2f}x in its benchmark run and {retimed:.2f}x in an independent "
                           f"re-timing ({rec['median_ms'] * 1e3:.1f} us vs {rec['dense_ms'] * 1e3:.1f} us in the first; "
                           f"the lower speedup is reported)")}
    return {"template": "dense", "selection": "measured", "record": None,
            "reason": (f"dense is best: {name} beat dense {first:.2f}x in its benchmark run but {retimed:.2f}x when "
                       f"re-timed (a kernel must beat dense by {MEASURED_MARGIN - 1:.0%} in both)")}


def speedups(state: dict, ctx: Context, rec: dict | None) -> tuple[dict[str, float], bool]:
    """(speedups of the answer, whether they are cost-model estimates). On a GPU: measured against
    dense and against each vendor library timed in the same run; on the interpreter: the roofline
    estimate against dense's (CPU timings are no speedups)."""
    gpu = resolved_backend(ctx) == "cuda"
    if rec is None:
        return ({"dense": 1.0} if gpu and state.get("dense") else {}), not gpu
    if gpu:
        out = {}
        if rec.get("speedup_vs_dense"):
            out["dense"] = float(rec["speedup_vs_dense"])
        # vendor libraries are timed with eager launches, so they are compared with the
        # candidate's eager time (like for like; the graph-launched ratio would flatter us)
        own = rec.get("eager_ms") or rec.get("median_ms")
        for name, ms in (rec.get("baselines") or {}).items():
            if ms and own and name != "cublas_dense":
                out[name] = float(ms) / float(own)
        return out, False
    dense_est = dense_estimate_ms(state, ctx)
    if dense_est and rec.get("expected_ms"):
        return {"dense": dense_est / rec["expected_ms"]}, True
    return {}, True


def _approved(answer) -> bool:
    if isinstance(answer, dict):
        return bool(answer.get("accept", answer.get("approved", False)))
    return answer is True or (isinstance(answer, str) and answer.strip().lower() in ("y", "yes", "true", "ok", "accept"))


def finalize(state: State, runtime: Runtime[Context]) -> Command[Literal["__end__"]]:
    """Measure dense if nothing did, choose the answer, optionally ask a human, close the run."""
    ctx = effective_context(runtime.context, state)
    run_hook(ctx, "finalize", state)
    update: dict[str, Any] = {}
    if not state.get("dense") and state.get("matrix_key"):
        try:
            dense = bench_dense(state, ctx)
        except Exception as exc:
            emit("finalize", f"dense timing failed: {exc}")
        else:
            update["dense"] = dense
            state = {**state, "dense": dense}
    verdict = choose_best(state, ctx)
    if verdict["selection"] == "measured" and verdict["record"] is not None:
        emit("finalize", f"re-timing {verdict['template']} against dense before choosing it")
        try:
            verdict = confirmed(verdict, retime_speedup(state, ctx, verdict["record"]))
        except Exception as exc:  # the kernel failed while re-timed: it is not shipped
            verdict = confirmed(verdict, None, f"{type(exc).__name__}: {exc}"[:300])
    if ctx.approve and verdict["record"] is not None:
        answer = interrupt({
            "question": f"Accept {verdict['template']} as the kernel for this matrix? (true / false)",
            "chosen": {k: verdict["record"].get(k) for k in ("template", "params", "median_ms", "speedup_vs_dense",
                                                             "expected_ms", "bottleneck")},
            "reason": verdict["reason"],
        })
        if not _approved(answer):
            verdict = {"template": "dense", "selection": "rejected", "record": None,
                       "reason": f"dense is best: the reviewer rejected {verdict['template']} ({answer!r})"}
    d = decision("finalize", "choose", verdict["reason"], template=verdict["template"])
    emit("finalize", verdict["reason"])
    record_step(ctx, state, "finalize", "outcome", d)
    gains, estimated = speedups(state, ctx, verdict["record"])
    final = {"template": verdict["template"], "selection": verdict["selection"], "reason": verdict["reason"],
             "candidate": verdict["record"], "speedups": gains, "speedups_are_estimates": estimated}
    finish_memory_run(ctx, state, final)
    forget_run(state.get("run_id", ""))
    update.update(final=final, best=verdict["record"], done=True, decisions=[d], current=None)
    return Command(goto=END, update=update)
