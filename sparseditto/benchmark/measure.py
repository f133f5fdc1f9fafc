"""One benchmark case: ask `run_graph` for its kernel, then time it against everything a user could pick.

The order, per (matrix, N, dtype):

1. ``run_graph`` with the expert policy (cuda backend on a GPU, the Triton interpreter on a CPU),
   sharing the bench run's SQLite memory; its wall time is recorded;
2. `harness.bench` of the chosen kernel in one sandboxed worker: `prepare` timed on its own, eager
   and CUDA-graph launches with a cold L2, dense cuBLAS the same way, then every vendor path that
   applies (cuSPARSE CSR through torch and CuPy, cuSPARSELt 2:4, torch's Triton BSR), also replayed
   from CUDA graphs, each re-checked on a fresh B after timing;
3. `harness.run_and_verify` of the chosen kernel on fresh inputs (the one tolerance of
   `harness.numerics`): the number in the report comes from a kernel verified after it was timed;
4. on sampled cases, ``run_graph`` again with the same memory (the repeat a user pays).

On a GPU the chosen kernel and dense cuBLAS are also timed chained (bench(chain=True)): launches
back to back from one CUDA graph, each on its own L2-cold copy of the weight, per launch; a lone
replay carries ~2.3 us of fixed cost a layer inside a model's graph does not pay, which matters at
decode sizes. That ratio is ``speedup_vs_dense_chain``, beside the single-launch one.

Speedups compare like with like: graph-replayed against graph-replayed when both paths have a
graph timing, eager against eager otherwise (the basis is recorded with each ratio). When the
chosen kernel *is* dense cuBLAS (or a vendor path), its timing is that path's own, so the ratio
against it is exactly 1.
"""
from __future__ import annotations

import time
from pydantic import BaseModel

from .cases import Case
from .ratios import format_roofline, speedups
from .rows import DENSE_PATH, VENDOR_PATHS, BenchRow, ChosenKernel, PathTiming, TriedKernel


class Settings(BaseModel):
    """How every case of one bench run is run (recorded in each row)."""

    target: str = "auto"
    backend: str = "interpret"          # resolved: "cuda" or "interpret"
    candidates: int = 4                 # run_graph budget (candidates tried per case)
    repeats: int = 30
    warmup: int = 5
    ncu: str = "off"
    seed: int = 0
    timeout_s: float = 900.0
    memory_path: str | None = None
    checkpoint_path: str | None = None
    chain: bool = True                  # also time the chosen kernel and dense chained (GPU only)
    templates: list[str] = []           # the optional template sweep: names, or ["all"]
    grid: int = 1                       # parameter sets per template in the sweep

    def recorded(self) -> dict:
        return self.model_dump(exclude={"memory_path", "checkpoint_path"})


def run_graph_for(case: Case, matrix, settings: Settings):
    """`run_graph` as a user would call it, with the bench run's memory; returns (Result, wall s)."""
    from sparseditto.api import run_graph

    t0 = time.perf_counter()
    result = run_graph(matrix, target=settings.target, n=case.n, dtype=case.dtype, backend=settings.backend,
                       budget=settings.candidates, memory=settings.memory_path, checkpoint=settings.checkpoint_path,
                       seed=settings.seed, ncu=settings.ncu, progress=False)
    return result, time.perf_counter() - t0


def chosen_kernel(result) -> ChosenKernel:
    best = result.best
    seen = list(dict.fromkeys(c.index for c in result.candidates))  # retries share an index
    winner = next((c for c in result.candidates
                   if best.source_hash and c.source_hash == best.source_hash and c.status == "verified"), None)
    rank = seen.index(winner.index) + 1 if winner is not None else None
    return ChosenKernel(template=best.template, params=dict(best.params or {}), origin=best.origin,
                        backend=best.backend, selection=best.selection, reason=best.reason,
                        bottleneck=best.bottleneck, source_hash=best.source_hash, candidates_tried=len(seen),
                        winner_rank=rank, stop_reason=result.stop_reason, policy=result.policy,
                        tried=tried_kernels(result.candidates))


def tried_kernels(candidates) -> list[TriedKernel]:
    """Every attempt of the run as a short record: the last attempt of each candidate index (a
    retried candidate's earlier failures are in its message), vendor paths (no index) after them."""
    last: dict = {}
    vendors = []
    for c in candidates:
        if c.index is None:
            vendors.append(c)
        else:
            last[c.index] = c
    ordered = [last[i] for i in sorted(last)] + vendors
    us = lambda ms: None if ms is None else round(ms * 1e3, 3)
    return [TriedKernel(rank=k + 1, template=c.template, origin=c.origin, status=c.status,
                        params={p: v for p, v in (c.params or {}).items() if v != "auto"},
                        expected_us=us(c.expected_ms), us=us(c.median_ms),
                        basis=c.timing_basis if c.median_ms is not None else None)
            for k, c in enumerate(ordered)]


