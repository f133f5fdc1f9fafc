"""The tables both reports show (summary.md and report.html), as header + cell strings.

One place formats a row, so the markdown and the HTML page can never disagree about a number.
"""
from __future__ import annotations

from .metrics import p_key
from .rows import DENSE_PATH, P_VALUES, BenchRow, SuiteSummary

DEFINITIONS = (
    "speedup = competitor time / chosen kernel time; graph-replayed vs graph-replayed when both have a "
    "CUDA-graph timing, else eager vs eager; every timing is a median with a cold L2, all paths timed in the "
    "same worker process.",
    "Dense cuBLAS is treated as a path a user would pick: 'best vendor sparse' is the fastest of cuSPARSE CSR "
    "(torch, CuPy), cuSPARSELt 2:4 and torch's Triton BSR; 'best of dense + vendor' adds dense cuBLAS. A chosen "
    "kernel that is dense cuBLAS itself scores exactly 1.0 against dense.",
    "fast_p = share of cases that are correct and at least p times as fast as the competitor (fast_0 = share "
    "correct); failed cases count in the denominator. Against vendor sparse, only cases where a vendor sparse "
    "path ran (and failed cases) count. Geomeans are over correct cases.",
    "correct = the chosen kernel's timed outputs re-checked against the fp64 reference after timing and the "
    "kernel verified again on fresh inputs (harness.numerics tolerance); vendor paths are re-checked on a fresh B.",
    "% roofline = (format bytes of A + B + C) / measured copy bandwidth, over the chosen kernel's time.",
    "first candidate won = of the correct cases whose chosen kernel is ours (not a vendor library), those where "
    "run_graph's first candidate was the winner (winner_rank 1; the rest were found later in the search).",
    "chained (GPU): the chosen kernel and dense cuBLAS launched back to back from one CUDA graph, each launch on "
    "its own L2-cold copy of the weight, per launch: a layer inside a model's graph, without the ~2 us a lone "
    "replay carries; 'x dense chained' compares those two.",
)

SUITE_HEADERS = ("suite", "cases", "correct", "errors", "geomean x dense", "geomean x dense chained",
                 "geomean x best vendor sparse",
                 "geomean x best of dense+vendor", *(f"fast_{p_key(p)}" for p in P_VALUES),
                 "fast_1 / fast_1.5 vs vendor sparse", "% roofline median (min)", "run_graph s first / repeat",
                 "prepare ms", "first candidate won")

ROW_HEADERS = ("case", "pattern", "detected", "N", "dtype", "chosen", "origin", "us graph", "us eager",
               "us chained", "dense us", "dense us chained", "best vendor sparse", "x dense", "x dense chained",
               "x best vendor", "x best alt", "% roof", "prepare ms",
               "run_graph s", "correct")


def fmt(x, digits: int = 2, suffix: str = "") -> str:
    return "-" if x is None else f"{x:.{digits}f}{suffix}"


def suite_cells(s: SuiteSummary) -> list[str]:
    alt, ven = s.fast_p_alternative.shares, s.fast_p_vendor.shares
    roof = "-" if s.pct_roofline_median is None else f"{s.pct_roofline_median:.0f} ({s.pct_roofline_min:.0f})"
    return [s.suite, str(s.cases), str(s.correct), str(s.errors), fmt(s.geomean_vs_dense),
            fmt(s.geomean_vs_dense_chain), fmt(s.geomean_vs_best_vendor), fmt(s.geomean_vs_best_alternative),
            *(f"{alt[p_key(p)]:.0%}" for p in P_VALUES),
            f"{ven[p_key(1.0)]:.0%} / {ven[p_key(1.5)]:.0%} (of {s.fast_p_vendor.cases})", roof,
            f"{fmt(s.run_graph_s_median, 1)} / {fmt(s.run_graph_memory_s_median, 1)}", fmt(s.prepare_ms_median, 1),
            f"{s.first_candidate_wins} of {s.generated_wins}" if s.generated_wins else "-"]


