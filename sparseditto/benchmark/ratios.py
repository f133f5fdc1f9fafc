"""Like-for-like ratios: speedups of the chosen kernel over each competitor, and roofline fractions.

Shared by the per-case measurement and the template sweep, so both compare on the same basis:
graph-replayed against graph-replayed when both paths have a graph timing, eager against eager
otherwise (the basis travels with each ratio).
"""
from __future__ import annotations

from typing import Any

from .rows import DENSE_PATH, VENDOR_PATHS, PathTiming, Speedup


def ratio(chosen: PathTiming, other: PathTiming) -> Speedup | None:
    """other / chosen on the graph basis when both have one, else eager; None if either is missing."""
    if not (chosen.ok and other.ok):
        return None
    if chosen.graph_us and other.graph_us:
        return Speedup(versus=other.name, value=other.graph_us / chosen.graph_us, basis="graph")
    if chosen.eager_us and other.eager_us:
        return Speedup(versus=other.name, value=other.eager_us / chosen.eager_us, basis="eager")
    return None


def chain_ratio(chosen: PathTiming, other: PathTiming) -> Speedup | None:
    """other / chosen on the chained basis (both timed chained), else None."""
    if chosen.ok and other.ok and chosen.chain_us and other.chain_us:
        return Speedup(versus=other.name, value=other.chain_us / chosen.chain_us, basis="chain")
    return None


def speedups(timings: list[PathTiming]) -> dict[str, Any]:
    """vs dense (single launches, and chained where both were), vs each vendor path, the hardest
    vendor and the hardest of dense + vendors."""
    chosen = timings[0]
    dense = next((t for t in timings if t.name == DENSE_PATH), None)
    vs_dense = ratio(chosen, dense) if dense is not None else None
    vs_dense_chain = chain_ratio(chosen, dense) if dense is not None else None
    vendors = [s for s in (ratio(chosen, t) for t in timings if t.name in VENDOR_PATHS) if s is not None]
    best_vendor = min(vendors, key=lambda s: s.value) if vendors else None
    pool = vendors + ([vs_dense] if vs_dense is not None else [])
    best_alt = min(pool, key=lambda s: s.value) if pool else None
    return {"speedup_vs_dense": vs_dense, "speedup_vs_dense_chain": vs_dense_chain, "speedups_vs_vendor": vendors,
            "best_vendor": best_vendor, "best_alternative": best_alt}


def format_roofline(row_bytes: float | None, chosen: PathTiming, copy_gbs: float | None) -> dict:
    """roofline_us (bytes at the measured copy bandwidth), % of it reached, achieved GB/s."""
    kernel_us = chosen.graph_us or chosen.eager_us
    if not (row_bytes and kernel_us and copy_gbs):
        return {}
    roof_us = row_bytes / (copy_gbs * 1e9) * 1e6
    return {"roofline_us": roof_us, "pct_roofline": 100.0 * roof_us / kernel_us,
            "achieved_gbs": row_bytes / (kernel_us * 1e-6) / 1e9}
