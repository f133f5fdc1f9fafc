"""Finalize node: what the answer is, how it was chosen, and how much faster it is.

It measures the vendor paths as candidates (agents/vendors.py: dense cuBLAS, cuSPARSE via torch and
CuPy, cuSPARSELt 2:4, torch's Triton BSR, each verified and timed like a generated kernel), then
applies the selection rule (agents/selection.py): the fastest verified kernel wins, vendor paths
included; a generated kernel replaces the fastest vendor path only if it beats it by
MEASURED_MARGIN in its run and again in an independent re-timing of both. On the Triton
interpreter the roofline cost model ranks generated kernels against dense's estimate, and the
result says so. The verdict carries the speedups (against dense and every vendor path) and the
comparison with the best vendor path, so `Result` only reads them. With ``approve`` a human
accepts or rejects a generated kernel first.
"""
from __future__ import annotations

from typing import Any, Literal

from langgraph.graph import END
from langgraph.runtime import Runtime
from langgraph.types import Command, interrupt

from sparseditto.agents.costing import dense_estimate_ms
from sparseditto.agents.kit import (decision, emit, finish_memory_run, forget_run, once, record_step, retime_speedup,
                                    run_hook)
from sparseditto.agents.selection import (choose_best, confirmed, is_vendor, needs_retiming, rejected, speedups,
                                          vendor_comparison, verified_records)
from sparseditto.agents.state import Context, State, effective_context
from sparseditto.agents.vendors import has_vendor_records, measure_vendor_paths


def _approved(answer) -> bool:
    if isinstance(answer, dict):
        return bool(answer.get("accept", answer.get("approved", False)))
    return answer is True or (isinstance(answer, str) and answer.strip().lower() in ("y", "yes", "true", "ok", "accept"))


def _vendor_paths(state: dict, ctx: Context) -> dict:
    """The vendor paths' state update, or {"error": why} (a harness failure costs the vendor
    candidates, never the answer)."""
    try:
        return measure_vendor_paths(state, ctx, dense_estimate_ms(state, ctx) if state.get("report") else None)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def _retimed(state: dict, ctx: Context, record: dict, against: dict | None) -> dict:
    """{"retimed": [vs rival, vs dense]} of the winner's re-timing, or {"error": why} (it failed)."""
    try:
        return {"retimed": list(retime_speedup(state, ctx, record, against))}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}


def finalize(state: State, runtime: Runtime[Context]) -> Command[Literal["__end__"]]:
    """Measure the vendor paths, choose the answer, optionally ask a human, close the run. On a
    resume after the approval interrupt LangGraph runs the node again from its start; the vendor
    measurements (with their memory rows) and the re-timing run through `kit.once`, so the resumed
    node gets what they returned before the prompt instead of measuring (and recording) again."""
    ctx = effective_context(runtime.context, state)
    run_hook(ctx, "finalize", state)
    update: dict[str, Any] = {}
    if state.get("matrix_key") and not has_vendor_records(state):
        measured = once("finalize_vendor_paths", _vendor_paths, state, ctx)
        if "error" in measured:
            emit("finalize", f"vendor paths could not be measured: {measured['error']}")
        else:
            update.update({k: v for k, v in measured.items() if k != "candidates"})
            update["candidates"] = measured["candidates"]
            state = {**state, **{k: v for k, v in measured.items() if k not in ("candidates", "decisions")},
                     "candidates": list(state.get("candidates") or []) + measured["candidates"]}
    verdict = choose_best(state, ctx)
    if needs_retiming(verdict):
        against = verdict.get("against")
        emit("finalize", f"re-timing {verdict['template']} against {against['template'] if against else 'dense'} "
                         "before choosing it")
        _, vendors = verified_records(state)
        outcome = once("finalize_retime", _retimed, state, ctx, verdict["record"], against)
        verdict = confirmed(verdict, vendors, outcome.get("retimed"), outcome.get("error"))  # failed: not shipped
    if ctx.approve and verdict["record"] is not None and not is_vendor(verdict["record"]):
        answer = interrupt({
            "question": f"Accept {verdict['template']} as the kernel for this matrix? (true / false)",
            "chosen": {k: verdict["record"].get(k) for k in ("template", "params", "median_ms", "speedup_vs_dense",
                                                             "expected_ms", "bottleneck")},
            "reason": verdict["reason"],
        })
        if not _approved(answer):
            verdict = rejected(state, verdict, f"the reviewer rejected {verdict['template']} ({answer!r})")
    d = decision("finalize", "choose", verdict["reason"], template=verdict["template"])
    emit("finalize", verdict["reason"])
    record_step(ctx, state, "finalize", "outcome", d)
    gains, estimated = speedups(state, ctx, verdict)
    final = {"template": verdict["template"], "selection": verdict["selection"], "reason": verdict["reason"],
             "candidate": verdict["record"], "speedups": gains, "speedups_are_estimates": estimated,
             **vendor_comparison(state, verdict)}
    finish_memory_run(ctx, state, final)
    forget_run(state.get("run_id", ""))
    update.update(final=final, best=verdict["record"], done=True, decisions=update.get("decisions", []) + [d],
                  current=None)
    return Command(goto=END, update=update)
