"""``summary.md``: the per-suite answer and every case, as markdown a person can paste into docs."""
from __future__ import annotations

from .rows import BenchRow, SuiteSummary
from .tables import (DEFINITIONS, ROW_HEADERS, SUITE_HEADERS, SWEEP_HEADERS, environment_line, row_cells, suite_cells,
                     sweep_cells, worst_lines)


def _table(headers, rows) -> list[str]:
    esc = lambda s: str(s).replace("|", "\\|").replace("\n", " ")
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(esc(c) for c in cells) + " |" for cells in rows]
    return lines


def render_summary_md(rows: list[BenchRow], summaries: list[SuiteSummary], *, command: str,
                      environments: list[dict], stopped: str | None = None, remaining: int = 0) -> str:
    gpu = bool(rows) and all(r.timings_are_gpu for r in rows)
    lines = ["# SparseDitto benchmark", ""]
    if not gpu:
        lines += ["> **Not GPU timings.** These cases ran on the CPU (Triton interpreter): the times are wall-clock "
                  "CPU times and say nothing about GPU speed. Only correctness (fast_0) means anything here.", ""]
    lines += [f"Command: `{command}`", ""]
    for env in environments:
        lines.append(f"- run {env.get('run_id', '?')} ({env.get('started', '?')}): {environment_line(env)}")
    lines.append("")
    if stopped:
        lines += [f"**Incomplete:** {stopped}; {remaining} case(s) left (run the same command with `--resume`).", ""]
    lines += ["## Per suite", ""]
    lines += _table(SUITE_HEADERS, [suite_cells(s) for s in summaries])
    lines += ["", "Worst case per suite:", ""] + [f"- {w}" for w in worst_lines(summaries)]
    lines += ["", "fast_p columns are against the best of dense + vendor sparse; the fast_1 / fast_1.5 vs vendor "
              "sparse column counts only cases where a vendor sparse path ran.", "", "How to read these numbers:", ""]
    lines += [f"- {d}" for d in DEFINITIONS]
    lines += ["", "## Cases", ""]
    lines += _table(ROW_HEADERS, [row_cells(r) for r in rows])
    sweep = sweep_cells(rows)
    if sweep:
        lines += ["", "## Template sweep (every applicable template, timed beside dense)", ""]
        lines += _table(SWEEP_HEADERS, sweep)
    return "\n".join(lines) + "\n"
