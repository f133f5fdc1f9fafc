"""What the CLI prints for people: rich tables and short reports, never cut short.

Every table is a `rich.table.Table`, printed by `print_table`: on a terminal long cells fold onto
the next line instead of ending in an ellipsis; in a pipe or a file (where rich assumes 80
columns) the console is made as wide as the table, so a name is never cut off and `grep` finds
it. The columns of `runs_table` are the facts `Result.summary()` prints for a run, read back from
the memory, so `sparseditto memory list` and the summary of that run agree.
"""
from __future__ import annotations

import sys
from typing import Any, Iterable

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table


class _Console(Console):
    """A rich Console whose closed pipe is a BrokenPipeError (rich's own choice is SystemExit(1)), so
    the app ends every command the same way on `| head` (see sparseditto.cli.app)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


def stdout_console() -> Console:
    return _Console(highlight=False, soft_wrap=False)


def print_table(table: Table, console: Console | None = None) -> None:
    """Print ``table`` with no cell truncated (see the module docstring)."""
    for column in table.columns:
        column.overflow = "fold"
    console = console or stdout_console()
    if not console.is_terminal:
        width = Measurement.get(console, console.options.update_width(100_000), table).maximum
        console = _Console(file=console.file, width=max(width, 40), highlight=False, soft_wrap=False)
    console.print(table)


# ---- targets -----------------------------------------------------------------------------------

def targets_table(targets: Iterable[Any], left_out: dict[str, list[str]] | None = None) -> Table:
    """The GPU table the planner costs kernels on: names, the aliases `--target` accepts, peaks, and
    (``left_out``: target name -> templates) the templates never planned for it (their architecture)."""
    table = Table(title="Known GPU targets (`--target NAME`, or an alias)", title_justify="left")
    cols = ["name", "aliases", "arch", "SMs", "HBM GB/s", "L2 MB", "fp16 TC TFLOP/s", "fp16 2:4 TFLOP/s"]
    wrapped = ("aliases", "templates left out")
    for col in cols + (["templates left out"] if left_out is not None else []):
        table.add_column(col, no_wrap=col not in wrapped, justify="right" if col[0].isdigit() or col in (
            "SMs", "HBM GB/s", "L2 MB") or "TFLOP" in col else "left")
    for t in targets:
        row = [t.name, ", ".join(t.aliases) or "-", t.arch, str(t.sm_count), f"{t.mem_bandwidth_gbs:.0f}",
               f"{t.l2_mb:.0f}", f"{t.tensor_tflops['float16']:.0f}", f"{t.sparse_tensor_tflops['float16']:.0f}"]
        if left_out is not None:
            row.append(", ".join(left_out.get(t.name) or []) or "-")
        table.add_row(*row)
    return table


# ---- memory ------------------------------------------------------------------------------------

def speedup_cell(measured: float | None, estimate: float | None) -> str:
    """'2.40x' measured on a GPU, '~2.40x est.' from the roofline model, '-' when neither."""
    if measured is not None:
        return f"{measured:.2f}x"
    if estimate is not None:
        return f"~{estimate:.2f}x est."
    return "-"


def runs_table(runs: list[dict], path: Any) -> Table:
    """`sparseditto memory list`: one row per run, the columns of the run's summary."""
    table = Table(title=f"Runs in {path} (newest first)", title_justify="left",
                  caption="x dense: measured on the GPU; '~ est.': the roofline model's estimate (no GPU timings)",
                  caption_justify="left")
    for col in ("id", "created (UTC)", "matrix", "shape", "nnz", "sparsity", "pattern", "N", "dtype",
                "planned for", "ran on", "policy", "status", "best", "x dense", "candidates", "s"):
        table.add_column(col, no_wrap=col not in ("matrix", "best"),
                         justify="right" if col in ("nnz", "sparsity", "x dense", "candidates", "s") else "left")
    for r in runs:
        m, k = r.get("shape_m"), r.get("shape_k")
        shape = f"{m}x{k}" if m is not None and k is not None else "?"
        sparsity = (f"{1 - r['nnz'] / (m * k):.1%}" if r.get("nnz") is not None and m and k else "")
        policy = r["policy"] + (f":{r['llm_model']}" if r.get("llm_model") else "")
        gpu = r.get("gpu") or ""
        # interpreter runs key the memory by "interpret:<target>": no GPU measured them
        ran_on = "CPU (interpreter)" if r.get("backend") == "interpret" or gpu.startswith("interpret:") else gpu or "-"
        table.add_row(
            r["id"][:8], (r.get("created") or "")[:16].replace("T", " "), r.get("matrix_name") or "", shape,
            "" if r.get("nnz") is None else str(r["nnz"]), sparsity, r.get("pattern") or "", r.get("n_bucket") or "",
            r.get("dtype") or "", r.get("target") or "-", ran_on, policy, r["status"], r.get("best_template") or "-",
            speedup_cell(r.get("best_speedup_vs_dense"), r.get("best_speedup_estimate")),
            str(r.get("n_candidates", "")),
            "" if r.get("wall_seconds") is None else f"{r['wall_seconds']:.1f}")
    return table


