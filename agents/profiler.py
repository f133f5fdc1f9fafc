"""Profiler node: how fast is the verified candidate, against what, and what limits it?

It benchmarks the candidate at the main N against dense (cuBLAS, or CPU torch.matmul on the
interpreter) and the vendor sparse baselines, measured in the same worker process: once per run
(``baseline_scope`` = the run id; every later candidate's bench reuses those timings, and a replaced
worker times them again), runs Nsight Compute
when on a GPU with ``ncu`` installed (a note otherwise), and sums the result up in one line the
planner and the user can act on: memory-bound at X% of roofline, launch-bound, or compute-bound.

% of roofline = the format's roofline time on the GPU that measured (bytes of A in this format +
B + C over its bandwidth, or flops over peak) / the measured time. On the Triton interpreter the
timings are CPU timings, so no roofline percentage is claimed; the record says so.
"""
from __future__ import annotations

from typing import Any, Literal

from langgraph.runtime import Runtime
from langgraph.types import Command

from sparseditto.agents.costing import roofline_for
from sparseditto.agents.kit import decision, dense_record, emit, record_step, remember_candidate, run_hook, timing_fields
from sparseditto.agents.records import build_record, candidate_of
from sparseditto.agents.state import (Context, State, effective_context, main_n, resolved_backend, resolved_repeats,
                                      resolved_warmup)

LAUNCH_BOUND_US = 8.0     # below this a kernel is dominated by launch + tail, not by its bytes


def bytes_note(est: dict | None, nnz: int | None) -> str:
    """Where A's bytes stand: "A: 3608 bytes (4.31 per nonzero, measured)"; '' without a model."""
    if not est or est.get("a_bytes") is None:
        return ""
    per = f"{est['a_bytes'] / nnz:.2f} per nonzero, " if nnz else ""
    how = "measured from prepare()" if est.get("a_bytes_measured") else "format formula"
    return f"A: {est['a_bytes']:.0f} bytes ({per}{how})"


def bottleneck_summary(median_ms: float, gpu: bool, est: dict | None, pct: float | None,
                       metrics: dict | None, gpu_name: str, nnz: int | None = None) -> str:
    """One line: what limits this kernel (the planner reads it, the user sees it)."""
    note = bytes_note(est, nnz)
    if not gpu:
        line = f"interpreter run on the CPU: {median_ms:.2f} ms is not a GPU timing"
        if est:
            line += f"; roofline estimate {est['estimate_ms'] * 1e3:.2f} us ({est['bound']}-bound) on the target"
        return line + (f"; {note}" if note else "")
    us = median_ms * 1e3
    if est is None or pct is None:
        line = f"{us:.1f} us on {gpu_name}; no roofline model for this source"
    elif us < LAUNCH_BOUND_US and pct < 50:
        line = (f"launch-bound: {us:.1f} us total against a {est['measured_ms'] * 1e3:.1f} us roofline; "
                "launch overhead and tail dominate")
    elif est["bound"] == "memory":
        achieved = est["bytes"] / (median_ms * 1e-3) / 1e9
        line = (f"memory-bound at {pct:.0f}% of roofline ({est['bytes'] / 1e6:.2f} MB at {achieved:.0f} GB/s)")
    elif est["bound"] in ("decode", "imbalance"):
        # the estimate is a measured floor above the byte roofline: say both, never "% of peak"
        achieved = est["bytes"] / (median_ms * 1e-3) / 1e9
        line = (f"{est['bound']}-bound: {pct:.0f}% of the model's measured {est['bound']} floor "
                f"({est['measured_ms'] * 1e3:.1f} us)")
        if est.get("roofline_only_ms"):
            line += (f", {100.0 * est['roofline_only_ms'] / median_ms:.0f}% of the byte roofline "
                     f"({est['bytes'] / 1e6:.2f} MB at {achieved:.0f} GB/s)")
    else:
        line = f"compute-bound at {pct:.0f}% of the roofline peak"
    if note:
        line += f"; {note}"
    if metrics:
        bits = []
        for key, label in (("dram_throughput_pct", "DRAM"), ("sm_throughput_pct", "SM"),
                           ("achieved_occupancy_pct", "occupancy"), ("l2_hit_rate_pct", "L2 hit")):
            if key in metrics:
                bits.append(f"{label} {metrics[key]:.0f}%")
        if bits:
            line += " [ncu: " + ", ".join(bits) + "]"
    return line


def _ncu(ctx: Context, candidate, matrix, n: int, promising: bool) -> tuple[dict, str | None]:
    """(Nsight Compute metrics, note): only on a GPU, only for new bests when ncu='best'."""
    from sparseditto import harness

    if resolved_backend(ctx) != "cuda":
        return {}, "ncu skipped: the interpreter backend runs no GPU kernels"
    if ctx.ncu == "off":
        return {}, "ncu skipped (ncu='off')"
    if ctx.ncu == "best" and not promising:
        return {}, f"ncu skipped (ncu={ctx.ncu!r}: only new best candidates are profiled)"
    try:  # profile_ncu finds ncu itself and answers with a note when it is absent
        ncu = harness.profile_ncu(candidate, matrix, n=n, dtype=ctx.dtype, seed=ctx.seed)
    except Exception as exc:
        return {}, f"ncu failed: {type(exc).__name__}: {exc}"
    return (dict(ncu.metrics), None) if ncu.available else ({}, ncu.note)


