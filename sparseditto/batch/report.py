"""The batch's ``report.json`` (the `BatchReport` as is) and ``report.html`` (one self-contained
page: the layer table and four plots: speedup by layer, time saved by layer, the batch's own
seconds per layer by phase (where a batch's time goes), pattern mix).

The page reuses the benchmark report's style, sortable table and matplotlib plumbing
(`sparseditto.benchmark.report_html` / `plots`), so the two reports look and behave alike; a
machine without matplotlib gets every table and a line saying how to add the plots.
"""
from __future__ import annotations

import html
import os
from collections import Counter
from pathlib import Path

from sparseditto.batch.models import BatchReport, LayerResult
from sparseditto.benchmark.plots import CPU_NOTE, _plt, _png
from sparseditto.benchmark.report_html import SORT_JS, STYLE, _table, figure_tags

HEADERS = ["layer", "shape", "pattern", "sparsity", "status", "kernel", "params", "kernel us", "dense us",
           "speedup vs dense", "vs best vendor", "time saved us", "seconds", "phases s", "reason"]

# the order phases are stacked in, and their labels; "analyze" ran in the pass before the groups
PHASES = (("search", "full search (run_graph)"), ("verify", "verification"), ("time", "timing (kernel + vendor)"),
          ("dense", "dense timing"), ("load", "load"), ("other", "other"), ("analyze", "analysis pass (threads)"))


def _us(ms: float | None) -> str:
    return "" if ms is None else f"{ms * 1e3:.2f}"


def _x(v: float | None) -> str:
    return "" if v is None else f"{v:.2f}x"


def layer_cells(x: LayerResult) -> list[str]:
    vendor = f"{x.speedup_vs_vendor:.2f}x ({x.best_vendor})" if x.speedup_vs_vendor else ""
    status = x.status + (" (SLOWER than previous)" if x.slower_than_previous else "")
    sparsity = "" if x.sparsity is None else f"{x.sparsity:.1%}"
    return [x.name, "x".join(str(s) for s in x.shape), x.pattern or "", sparsity,
            status, x.template or "", ", ".join(f"{k}={v}" for k, v in sorted(x.params.items())), _us(x.kernel_ms),
            _us(x.dense_ms), _x(x.speedup_vs_dense), vendor, _us(x.time_saved_ms), f"{x.seconds:.1f}",
            ", ".join(f"{k} {v:.1f}" for k, v in phase_split(x).items() if v >= 0.05), x.reason]


def phase_split(x: LayerResult) -> dict[str, float]:
    """The layer's seconds by phase, in `PHASES` order; "other" is what no phase claims (journal,
    estimates, the shared / skipped bookkeeping)."""
    known = {k: float(v) for k, v in x.phase_seconds.items()}
    inside = sum(v for k, v in known.items() if k != "analyze")
    known["other"] = max(0.0, x.seconds - inside)
    return {k: known[k] for k, _ in PHASES if k in known}


def _phase_bars(layers: list[LayerResult], title: str) -> bytes:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6.5, 0.28 * len(layers) + 2), 4.6))
    bottom = [0.0] * len(layers)
    splits = [phase_split(x) for x in layers]
    colors = ("#e45756", "#4c78a8", "#f58518", "#72b7b2", "#54a24b", "#bab0ac", "#b279a2")
    for (key, label), color in zip(PHASES, colors):
        heights = [sp.get(key, 0.0) for sp in splits]
        if any(heights):
            ax.bar(range(len(layers)), heights, bottom=bottom, color=color, label=label)
            bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_xticks(range(len(layers)), [x.name for x in layers], rotation=70, ha="right", fontsize=7)
    ax.set_xlabel("layer")
    ax.set_ylabel("batch seconds on the layer")
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=10)
    return _png(fig)


def _bars(values: list[tuple[str, float]], ylabel: str, title: str, reference: float | None) -> bytes:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6.5, 0.28 * len(values) + 2), 4.2))
    ax.bar(range(len(values)), [v for _, v in values], color="#4c78a8")
    ax.set_xticks(range(len(values)), [n for n, _ in values], rotation=70, ha="right", fontsize=7)
    if reference is not None:
        ax.axhline(reference, color="gray", linestyle="--", linewidth=1)
    ax.set_xlabel("layer")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    return _png(fig)