def candidate_spec(result):
    """What the harness should run for the chosen kernel: its source, or the vendor path itself
    when the answer is dense cuBLAS or a vendor library (verified on fresh inputs like any kernel;
    its timing in the row is that path's own baseline timing, so its ratio against itself is 1)."""
    from sparseditto.harness import CandidateSpec, as_spec, is_vendor_kernel, vendor_spec

    best = result.best
    if is_vendor_kernel(best.template):
        return vendor_spec(best.template)
    if not best.source:
        return CandidateSpec(source="", backend="builtin", template="dense")
    return as_spec(best.source) if not best.backend else CandidateSpec(
        source=best.source, backend=best.backend, template=best.template, params=dict(best.params or {}),
        source_hash=best.source_hash or "")


def _us(timing) -> float | None:
    return None if timing is None else timing.median_ms * 1e3


def path_timings(bench_result, verify_result, chosen: ChosenKernel) -> list[PathTiming]:
    """The chosen kernel first (rechecked by the fresh-input verification), then every baseline."""
    out = []
    for b in bench_result.baselines:
        out.append(PathTiming(name=b.name, ok=b.ok, eager_us=_us(b.timing), graph_us=_us(b.graph_timing),
                              chain_us=_us(b.chain_timing), error=b.error, note=b.note, rechecked=b.rechecked, recheck_message=b.recheck_message))
    fresh = (f"verified on fresh inputs after timing (N={bench_result.n})" if verify_result.ok
             else f"{verify_result.status}: {verify_result.message}"[:600])
    own = next((t for t in out if t.name == chosen.template or (chosen.template == "dense" and t.name == DENSE_PATH)),
               None)
    if own is not None:  # the answer is a library path: its timing is the chosen one
        mine = PathTiming(name="chosen", ok=own.ok, eager_us=own.eager_us, graph_us=own.graph_us,
                          chain_us=own.chain_us, note=f"the chosen kernel is {own.name} itself", rechecked=verify_result.ok,
                          recheck_message=fresh)
    else:
        mine = PathTiming(name="chosen", ok=True, eager_us=_us(bench_result.candidate),
                          graph_us=_us(bench_result.candidate_graph), chain_us=_us(bench_result.candidate_chain),
                          rechecked=verify_result.ok,
                          recheck_message=fresh, note="; ".join(bench_result.notes) or None)
    return [mine] + out


def format_bytes(result, chosen: ChosenKernel, n: int, dtype: str) -> float | None:
    """Bytes the chosen kernel must move (A in its format + B + C), from the template's cost model;
    None for kernels outside the registry (vendor paths, free-form LLM kernels)."""
    if chosen.template in VENDOR_PATHS:
        return None
    from sparseditto.analysis import PatternReport
    from sparseditto.kernel_templates.registry import get_template
    from sparseditto.targets import Target

    try:
        template = get_template(chosen.template)
        report = PatternReport.model_validate(result.report)
        target = Target.model_validate(result.target["spec"])
        return float(template.cost(report, n, dtype, target, chosen.params).bytes)
    except (ValueError, KeyError, TypeError):
        return None


def memory_repeat(case: Case, matrix, settings: Settings) -> tuple[float | None, dict]:
    """Run the same case again with the memory the first run filled: wall time and what it found."""
    try:
        result, wall = run_graph_for(case, matrix, settings)
    except Exception as exc:  # the repeat is a measurement; its failure is recorded, not fatal
        return None, {"error": f"{type(exc).__name__}: {exc}"[:500]}
    exact = any(h.get("kind") == "exact" for h in result.memory_hits)
    return wall, {"wall_s": wall, "exact_hit": exact, "memory_hits": len(result.memory_hits),
                  "chosen": result.best.template, "candidates": len(result.candidates)}


def _row_fields(case: Case, matrix, settings: Settings) -> dict:
    return dict(case_id=case.case_id, suite=case.suite, case=case.label, matrix=case.matrix.model_dump(),
                shape=tuple(matrix.shape) if matrix is not None else None,
                nnz=int(matrix.nnz) if matrix is not None else None, pattern=case.matrix.pattern,
                sparsity=float(matrix.sparsity) if matrix is not None else case.matrix.sparsity,
                dtype=case.dtype, n=case.n, timings_are_gpu=settings.backend == "cuda", settings=settings.recorded())


def unbuilt_row(case: Case, settings: Settings, error: str) -> BenchRow:
    """The row of a case whose matrix could not be built (a broken file in a user's folder)."""
    return BenchRow(**_row_fields(case, None, settings), status="error", error=error[:2000],
                    correctness="no matrix")