def profiler(state: State, runtime: Runtime[Context]) -> Command[Literal["planner"]]:
    ctx = effective_context(runtime.context, state)
    run_hook(ctx, "profiler", state)
    from sparseditto import harness
    from sparseditto.artifacts import get_matrix

    current = dict(state["current"])
    spec = current["spec"]
    backend = resolved_backend(ctx)
    gpu = backend == "cuda"
    n = main_n(ctx)
    candidate = candidate_of(current)
    matrix = get_matrix(state["matrix_key"])
    emit("profiler", f"benchmarking {spec['template']} at N={n} on {backend}")
    try:
        res = harness.bench(candidate, matrix, n=n, dtype=ctx.dtype, backend=backend, repeats=resolved_repeats(ctx),
                            warmup=resolved_warmup(ctx), baselines=True if ctx.baselines is None else ctx.baselines,
                            baseline_scope=state.get("run_id"))
    except harness.BenchError as exc:  # failed to run correctly while being timed
        res, bench_error = None, f"{exc.result.status}: {exc.result.message}"
    except Exception as exc:
        res, bench_error = None, f"{type(exc).__name__}: {exc}"
    else:
        bench_error = None if res.reverified else f"re-verification after timing failed: {res.reverify_message}"
    if res is None or bench_error:
        record = build_record(current, "bench_failed", failure_class="bench_failed" if res is None else "unstable",
                              message=bench_error)
        d = decision("profiler", "bench_failed", f"{spec['template']}: {bench_error}", template=spec["template"])
        emit("profiler", d["rationale"])
        record_step(ctx, state, "profiler", "outcome", d)
        remember_candidate(ctx, state, record, "profiler")
        return Command(goto="planner", update={"candidates": [record.model_dump(mode="json")], "current": None,
                                               "decisions": [d]})

    gpu = res.timings_are_gpu   # the benchmark says what its timings are; they rank only as that
    # An LLM's kernel packs A its own way: it is costed with the bytes its prepare() returned.
    measured_bytes = res.packed_bytes if current.get("origin") == "llm" else None
    est = roofline_for(state, ctx, spec["template"], spec.get("params") or {}, a_bytes=measured_bytes)
    timed = timing_fields(res)
    median_ms, dense_ms, basis = timed["median_ms"], timed["dense_ms"], timed["timing_basis"]
    pct = 100.0 * est["measured_ms"] / median_ms if (gpu and est and median_ms > 0) else None
    best = state.get("best")
    metrics, ncu_note = _ncu(ctx, candidate, matrix, n, best is None or median_ms < (best.get("median_ms") or float("inf")))
    summary = bottleneck_summary(median_ms, gpu, est, pct, metrics, res.gpu_name, (state.get("report") or {}).get("nnz"))
    record = build_record(
        current, "verified", **timed,
        speedup_vs_best_baseline=res.speedup_vs_best_baseline if gpu else None, best_baseline=res.best_baseline,
        baselines={b.name: (b.timing.median_ms if b.ok and b.timing else None) for b in res.baselines},
        baseline_notes={b.name: (b.error or b.note) for b in res.baselines if not b.ok or b.note},
        expected_ms=est["estimate_ms"] if est else spec.get("expected_ms"),
        pct_of_roofline=pct, bottleneck=summary, metrics=metrics, ncu_note=ncu_note,
        a_bytes=est.get("a_bytes") if est else None, a_bytes_measured=est.get("a_bytes_measured") if est else None,
        roofline_ms=est["measured_ms"] if est else None)
    record.memory_candidate_id = remember_candidate(ctx, state, record, "profiler")
    improved = best is None or _better(record.model_dump(), best, gpu)
    if gpu:
        why = (f"{spec['template']}: {median_ms * 1e3:.1f} us vs dense {dense_ms * 1e3:.1f} us "
               f"({dense_ms / median_ms:.2f}x, {basis.replace('_', ' ')}; eager {res.candidate.median_ms * 1e3:.1f} "
               f"vs {res.dense.median_ms * 1e3:.1f} us); {summary}")
    else:
        why = f"{spec['template']}: {summary}"
    why += "; new best" if improved else f"; best stays {best['template']}"
    slow = sorted(res.stage_seconds.items(), key=lambda kv: -kv[1])[:3]
    if slow and sum(v for _, v in slow) >= 5.0:    # a slow bench says what took the time
        why += "; bench took " + ", ".join(f"{k} {v:.1f} s" for k, v in slow)
    d = decision("profiler", "profiled", why, template=spec["template"], median_ms=median_ms,
                 pct_of_roofline=pct)
    emit("profiler", why)
    record_step(ctx, state, "profiler", "outcome", {**d, "bottleneck": summary})
    dump = record.model_dump(mode="json")
    update: dict[str, Any] = {"candidates": [dump], "current": None, "decisions": [d]}
    if improved:
        update["best"] = dump
        update["dense"] = dense_record(res)
    elif not state.get("dense"):
        update["dense"] = dense_record(res)
    return Command(goto="planner", update=update)


def _better(record: dict, best: dict, gpu: bool) -> bool:
    """GPU: faster measured time. Interpreter: lower roofline estimate (CPU time ranks nothing)."""
    if gpu:
        return (record.get("median_ms") or float("inf")) < (best.get("median_ms") or float("inf"))
    return (record.get("expected_ms") or float("inf")) < (best.get("expected_ms") or float("inf"))