def plots(report: BatchReport) -> list[tuple[str, bytes]]:
    """(caption, PNG) of each plot with data."""
    note = "" if report.timings_are_gpu else CPU_NOTE
    worked = [x for x in report.layers if x.status not in ("skipped", "failed")]
    out = []
    speed = [(x.name, x.speedup_vs_dense) for x in worked if x.speedup_vs_dense]
    if speed:
        out.append(("Speedup of the chosen kernel over dense, per layer (1.0 = dense)",
                    _bars(speed, "speedup over dense (x)", f"Speedup by layer{note}", 1.0)))
    saved = [(x.name, (x.time_saved_ms or 0.0) * 1e3) for x in worked if x.time_saved_ms is not None]
    if saved:
        out.append(("Time saved per call at N, per layer (dense time minus kernel time)",
                    _bars(saved, "time saved per call (us)", f"Time saved by layer{note}", 0.0)))
    timed = [x for x in worked if x.phase_seconds]
    if timed:
        out.append(("The batch's own seconds per layer, by phase (a searched layer's full search against a "
                    "reused layer's verification and timing)", _phase_bars(timed, "Where the batch's time went")))
    mix = Counter(x.pattern for x in worked if x.pattern)
    if mix:
        plt = _plt()
        fig, ax = plt.subplots(figsize=(5.5, 4.2))
        ax.pie(list(mix.values()), labels=[f"{k} ({v})" for k, v in mix.items()], autopct="%1.0f%%")
        ax.set_title("Pattern mix of the layers worked on", fontsize=10)
        out.append(("Pattern classes of the layers worked on", _png(fig)))
    return out


def render_html(report: BatchReport) -> str:
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>SparseDitto batch</title>",
             f"<style>{STYLE}</style></head><body>", "<h1>SparseDitto batch</h1>"]
    if not report.timings_are_gpu:
        parts.append("<p class='warn'>Not GPU timings: this batch ran on the CPU (Triton interpreter). Kernel and "
                     "dense times are the roofline cost model's estimates on the target.</p>")
    if not report.complete:
        parts.append("<p class='incomplete'>Incomplete: run the same command with <code>--resume</code>.</p>")
    if report.target_note:
        parts.append(f"<p class='warn'>Target: {html.escape(report.target_note)}.</p>")
    setting = {k: html.escape(str(report.settings.get(k))) for k in ("target", "n", "dtype")}
    parts.append(f"<p>Model: <code>{html.escape(report.model)}</code>; target {setting['target']}"
                 f", N={setting['n']}, dtype {setting['dtype']}; "
                 f"{len(report.layers)} tensors, {report.groups} group(s); "
                 f"{html.escape(', '.join(f'{v} {k}' for k, v in sorted(report.counts().items())))}; "
                 f"{report.wall_seconds:.1f} s.</p>")
    slower = [x.name for x in report.layers if x.slower_than_previous]
    if slower:
        parts.append(f"<p class='incomplete'>Slower than the previous report: {html.escape(', '.join(slower))}</p>")
    parts.append("<h2>Plots</h2>")
    try:
        figures = plots(report)
        if not figures:
            parts.append("<p>No layer with timings: nothing to plot.</p>")
    except ImportError as exc:
        figures = []
        parts.append(f"<p class='incomplete'>No plots: {html.escape(str(exc))} "
                     "(<code>pip install 'sparseditto[report]'</code>).</p>")
    parts.extend(figure_tags(figures))
    parts.append(f"<h2>Layers ({len(report.layers)})</h2><p>Click a column header to sort.</p>")
    parts.append(_table(HEADERS, [layer_cells(x) for x in report.layers]))
    parts.append(f"<script>{SORT_JS}</script></body></html>")
    return "".join(parts)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_reports(out: Path, report: BatchReport) -> None:
    _atomic_write(out / "report.json", report.model_dump_json(indent=1))
    _atomic_write(out / "report.html", render_html(report))
