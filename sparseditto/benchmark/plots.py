"""The report's plots (matplotlib, Agg), returned as PNG bytes so the HTML page can embed them.

Four views: speedup over dense against sparsity per pruning pattern, a roofline scatter (achieved
bandwidth against the bytes the format moves, with the measured copy bandwidth as the ceiling),
per-suite geomean bars, and the fast_p curve. Every axis is labelled, and a plot made from CPU
interpreter timings says so in its title.
"""
from __future__ import annotations

import io

from .metrics import fast_p, p_key
from .rows import BenchRow, SuiteSummary

CPU_NOTE = "\n[CPU interpreter: NOT GPU timings]"
MARKERS = "os^Dvp*hX<>"
LINESTYLES = ("-", "--", ":", "-.")   # one per matrix shape in the speedup-vs-sparsity plot


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    _plt().close(fig)
    return buf.getvalue()


SPEEDUP_TICKS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)


def _speedup_axis(ax, values) -> None:
    """A log speedup axis read as plain factors (0.5x, 1x, 1.5x, 2x ...), not 2x10^0: the ticks of
    SPEEDUP_TICKS inside the data's range, padded to include 1x."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    vals = [v for v in values if v and v > 0] + [1.0]
    lo, hi = min(vals) / 1.15, max(vals) * 1.15
    ax.set_yscale("log")
    ax.set_ylim(lo, hi)
    ticks = [t for t in SPEEDUP_TICKS if lo <= t <= hi]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}x"))


def _note(rows: list[BenchRow]) -> str:
    return "" if rows and all(r.timings_are_gpu for r in rows) else CPU_NOTE


def speedup_series(rows: list[BenchRow], suite: str) -> list[tuple[str, int, tuple, list[float], list[float]]]:
    """(pattern, N, shape, sparsities in %, speedups over dense) per line of the speedup-vs-sparsity plot: one
    pattern's correct cases at one N on one matrix shape in one dtype, by sparsity. Why per shape: joined across
    shapes (4096x4096 and 11008x4096 at 50% and 70%), a line zigzagged between them and read as a trend that is
    not there."""
    pts = [r for r in rows if r.suite == suite and r.correct and r.speedup_vs_dense]
    lines: dict[tuple, list[BenchRow]] = {}
    for r in pts:
        lines.setdefault((r.pattern, r.n, tuple(r.shape or (0, 0)), r.dtype), []).append(r)
    return [(pattern, n, shape, [100 * r.sparsity for r in sel], [r.speedup_vs_dense.value for r in sel])
            for (pattern, n, shape, _dtype), rs in sorted(lines.items())
            for sel in [sorted(rs, key=lambda r: r.sparsity)]]


def speedup_vs_sparsity(rows: list[BenchRow], suite: str) -> bytes | None:
    pts = [r for r in rows if r.suite == suite and r.correct and r.speedup_vs_dense]
    if not pts:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    ns = sorted({r.n for r in pts})
    shapes = sorted({tuple(r.shape or (0, 0)) for r in pts})
    dashed = len(shapes) <= len(LINESTYLES)
    colors: dict[str, str] = {}
    for pattern, n, shape, xs, ys in speedup_series(rows, suite):
        style = LINESTYLES[shapes.index(shape)] if dashed else "-"
        line, = ax.plot(xs, ys, marker=MARKERS[ns.index(n) % len(MARKERS)], linestyle=style if len(xs) > 1 else "none",
                        color=colors.get(pattern), label=None if pattern in colors else pattern, alpha=0.85)
        colors.setdefault(pattern, line.get_color())
    for n in ns:
        ax.plot([], [], marker=MARKERS[ns.index(n) % len(MARKERS)], color="gray", linestyle="none", label=f"N={n}")
    if dashed and len(shapes) > 1:
        for i, (m, k) in enumerate(shapes):
            ax.plot([], [], color="gray", linestyle=LINESTYLES[i], label=f"{m}x{k}")
    ax.axhline(1.0, color="gray", linestyle="--", linewidth=1)
    _speedup_axis(ax, [r.speedup_vs_dense.value for r in pts])
    ax.set_xlabel("sparsity (%)")
    ax.set_ylabel("speedup over dense cuBLAS (x, log)")
    ax.set_title(f"{suite}: chosen kernel vs dense, per pattern{_note(pts)}", fontsize=10)
    ax.legend(fontsize=7, ncol=2, loc="best")
    ax.grid(True, which="both", alpha=0.3)
    return _png(fig)


def roofline_scatter(rows: list[BenchRow]) -> bytes | None:
    pts = [r for r in rows if r.correct and r.achieved_gbs and r.format_bytes]
    if not pts:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for suite in dict.fromkeys(r.suite for r in pts):
        sel = [r for r in pts if r.suite == suite]
        ax.scatter([r.format_bytes / 1e6 for r in sel], [r.achieved_gbs for r in sel], label=suite, alpha=0.8, s=22)
    ceilings = sorted({r.copy_bandwidth_gbs for r in pts if r.copy_bandwidth_gbs})
    for i, c in enumerate(ceilings):
        ax.axhline(c, color="red", linestyle="--", linewidth=1, label="measured copy bandwidth" if i == 0 else None)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("bytes the chosen format moves: A + B + C (MB, log)")
    ax.set_ylabel("achieved bandwidth (GB/s, log)")
    ax.set_title(f"Roofline: achieved bandwidth vs bytes moved{_note(pts)}", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    return _png(fig)


def suite_bars(summaries: list[SuiteSummary], rows: list[BenchRow]) -> bytes | None:
    sums = [s for s in summaries if s.correct]
    if not sums:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    series = (("vs dense cuBLAS", "geomean_vs_dense"), ("vs best vendor sparse", "geomean_vs_best_vendor"),
              ("vs best of dense + vendor", "geomean_vs_best_alternative"))
    width = 0.8 / len(series)
    for i, (label, field) in enumerate(series):
        xs = [j + (i - 1) * width for j in range(len(sums))]
        ys = [getattr(s, field) for s in sums]
        bars = ax.bar(xs, [y or float("nan") for y in ys], width=width, label=label)
        for bar, y in zip(bars, ys):
            if y:
                ax.annotate(f"{y:.2f}", (bar.get_x() + bar.get_width() / 2, y), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(sums)), [s.suite for s in sums])
    ax.axhline(1.0, color="gray", linestyle="--", linewidth=1)
    _speedup_axis(ax, [getattr(s, f) for s in sums for _, f in series])
    ax.set_xlabel("suite")
    ax.set_ylabel("geomean speedup (x, log)")
    ax.set_title(f"Geomean speedup of the chosen kernels per suite{_note(rows)}", fontsize=10)
    ax.legend(fontsize=8)
    return _png(fig)


def fast_p_curve(rows: list[BenchRow]) -> bytes | None:
    if not rows:
        return None
    plt = _plt()
    ps = [i / 20 for i in range(0, 81)]  # p from 0 to 4
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for suite in dict.fromkeys(r.suite for r in rows):
        sel = [r for r in rows if r.suite == suite]
        for versus, style in (("best_of_dense_and_vendor", "-"), ("best_vendor_sparse", ":")):
            fp = fast_p(sel, versus, p_values=ps)
            if fp.cases:
                ax.plot(ps, [fp.shares[p_key(p)] for p in ps], linestyle=style,
                        label=f"{suite} vs {versus.replace('_', ' ')}")
    ax.axvline(1.0, color="gray", linestyle="--", linewidth=1)
    ax.set_xlabel("p (required speedup over the competitor)")
    ax.set_ylabel("fast_p (share of cases)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"fast_p: correct and at least p times faster{_note(rows)}", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)
    return _png(fig)


def all_plots(rows: list[BenchRow], summaries: list[SuiteSummary]) -> list[tuple[str, bytes]]:
    """(caption, PNG) for every plot that has data."""
    out = []
    for suite in dict.fromkeys(r.suite for r in rows):
        png = speedup_vs_sparsity(rows, suite)
        if png:
            out.append((f"{suite}: speedup over dense cuBLAS against sparsity, one line per pattern, N and matrix "
                        "shape (colour = pattern, marker = N, line style = shape)", png))
    for caption, png in (("Roofline: achieved bandwidth (format bytes / time) against the bytes moved; "
                          "the dashed line is the measured copy bandwidth", roofline_scatter(rows)),
                         ("Per-suite geomean speedups", suite_bars(summaries, rows)),
                         ("fast_p curves (solid: vs best of dense + vendor; dotted: vs best vendor sparse)",
                          fast_p_curve(rows))):
        if png:
            out.append((caption, png))
    return out