DENSE_MEMORY_SHARE = 0.4  # of host RAM and of GPU memory the densified A may take


def dense_does_not_fit(matrix, env: dict) -> str | None:
    """Why the dense form of ``matrix`` cannot be built here, or None when it can.

    The harness densifies A for the cuBLAS baseline (in fp32 on the host first, then on the GPU):
    a 262144 x 262144 graph would need 275 GB. Such a case is recorded as an error row up front
    instead of letting a worker die of memory exhaustion minutes later.
    """
    m, k = matrix.shape
    need = 4 * m * k
    limits = {"host RAM": env.get("host_memory_bytes"), "GPU memory": env.get("gpu_memory_bytes")}
    for what, total in limits.items():
        if total and need > DENSE_MEMORY_SHARE * total:
            return (f"the dense form of this {m}x{k} matrix ({need / 1e9:.0f} GB in fp32) exceeds "
                    f"{DENSE_MEMORY_SHARE:.0%} of the {what} ({total / 1e9:.0f} GB): the dense cuBLAS baseline and "
                    "run_graph's dense timing need it, so the case was not run")
    return None


def measure_case(case: Case, matrix, settings: Settings, *, copy_gbs: float | None,
                 repeat_with_memory: bool = False, env: dict | None = None) -> BenchRow:
    """Everything for one case, as a `BenchRow`; failures are rows too (status / correctness say why)."""
    from sparseditto.harness import BenchError, bench, run_and_verify

    t0 = time.perf_counter()
    base = _row_fields(case, matrix, settings)
    too_big = dense_does_not_fit(matrix, env or {})
    if too_big:
        return BenchRow(**base, status="error", error=too_big, correctness="not run")
    try:
        result, graph_s = run_graph_for(case, matrix, settings)
    except Exception as exc:
        return BenchRow(**base, status="error", error=f"run_graph failed: {type(exc).__name__}: {exc}"[:2000],
                        correctness="no kernel: run_graph failed", case_seconds=time.perf_counter() - t0)
    chosen = chosen_kernel(result)
    base.update(chosen=chosen, detected_pattern=result.report.get("pattern"), run_graph_s=graph_s,
                run_graph_nodes=dict(result.node_seconds), summary=result.summary())
    spec = candidate_spec(result)
    common = dict(dtype=case.dtype, backend=settings.backend, timeout=settings.timeout_s)
    try:
        timed = bench(spec, matrix, case.n, repeats=settings.repeats, warmup=settings.warmup, baselines=True,
                      baseline_graphs=True, recheck_baselines=True, seed=settings.seed + 1,
                      chain=settings.chain and settings.backend == "cuda", **common)
    except BenchError as exc:
        return BenchRow(**base, status="ok", correct=False,
                        correctness=f"the chosen kernel failed when re-timed: {exc}"[:2000],
                        case_seconds=time.perf_counter() - t0)
    except Exception as exc:  # the harness itself failed: an error row, the run goes on
        return BenchRow(**base, status="error", error=f"bench failed: {type(exc).__name__}: {exc}"[:2000],
                        correctness="not timed", case_seconds=time.perf_counter() - t0)
    fresh = run_and_verify(spec, matrix, n_values=(case.n,), seed=settings.seed + 2, **common)
    timings = path_timings(timed, fresh, chosen)
    correct = bool(timed.reverified and fresh.ok)
    why = (f"re-verified after timing ({timed.reverify_message}); fresh inputs: {timings[0].recheck_message}"
           if correct else f"after timing: {timed.reverify_message}; fresh inputs: {timings[0].recheck_message}")
    nbytes = format_bytes(result, chosen, case.n, case.dtype)
    row = BenchRow(**base, status="ok", timings=timings, correct=correct, correctness=why[:2000],
                   format_bytes=nbytes, copy_bandwidth_gbs=copy_gbs, prepare_ms=timed.conversion_ms,
                   **speedups(timings), **format_roofline(nbytes, timings[0], copy_gbs))
    if settings.templates:
        from sparseditto.analysis import PatternReport
        from sparseditto.targets import Target

        from .sweep import selected_templates, sweep_templates

        row.templates = sweep_templates(selected_templates(settings.templates), matrix,
                                        PatternReport.model_validate(result.report),
                                        Target.model_validate(result.target["spec"]), n=case.n, dtype=case.dtype,
                                        settings=settings, grid=settings.grid, copy_gbs=copy_gbs)
    if repeat_with_memory:
        row.run_graph_memory_s, row.memory_repeat = memory_repeat(case, matrix, settings)
    row.case_seconds = time.perf_counter() - t0
    return row
