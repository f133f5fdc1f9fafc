"""Per-suite metrics over `BenchRow`s: geomeans, fast_p, % of roofline, wall times, the worst case.

Definitions (stated again in every summary):

* speedup = competitor time / chosen kernel time, graph-replayed vs graph-replayed when both have
  a CUDA-graph timing, eager vs eager otherwise.
* Dense cuBLAS counts as a path a user would pick. Two competitors are therefore reported: the
  best *vendor sparse* path (cuSPARSE CSR via torch / CuPy, cuSPARSELt 2:4, torch Triton BSR) and
  the best of *dense + vendor sparse*. A kernel that is dense cuBLAS itself scores exactly 1.0
  against dense.
* fast_p = (cases that are correct and at least p times as fast as the competitor) / (cases);
  fast_0 = share correct. The denominator counts failed cases (they are never fast); for the
  vendor-sparse competitor it counts only cases where at least one vendor sparse path ran (and
  the failed ones, which never got that far).
* Geomeans are over correct cases that have the ratio.
"""
from __future__ import annotations

import math
import statistics
from collections import Counter

from .rows import P_VALUES, VENDOR_PATHS, BenchRow, FastP, SuiteSummary, WorstCase


def geomean(values) -> float | None:
    xs = [float(v) for v in values if v is not None and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def median(values) -> float | None:
    xs = [float(v) for v in values if v is not None]
    return statistics.median(xs) if xs else None


def p_key(p: float) -> str:
    return f"{p:g}"


def competitor(row: BenchRow, versus: str):
    return row.best_vendor if versus == "best_vendor_sparse" else row.best_alternative


def fast_p(rows: list[BenchRow], versus: str, p_values=P_VALUES) -> FastP:
    """fast_p against ``versus`` ("best_vendor_sparse" or "best_of_dense_and_vendor")."""
    if versus == "best_vendor_sparse":
        # cases where a vendor sparse path ran, plus the failed ones (never timed, never fast)
        pool = [r for r in rows if _any_vendor_ran(r) or not r.timings]
    else:
        pool = list(rows)
    shares = {}
    for p in p_values:
        hits = 0
        for r in pool:
            s = competitor(r, versus)
            if r.correct and (p == 0 or (s is not None and s.value >= p)):
                hits += 1
        shares[p_key(p)] = hits / len(pool) if pool else 0.0
    return FastP(versus=versus, cases=len(pool), shares=shares)


def _any_vendor_ran(row: BenchRow) -> bool:
    return any(t.ok for t in row.timings if t.name in VENDOR_PATHS)


def worst_case(rows: list[BenchRow]) -> WorstCase | None:
    """A failed case if there is one (its error), else the lowest speedup vs dense + vendor, with
    the reason `run_graph` gave for its choice (and the profiler's bottleneck line)."""
    if not rows:
        return None
    failed = [r for r in rows if r.status == "error" or not r.correct]
    if failed:
        r = failed[0]
        return WorstCase(case=r.case, speedup=None, reason=(r.error or r.correctness)[:500])
    r = min(rows, key=lambda x: x.best_alternative.value if x.best_alternative else math.inf)
    s = r.best_alternative
    reason = (r.chosen.reason if r.chosen else "") or ""
    if r.chosen and r.chosen.bottleneck:
        reason += f" [profile: {r.chosen.bottleneck}]"
    label = f"{s.value:.2f}x vs {s.versus} ({s.basis}); " if s else ""
    return WorstCase(case=r.case, speedup=s.value if s else None,
                     reason=f"{label}chose {r.chosen.template if r.chosen else '?'}: {reason}"[:600])


def summarize_suite(suite: str, rows: list[BenchRow]) -> SuiteSummary:
    ok = [r for r in rows if r.correct]
    # issue 10: the planner's first candidate should usually be the winner; a vendor answer has no rank
    ranked = [r.chosen.winner_rank for r in ok if r.chosen and r.chosen.origin != "vendor" and r.chosen.winner_rank]
    return SuiteSummary(
        suite=suite, cases=len(rows), errors=sum(r.status == "error" for r in rows), correct=len(ok),
        timings_are_gpu=bool(rows) and all(r.timings_are_gpu for r in rows),
        geomean_vs_dense=geomean(r.speedup_vs_dense.value for r in ok if r.speedup_vs_dense),
        geomean_vs_dense_chain=geomean(r.speedup_vs_dense_chain.value for r in ok if r.speedup_vs_dense_chain),
        geomean_vs_best_vendor=geomean(r.best_vendor.value for r in ok if r.best_vendor),
        geomean_vs_best_alternative=geomean(r.best_alternative.value for r in ok if r.best_alternative),
        fast_p_vendor=fast_p(rows, "best_vendor_sparse"),
        fast_p_alternative=fast_p(rows, "best_of_dense_and_vendor"),
        pct_roofline_median=median(r.pct_roofline for r in ok),
        pct_roofline_min=min((r.pct_roofline for r in ok if r.pct_roofline is not None), default=None),
        run_graph_s_median=median(r.run_graph_s for r in rows),
        run_graph_memory_s_median=median(r.run_graph_memory_s for r in rows),
        prepare_ms_median=median(r.prepare_ms for r in rows),
        chosen_templates=dict(Counter(r.chosen.template for r in rows if r.chosen).most_common()),
        generated_wins=len(ranked), first_candidate_wins=sum(1 for rank in ranked if rank == 1),
        worst=worst_case(rows))


def summarize(rows: list[BenchRow]) -> list[SuiteSummary]:
    """One summary per suite (in first-seen order), then ``all`` when several suites are present."""
    suites = list(dict.fromkeys(r.suite for r in rows))
    out = [summarize_suite(s, [r for r in rows if r.suite == s]) for s in suites]
    if len(suites) > 1:
        out.append(summarize_suite("all", rows))
    return out