# ---- the pattern report ------------------------------------------------------------------------

def report_lines(report) -> list[tuple[str, str]]:
    """(label, text) rows of a `PatternReport` for people (`sparseditto analyze`)."""
    m, k = report.shape
    rows = [("matrix", f"{report.name}: {m} x {k}, {report.nnz} nonzeros ({report.sparsity:.2%} sparse), "
                       f"{report.dtype}"),
            ("pattern", f"{report.pattern} (confidence {report.confidence:.2f})"),
            ("why", report.explain())]
    for label, stats, empty in (("rows", report.row_stats, report.empty_rows),
                                ("columns", report.col_stats, report.empty_cols)):
        rows.append((label, f"nonzeros per line: mean {stats.mean:.1f}, min {stats.min}, max {stats.max}, "
                            f"cv {stats.cv:.2f} (load imbalance); {empty} empty"))
    ratio, axis, conformance = report.best_nm()
    rows.append(("N:M", f"best {ratio} along {axis}s: {conformance:.1%} of groups conform "
                        f"(sparse tensor cores need 100%)"))
    if report.best_block_shape is not None:
        b = report.block_stat(report.best_block_shape)
        rows.append(("blocks", f"{b.shape[0]}x{b.shape[1]}: {b.nonzero_blocks} of {b.total_blocks} blocks hold a "
                               f"nonzero ({b.block_density:.1%}), {b.occupancy:.0%} full"))
    else:
        rows.append(("blocks", "no block structure (nonzero blocks are no fuller than random placement)"))
    rows.append(("band", f"bandwidth {report.bandwidth} (max |i - j|), {report.diag_fraction:.1%} of nonzeros "
                         "next to the diagonal"))
    if report.explicit_zeros_dropped:
        rows.append(("stored 0s", f"{report.explicit_zeros_dropped} stored zero value(s) dropped: they count as "
                                  "zeros, not nonzeros"))
    rows.append(("signature", f"{report.signature} (the memory's key for this pattern); analyzed in "
                              f"{report.analysis_seconds:.2f} s"))
    return rows


def print_report(report, console: Console | None = None) -> None:
    """The report as aligned label/text rows: folded to the terminal's width, one line each in a pipe."""
    console = console or stdout_console()
    rows = report_lines(report)
    if not console.is_terminal:
        console.file.write("".join(f"{label:<10} {text}\n" for label, text in rows))
        return
    table = Table(show_header=False, box=None, pad_edge=False, padding=(0, 1, 0, 0))
    table.add_column("label", style="bold", no_wrap=True, min_width=10)
    table.add_column("text", overflow="fold")
    for label, text in rows:
        table.add_row(label, text)
    console.print(table)


def err_console() -> Console:
    return Console(file=sys.stderr, highlight=False)
