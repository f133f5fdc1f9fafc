"""``report.html``: one self-contained page (inline CSS, base64 PNG plots, a click-to-sort table).

Self-contained so it can be mailed, attached to an issue or opened from a copied folder: nothing
is fetched when it is viewed.
"""
from __future__ import annotations

import base64
import html

from .plots import all_plots
from .rows import BenchRow, SuiteSummary
from .tables import (DEFINITIONS, ROW_HEADERS, SUITE_HEADERS, SWEEP_HEADERS, environment_line, row_cells, suite_cells,
                     sweep_cells, worst_lines)

STYLE = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#222;max-width:1500px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px}
.warn{background:#fff3cd;border:1px solid #e0c36c;padding:10px 14px;border-radius:4px;font-weight:600}
.incomplete{background:#fde2e1;border:1px solid #e99;padding:8px 12px;border-radius:4px}
table{border-collapse:collapse;font-size:12px;margin:8px 0}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top;max-width:340px;overflow-wrap:break-word}
th{background:#f0f3f7;cursor:pointer;user-select:none}
th:after{content:" \\2195";color:#999;font-size:10px}
tr:nth-child(even) td{background:#fafafa}
td.bad{color:#b00020;font-weight:600}
figure{display:inline-block;margin:8px 12px 8px 0;vertical-align:top}
figcaption{font-size:12px;color:#555;max-width:650px}
code{background:#f4f4f4;padding:1px 4px}
ul.defs li{font-size:13px;margin:3px 0}
"""

SORT_JS = """
document.querySelectorAll('table.sortable').forEach(function(t){
  t.querySelectorAll('th').forEach(function(th,i){
    th.addEventListener('click',function(){
      var body=t.tBodies[0], rows=Array.from(body.rows), asc=th.dataset.asc!=='1';
      rows.sort(function(a,b){
        var x=a.cells[i].innerText, y=b.cells[i].innerText, fx=parseFloat(x), fy=parseFloat(y);
        var c=(!isNaN(fx)&&!isNaN(fy))?fx-fy:x.localeCompare(y);
        return asc?c:-c;});
      rows.forEach(function(r){body.appendChild(r);});
      t.querySelectorAll('th').forEach(function(h){delete h.dataset.asc;});
      th.dataset.asc=asc?'1':'0';});});});
"""


def _table(headers, rows, sortable: bool = True, bad_column: int | None = None) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = []
    for cells in rows:
        tds = []
        for i, c in enumerate(cells):
            cls = ' class="bad"' if bad_column is not None and i == bad_column and c != "yes" else ""
            tds.append(f"<td{cls}>{html.escape(str(c))}</td>")
        body.append("<tr>" + "".join(tds) + "</tr>")
    cls = ' class="sortable"' if sortable else ""
    return f"<table{cls}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def figure_tags(plots: list[tuple[str, bytes]]) -> list[str]:
    """One inline <figure> (base64 PNG and its caption) per (caption, png)."""
    tags = []
    for caption, png in plots:
        data = base64.b64encode(png).decode("ascii")
        tags.append(f"<figure><img alt='{html.escape(caption)}' src='data:image/png;base64,{data}'>"
                    f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    return tags


def render_report_html(rows: list[BenchRow], summaries: list[SuiteSummary], *, command: str,
                       environments: list[dict], stopped: str | None = None, remaining: int = 0) -> str:
    gpu = bool(rows) and all(r.timings_are_gpu for r in rows)
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>SparseDitto benchmark</title>",
             f"<style>{STYLE}</style></head><body>", "<h1>SparseDitto benchmark</h1>"]
    if not gpu:
        parts.append("<p class='warn'>Not GPU timings: these cases ran on the CPU (Triton interpreter). Times are "
                     "wall-clock CPU times and say nothing about GPU speed; only correctness (fast_0) means "
                     "anything here.</p>")
    parts.append(f"<p>Command: <code>{html.escape(command)}</code></p><ul>")
    for env in environments:
        parts.append(f"<li>run {html.escape(str(env.get('run_id', '?')))} ({html.escape(str(env.get('started', '?')))})"
                     f": {html.escape(environment_line(env))}</li>")
    parts.append("</ul>")
    if stopped:
        parts.append(f"<p class='incomplete'>Incomplete: {html.escape(stopped)}; {remaining} case(s) left "
                     "(run the same command with <code>--resume</code>).</p>")
    parts.append("<h2>Per suite</h2>")
    parts.append(_table(SUITE_HEADERS, [suite_cells(s) for s in summaries], sortable=False))
    parts.append("<p>Worst case per suite:</p><ul class='defs'>"
                 + "".join(f"<li>{html.escape(w)}</li>" for w in worst_lines(summaries)) + "</ul>")
    parts.append("<p>How to read these numbers:</p><ul class='defs'>" + "".join(f"<li>{html.escape(d)}</li>" for d in DEFINITIONS) + "</ul>")
    parts.append("<h2>Plots</h2>")
    try:
        plots = all_plots(rows, summaries)
        if not plots:
            parts.append("<p>No correct case with timings yet: nothing to plot.</p>")
    except ImportError as exc:  # e.g. a GPU machine without matplotlib: the rows are what matters
        plots = []
        parts.append(f"<p class='incomplete'>No plots: {html.escape(str(exc))}. Rewrite this page where "
                     "matplotlib is installed (<code>pip install 'sparseditto[report]'</code>): "
                     "<code>sparseditto bench --report-only --out DIR</code>.</p>")
    parts.extend(figure_tags(plots))
    parts.append(f"<h2>Cases ({len(rows)})</h2><p>Click a column header to sort.</p>")
    parts.append(_table(ROW_HEADERS, [row_cells(r) for r in rows], bad_column=len(ROW_HEADERS) - 1))
    sweep = sweep_cells(rows)
    if sweep:
        parts.append("<h2>Template sweep</h2><p>Every applicable template, verified and timed beside dense "
                     "cuBLAS in the same worker call.</p>")
        parts.append(_table(SWEEP_HEADERS, sweep))
    parts.append(f"<script>{SORT_JS}</script></body></html>")
    return "".join(parts)