def worst_lines(summaries: list[SuiteSummary]) -> list[str]:
    """'suite: case: reason' for every suite's worst case (a failure first, else the lowest speedup)."""
    return [f"{s.suite}: {s.worst.case}: {s.worst.reason}" for s in summaries if s.worst is not None]


def row_cells(r: BenchRow) -> list[str]:
    chosen = r.timing("chosen")
    dense = r.timing(DENSE_PATH)
    vendor = r.timing(r.best_vendor.versus) if r.best_vendor else None
    dense_us = None if dense is None else (dense.graph_us or dense.eager_us)
    vendor_text = "-" if vendor is None else f"{vendor.name} {fmt(vendor.graph_us or vendor.eager_us, 1)}"
    if r.status == "error":
        verdict = f"error: {r.error}"[:160]
    else:
        verdict = "yes" if r.correct else f"NO: {r.correctness}"[:160]
    template = r.chosen.template if r.chosen else "-"
    if r.chosen and r.chosen.params:
        template += " " + ", ".join(f"{k}={v}" for k, v in sorted(r.chosen.params.items()))
    return [r.case, r.pattern, r.detected_pattern or "-", str(r.n), r.dtype, template,
            (r.chosen.origin or "-") if r.chosen else "-",
            fmt(chosen.graph_us if chosen else None, 1), fmt(chosen.eager_us if chosen else None, 1),
            fmt(chosen.chain_us if chosen else None, 1), fmt(dense_us, 1),
            fmt(dense.chain_us if dense else None, 1), vendor_text,
            fmt(r.speedup_vs_dense.value if r.speedup_vs_dense else None),
            fmt(r.speedup_vs_dense_chain.value if r.speedup_vs_dense_chain else None),
            fmt(r.best_vendor.value if r.best_vendor else None),
            fmt(r.best_alternative.value if r.best_alternative else None),
            fmt(r.pct_roofline, 0), fmt(r.prepare_ms, 1), fmt(r.run_graph_s, 1), verdict]


def environment_line(env: dict) -> str:
    if not env:
        return "environment: unknown"
    if env.get("backend") != "cuda":
        return (f"CPU, Triton interpreter ({env.get('platform')}); torch {env.get('torch')}, triton "
                f"{env.get('triton')}: NOT GPU timings, only correctness (fast_0) means anything")
    smi = env.get("nvidia_smi") or {}
    clocks = (f", SM clock {smi.get('clocks.sm')}/{smi.get('clocks.max.sm')} MHz, memory clock "
              f"{smi.get('clocks.mem')}/{smi.get('clocks.max.mem')} MHz, power limit {smi.get('power.limit')} W"
              if smi else "")
    return (f"{env.get('gpu')} ({env.get('sm_count')} SMs, L2 {int(env.get('l2_bytes') or 0) / 2**20:.0f} MiB, "
            f"compute capability {env.get('compute_capability')}), driver {env.get('driver')}{clocks}; "
            f"CUDA {env.get('torch_cuda')}, torch {env.get('torch')}, triton {env.get('triton')}, "
            f"cupy {env.get('cupy')}; copy bandwidth {fmt(env.get('copy_bandwidth_gbs'), 0)} GB/s")


SWEEP_HEADERS = ("case", "template", "params", "status", "us graph", "us eager", "x dense", "% roof", "message")


def sweep_cells(rows: list[BenchRow]) -> list[list[str]]:
    """One line per (case, template) of the optional template sweep."""
    out = []
    for r in rows:
        for t in r.templates:
            out.append([r.case, t.template, ", ".join(f"{k}={v}" for k, v in sorted(t.params.items())), t.status,
                        fmt(t.graph_us, 1), fmt(t.eager_us, 1),
                        fmt(t.speedup_vs_dense.value if t.speedup_vs_dense else None), fmt(t.pct_roofline, 0),
                        t.message[:160]])
    return out
