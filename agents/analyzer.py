"""Analyzer node: what pattern is this, and have we seen it before?

It loads the matrix from the artifact store (the state only holds its key), runs the pattern
analysis, opens the run in the trajectory memory, and looks the pattern up there:

* an **exact hit** (same signature, N bucket, dtype, GPU) is pinned at the front of the queue as an
  origin-"memory" candidate carrying the stored source; it still goes through the debugger's full
  verification before anything trusts it;
* otherwise the nearest **neighbours** (same pattern class, dtype and N bucket) become planning priors: the
  policy sees their best template and parameters.

Memory hits are normalized here to one small shape so that policies never depend on the memory's
row layout: ``{"kind": "exact"|"neighbour", "template", "params", ...}``.
"""
from __future__ import annotations

import time
from typing import Literal

from langgraph.runtime import Runtime
from langgraph.types import Command

from sparseditto.agents.kit import (decision, emit, memory_gpu_key, record_step, run_hook, run_memory,
                                    start_memory_run)
from sparseditto.agents.state import Context, State, effective_context
from sparseditto.harness.vendor_kernels import is_vendor_kernel

NEIGHBOURS = 3


def normalize_exact(hit: dict) -> dict:
    best_template = hit.get("run_best_template")
    timings = hit.get("timings") or {}
    out = {
        "kind": "exact", "run_id": hit.get("run_id"), "candidate_id": hit.get("candidate_id"),
        "template": hit.get("template"), "params": hit.get("params") or {}, "source": hit.get("source"),
        "source_hash": hit.get("source_hash"), "origin": hit.get("origin"),
        "median_ms": timings.get("median_ms"), "speedup_vs_dense": hit.get("best_speedup_vs_dense"),
        "gpu": hit.get("gpu"), "created": hit.get("created"), "n_values": list(hit.get("n_values") or []),
    }
    if hit.get("origin") == "vendor":   # the run's answer was a vendor path: reused like dense, rebuilt
        out.update(params={}, source=None, source_hash=None,
                   reason=f"the vendor path {hit.get('template')} was the fastest verified kernel of that run")
    elif best_template == "dense":
        out.update(template="dense", params={}, source=None, origin="vendor",
                   reason=f"dense won that run (fastest sparse was {hit.get('template')})")
    return out


def normalize_neighbour(hit: dict) -> dict:
    return {
        "kind": "neighbour", "run_id": hit.get("run_id"), "distance": hit.get("distance"),
        "matrix_name": hit.get("matrix_name"), "pattern": hit.get("pattern"), "shape": hit.get("shape"),
        "template": hit.get("best_template"), "params": hit.get("best_params") or {},
        "speedup_vs_dense": hit.get("best_speedup_vs_dense"), "gpu": hit.get("gpu"),
        "n_values": list(hit.get("n_values") or []),
    }


def lookup_memory(mem, report, ctx: Context, exclude_run: str | None) -> list[dict]:
    """Exact hit first; neighbours (same pattern class, dtype and N range, those run within 2x of
    these N first) only when there is none.

    Why the N range: a neighbour's winner at another N is the wrong first candidate. On the H200
    (session 36, `sparseditto bench --suite llm`) the N = 1 runs of 4096x4096 70% / 90% and 11008x4096
    50% started from tc_words and tc_dense, the best generated kernels of their 4096x4096 50% neighbour's
    N = 16 / 64 runs, and reached delta_spmv, the winner at N = 1 by 1.2-1.7x, only second or third of three."""
    from sparseditto.agents.costing import exact_hit_usable
    from sparseditto.memory import found_at_this_n, n_bucket

    bucket = n_bucket(list(ctx.n_values))
    exact = mem.exact_hit(report.signature, bucket, ctx.dtype, memory_gpu_key(ctx))
    if exact is not None and exact_hit_usable(exact, ctx):   # costing: judged against the target too
        return [normalize_exact(exact)]
    near = mem.neighbours(report.feature_vector(), pattern=report.pattern, dtype=ctx.dtype, n_bucket=bucket,
                          k=NEIGHBOURS * 3, exclude_run=exclude_run)
    # within the bucket, runs at about this N first (nearest first among them): the graphs suite runs
    # each matrix at N = 32 then 128, where the row split and the row-decomposed kernel trade places
    near.sort(key=lambda h: not found_at_this_n(h.get("n_values"), ctx.n_values))
    out = []
    for h in near:
        if len(out) == NEIGHBOURS:
            break
        hit = normalize_neighbour(h)
        if hit["template"] is None or is_vendor_kernel(hit["template"]):
            # Dense or a vendor library won there (often just launch-bound at that size); its fastest
            # verified generated kernel is still the best-informed place to start the search here.
            fastest = _fastest_sparse(mem, h["run_id"])
            if fastest is None:
                continue
            hit.update(template=fastest["template"], params=fastest.get("params") or {},
                       note=f"{h.get('best_template') or 'dense'} won that run; this was its best verified generated kernel")
        out.append(hit)
    return out


