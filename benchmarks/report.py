"""Turn a benchmarks/templates.py JSON-lines file into markdown tables and plots.

    python benchmarks/report.py bench_templates.jsonl --md docs/benchmarks_table.md --plots docs/img

Plots are what a person would rather look at than read: speedup over dense cuBLAS against
sparsity (one line per N, unstructured cases), and each best kernel's achieved fraction of the
memory roofline.
"""
from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path


def load_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def best_per_case(rows: list[dict]) -> list[dict]:
    """For each (case, N): the fastest verified candidate, with the case's baselines attached."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["case"], r["n"])].append(r)
    out = []
    for (case, n), rs in groups.items():
        base = next((r["baselines"] for r in rs if r.get("baselines")), {}) or {}
        errors = next((r.get("baseline_errors") for r in rs if r.get("baselines")), {}) or {}
        ok = [r for r in rs if r.get("median_ms")]
        best = min(ok, key=kernel_ms) if ok else None
        vendor = {k: v for k, v in base.items() if v and k != "cublas_dense"}
        bname, bms = min(vendor.items(), key=lambda kv: kv[1]) if vendor else (None, None)
        out.append(dict(case=case, n=n, best=best, tried=len(rs), failed=[r for r in rs if r["status"] != "verified"],
                        baselines=base, baseline_errors=errors, best_baseline=bname, best_baseline_ms=bms,
                        sparsity=rs[0].get("sparsity"), pattern=rs[0].get("pattern")))
    return out


def kernel_ms(row: dict) -> float:
    """The kernel's own time: cold L2, launch inside a CUDA graph (eager when no graph timing)."""
    return row.get("graph_ms") or row["median_ms"]


def dense_ms(row: dict) -> float:
    return row.get("dense_graph_ms") or row["dense_ms"]


def speedup(row: dict) -> float:
    """Graph-launched dense cuBLAS over graph-launched candidate: like for like, cold L2."""
    return dense_ms(row) / kernel_ms(row)


def fmt(x, digits=4):
    return "-" if x is None else f"{x:.{digits}f}"


def markdown(cases: list[dict]) -> str:
    lines = ["| case | N | pattern | best template | us (graph) | us (eager) | dense us (graph) | x dense | x dense (eager) | best vendor sparse (us) | x vendor | % roofline |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cases:
        b = c["best"]
        if b is None:
            lines.append(f"| {c['case']} | {c['n']} | {c['pattern']} | none verified ({c['tried']} tried) | - | - | - | - | - | - | - | - |")
            continue
        # vendor libraries are timed eagerly: compare with the candidate's eager time
        xv = c["best_baseline_ms"] / b["median_ms"] if c["best_baseline_ms"] else None
        us = lambda ms: None if ms is None else ms * 1e3
        lines.append(
            f"| {c['case']} | {c['n']} | {c['pattern']} | {b['template']} | {fmt(us(b.get('graph_ms')), 1)} | "
            f"{fmt(us(b['median_ms']), 1)} | {fmt(us(dense_ms(b)), 1)} | {fmt(speedup(b), 2)} | {fmt(b['speedup_vs_dense'], 2)} | "
            f"{c['best_baseline'] or '-'} {fmt(us(c['best_baseline_ms']), 1)} | {fmt(xv, 2)} | {fmt(b.get('pct_roofline'), 0)} |")
    return "\n".join(lines) + "\n"


def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def dlmc_summary(cases: list[dict]) -> str:
    """Geomean speedup of the best template over torch's cuSPARSE CSR on the DLMC files."""
    ratios, dense = [], []
    for c in cases:
        if "/" not in c["case"] or c["best"] is None:
            continue
        csr = c["baselines"].get("cusparse_csr_torch")
        if csr:
            ratios.append(csr / c["best"]["median_ms"])  # eager vs eager
        dense.append(speedup(c["best"]))
    if not ratios:
        return "No DLMC rows.\n"
    return (f"DLMC files: {len(ratios)}; best template vs torch cuSPARSE CSR: geomean {geomean(ratios):.2f}x "
            f"(min {min(ratios):.2f}x, max {max(ratios):.2f}x); vs dense cuBLAS: geomean {geomean(dense):.2f}x.\n")


def plots(cases: list[dict], outdir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    series: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for c in cases:
        if c["case"].startswith("unstructured_") and c["best"]:
            series[c["n"]].append((c["sparsity"] * 100, speedup(c["best"])))
    if series:
        fig, ax = plt.subplots(figsize=(6, 4))
        for n, pts in sorted(series.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"N={n}")
        ax.axhline(1.0, color="gray", linestyle="--", linewidth=1)
        ax.set_xlabel("sparsity (%)"), ax.set_ylabel("speedup over dense cuBLAS"), ax.set_yscale("log")
        ax.set_title("Unstructured 4096x4096 fp16: best SparseDitto template")
        ax.legend()
        fig.tight_layout()
        path = outdir / "speedup_vs_sparsity.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    small = [c for c in cases if c["best"] and c["n"] <= 16 and c["best"].get("pct_roofline")]
    if small:
        fig, ax = plt.subplots(figsize=(7, 4))
        labels = [f"{c['case']} N={c['n']}" for c in small]
        ax.barh(labels, [c["best"]["pct_roofline"] for c in small])
        ax.axvline(100, color="gray", linestyle="--", linewidth=1)
        ax.set_xlabel("% of memory roofline (format bytes / measured time vs 4.3 TB/s)")
        ax.tick_params(axis="y", labelsize=6)
        fig.tight_layout()
        path = outdir / "roofline_small_n.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("jsonl", nargs="+", type=Path)
    p.add_argument("--md", type=Path, help="write the markdown tables here")
    p.add_argument("--plots", type=Path, help="directory for PNG plots")
    args = p.parse_args(argv)
    rows = [r for path in args.jsonl for r in load_rows(path)]
    cases = best_per_case(rows)
    text = markdown([c for c in cases if "/" not in c["case"]]) + "\n" + dlmc_summary(cases)
    if args.md:
        args.md.write_text(text)
    print(text)
    if args.plots:
        for path in plots(cases, args.plots):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
