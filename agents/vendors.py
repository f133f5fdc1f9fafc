"""The vendor paths a user could call instead (dense cuBLAS, cuSPARSE via torch and CuPy,
cuSPARSELt 2:4, torch's Triton BSR), measured as candidates of the run.

Why: a kernel is only worth shipping if it beats what the user would have called. The profiler
used to time the libraries beside each candidate and finalize still handed out a kernel 5x slower
than torch's cuSPARSE (issue 11). Here each vendor path that can run becomes a `CandidateRecord`
(origin "vendor", ``vendor`` naming the library) through the same steps as a generated kernel:
`harness.run_and_verify` at the run's N values (fresh seed, the one tolerance; not the harness's
extra odd N, see `_measure`), then
`harness.bench` (cold L2, fresh B per launch, eager + CUDA graph, re-verified after timing) in the
same worker pool, its record built by the same `kit.timing_fields`. A vendor path that cannot run
here (no GPU, not 2:4, fp16 on the CPU's MKL) is named in the decision, not recorded as a failure.
"""
from __future__ import annotations

from sparseditto.agents.kit import (decision, dense_record, emit, record_step, remember_candidate,
                                    timing_fields)
from sparseditto.agents.records import CandidateRecord, build_record
from sparseditto.agents.state import (Context, main_n, resolved_backend, resolved_repeats, resolved_warmup,
                                      verify_n_values)


def has_vendor_records(state: dict) -> bool:
    return any(c.get("origin") == "vendor" for c in state.get("candidates") or [])


def _current(name: str, library: str, expected_ms: float | None) -> dict:
    spec = {"template": name, "params": {}, "origin": "vendor", "vendor": library, "expected_ms": expected_ms,
            "rationale": f"vendor path: {library} (what a user could call instead)"}
    return {"spec": spec, "origin": "vendor", "backend": "builtin", "source": None, "source_hash": None}


def _measure(name: str, current: dict, matrix, ctx: Context, scope: str | None) -> tuple[CandidateRecord, object]:
    """(record, BenchResult or None): verified, then timed, like a generated candidate (dense
    beside it from the run's ``scope``: timed once, with the profiler's candidates).

    Verified at the run's N values only (``extra_ns=False``): the harness's extra odd N (17, 129
    on a GPU) are there to catch generated code that is right only at the N it was written for,
    and a vendor answer runs only at the N values it was verified at (`api._verified_ns`). With
    them, torch's cuSPARSE CSR in fp16 (right at N = 1, accumulating to 2.6x the tolerance at
    N = 129 on heavy-tailed B) was refused by a run asked for N = 1, while the benchmark, checking
    each path at the case's N, counted it as the library to beat (session 21, issue 11)."""
    from sparseditto import harness

    spec, backend = harness.vendor_spec(name), resolved_backend(ctx)
    vr = harness.run_and_verify(spec, matrix, n_values=verify_n_values(ctx), dtype=ctx.dtype, backend=backend,
                                timeout=ctx.verify_timeout_s, extra_ns=False)
    if not vr.ok:
        return build_record(current, vr.status, failure_class=vr.failure_class, message=vr.message[:2000]), None
    worst = max((c.tol_ratio for c in vr.checks), default=0.0)
    current = {**current, "verify": {"status": "verified", "checks": len(vr.checks), "worst_tol_ratio": worst,
                                     "seconds": vr.seconds}}
    try:
        res = harness.bench(spec, matrix, n=main_n(ctx), dtype=ctx.dtype, backend=backend,
                            repeats=resolved_repeats(ctx), warmup=resolved_warmup(ctx), baselines=False,
                            baseline_scope=scope)
    except Exception as exc:   # BenchError (failed while timed) or the library refusing this size
        return build_record(current, "bench_failed", failure_class="bench_failed", message=str(exc)[:2000]), None
    if not res.reverified:
        return build_record(current, "bench_failed", failure_class="unstable",
                            message=f"re-verification after timing failed: {res.reverify_message}"[:2000]), None
    timed = timing_fields(res)
    where = (f"{timed['median_ms'] * 1e3:.1f} us on {res.gpu_name}" if res.timings_are_gpu else
             f"interpreter run on the CPU: {timed['median_ms']:.2f} ms is not a GPU timing")
    return build_record(current, "verified", bottleneck=f"vendor library ({current['spec']['vendor']}): {where}",
                        **timed), res


def measure_vendor_paths(state: dict, ctx: Context, dense_estimate_ms: float | None) -> dict:
    """The state update of measuring every vendor path that can run: ``candidates`` (their
    records), ``dense`` (from dense cuBLAS's own benchmark, when nothing measured it yet) and the
    decision naming what was measured and what could not run, and why."""
    from sparseditto import harness
    from sparseditto.artifacts import get_matrix

    matrix = get_matrix(state["matrix_key"])
    backend = resolved_backend(ctx)
    records, skipped, update = [], [], {}
    for name in harness.VENDOR_NAMES:
        why = harness.unavailable_reason(name, matrix, ctx.dtype, backend)
        if why:
            skipped.append(f"{name} ({why})")
            continue
        library = harness.vendor_kernel(name).library
        emit("finalize", f"vendor path {name}: verifying and timing {library}")
        record, res = _measure(name, _current(name, library, dense_estimate_ms if name == "dense" else None),
                               matrix, ctx, state.get("run_id"))
        record.memory_candidate_id = remember_candidate(ctx, state, record, "finalize")
        records.append(record.model_dump(mode="json"))
        if name == "dense" and res is not None and not state.get("dense"):
            update["dense"] = dense_record(res)
    done = ", ".join(f"{r['template']} {r['status']}" + (f" {r['median_ms'] * 1e3:.1f} us" if r.get("timings_are_gpu") else "")
                     for r in records) or "none"
    d = decision("finalize", "vendor_paths", f"vendor paths measured as candidates: {done}"
                 + (f"; not run here: {'; '.join(skipped)}" if skipped else ""))
    emit("finalize", d["rationale"])
    record_step(ctx, state, "finalize", "outcome", d)
    return {**update, "candidates": records, "decisions": [d]}