def _fastest_sparse(mem, run_id: str) -> dict | None:
    """A past run's best verified candidate: by measured GPU time, or by roofline estimate when
    it ran on the interpreter (CPU timings rank nothing)."""
    try:
        cands = mem.get_run(run_id)["candidates"]
    except Exception:
        return None
    verified = [c for c in cands if c.get("status") == "verified" and c.get("origin") != "vendor"]

    def key(c: dict) -> float:
        t = c.get("timings") or {}
        value = t.get("median_ms") if t.get("timings_are_gpu") else t.get("expected_ms")
        return float(value) if isinstance(value, (int, float)) else float("inf")

    return min(verified, key=key) if verified else None


def analyzer(state: State, runtime: Runtime[Context]) -> Command[Literal["planner"]]:
    ctx = effective_context(runtime.context, state)
    run_hook(ctx, "analyzer", state)
    from sparseditto.analysis import analyze
    from sparseditto.artifacts import get_matrix

    matrix = get_matrix(state["matrix_key"])
    emit("analyzer", f"analyzing {matrix.name}: {matrix.shape[0]}x{matrix.shape[1]}, nnz={matrix.nnz}, "
                     f"sparsity {matrix.sparsity:.1%}")
    t0 = time.perf_counter()
    report = analyze(matrix)
    emit("analyzer", f"pattern {report.pattern} (confidence {report.confidence:.2f}, {report.params or 'no params'}) "
                     f"in {time.perf_counter() - t0:.2f} s")

    update: dict = {"report": report.model_dump(mode="json"), "memory_hits": [], "queue": []}
    decisions = []
    events = []
    mem = run_memory(ctx)
    memory_run_id = state.get("memory_run_id")
    if mem is not None:
        try:
            if not memory_run_id:
                memory_run_id = update["memory_run_id"] = start_memory_run(mem, ctx, state, report, matrix)
            hits = lookup_memory(mem, report, ctx, exclude_run=memory_run_id)
        except Exception as exc:  # a broken memory file costs the priors, never the run
            hits = []
            events.append({"node": "analyzer", "event": "memory_unavailable", "detail": str(exc)})
            emit("analyzer", f"memory unavailable: {exc}")
        update["memory_hits"] = hits
        exact = next((h for h in hits if h["kind"] == "exact"), None)
        if exact is not None and exact.get("origin") != "vendor" and exact["template"] != "dense":
            spec = {"template": exact["template"], "params": exact["params"], "source": exact["source"],
                    "origin": "memory", "expected_ms": exact.get("median_ms"), "pinned": True,
                    "rationale": (f"memory exact hit (run {str(exact['run_id'])[:8]}): re-verify the stored "
                                  f"{exact['template']} kernel before searching")}
            update["queue"] = [spec]
            decisions.append(decision("analyzer", "memory_exact_hit", spec["rationale"],
                                      template=exact["template"], params=exact["params"]))
        elif exact is not None:
            decisions.append(decision("analyzer", "memory_exact_hit",
                                      f"memory exact hit: {exact['template']} was best for this pattern "
                                      f"({exact.get('reason')}); finalize measures the vendor paths again"))
        elif hits:
            h = hits[0]
            decisions.append(decision(
                "analyzer", "memory_neighbours",
                f"{len(hits)} neighbour(s) in memory; nearest '{h['matrix_name']}' ({h['pattern']}, distance "
                f"{float(h['distance'] or 0):.3f}) was best with {h['template']}"))
        else:
            decisions.append(decision("analyzer", "memory_miss", "no similar pattern in memory: plan from the cost model"))
    else:
        decisions.append(decision("analyzer", "memory_off", "memory disabled for this run"))
    decisions.insert(0, decision("analyzer", "analyze",
                                 f"{report.pattern} pattern (confidence {report.confidence:.2f}), sparsity "
                                 f"{report.sparsity:.1%}, signature {report.signature[:12]}"))
    opened = {**state, "memory_run_id": memory_run_id}
    for d in decisions:
        emit("analyzer", d["rationale"])
        record_step(ctx, opened, "analyzer", "decision", d)
    update["decisions"] = decisions
    update["events"] = events
    return Command(goto="planner", update=update)
