"""Benchmark every applicable kernel template against dense cuBLAS and the vendor sparse baselines.

Run on a GPU (the numbers in docs/benchmarks.md come from an H200):
    python benchmarks/templates.py --out bench.jsonl                  # the issue's full suite
    python benchmarks/templates.py --suite synthetic --n 16 --cases unstructured_90 nm_2of4
    python benchmarks/templates.py --suite dlmc --dlmc-limit 12
Each (matrix, N) runs: analyze -> for each applicable template, a small parameter grid ->
verify in the sandbox -> cold-L2 bench in the same worker as dense cuBLAS (and, once per
(matrix, N), every vendor baseline). Rows are appended to a JSON-lines file as they finish, so a
run cut short still leaves its data; `benchmarks/report.py` turns the file into tables and plots.
Timings are medians with a cold L2 (DESIGN.md, "Timing small kernels"); format conversion is
reported separately and never counted in the kernel time.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from sparseditto import generate
from sparseditto.analysis import analyze
from sparseditto.harness import bench, run_and_verify
from sparseditto.io import load_matrix
from sparseditto.kernel_templates.registry import list_templates
from sparseditto.targets import resolve_target

SIZE = 4096


def synthetic_cases(size: int = SIZE) -> dict:
    """The kernel issue's cases, M = K = size, as name -> zero-argument builder."""
    cases = {}
    for s in (50, 70, 90, 95, 99):
        cases[f"unstructured_{s}"] = lambda s=s: generate.unstructured(size, size, s / 100, seed=1)
    for b in (16, 32, 64):
        for s in (50, 75, 90):
            cases[f"block{b}_{s}"] = lambda b=b, s=s: generate.block_sparse(
                size, size, block=(b, b), block_density=1 - s / 100, occupancy=1.0, seed=2)
    cases["nm_2of4"] = lambda: generate.nm_sparse(size, size, n=2, m_group=4, seed=3)
    cases["row_pruned_50"] = lambda: generate.row_pruned(size, size, prune_fraction=0.5, density=1.0, seed=4)
    return cases


# A device-time-bounded subset of the suite (M = K = 4096): every goal's case plus the
# N sweep on the cases where the answer changes with N. `--preset full` runs everything.
CORE_PRESET = {
    "unstructured_50": (16,), "unstructured_70": (16,), "unstructured_90": (1, 16, 128, 2048),
    "unstructured_95": (16,), "unstructured_99": (1, 16, 128, 2048),
    "block16_90": (16, 2048), "block32_50": (16,), "block32_75": (16,), "block32_90": (1, 16, 128, 2048),
    "block64_90": (16, 2048), "nm_2of4": (1, 16, 128, 2048), "row_pruned_50": (16, 2048),
}


def dlmc_cases(root: Path, limit: int | None) -> dict:
    files = sorted(root.glob("**/*.smtx*"))
    if limit:
        step = max(1, len(files) // limit)
        files = files[::step][:limit]
    return {str(f.relative_to(root)).replace(".smtx.gz", "").replace(".smtx", ""):
            (lambda f=f: load_matrix(f, seed=0)) for f in files}


def timing_ms(t):
    return None if t is None else t.median_ms


def bench_case(name, matrix, n, args, target, console, progress_task=None, progress=None) -> list[dict]:
    """All templates on one (matrix, N): returns one row per candidate tried."""
    report = analyze(matrix)
    rows = []
    baselines_done = False
    for template in list_templates():
        if template.backend == "builtin" or (args.templates and template.name not in args.templates):
            continue
        ok, why = template.applicable(report)
        if not ok:
            continue
        grid = template.param_grid(report, n, target, limit=args.grid)
        for params in grid:
            cand = template.instantiate(params)
            est = template.cost(report, n, args.dtype, target, params)
            row = dict(case=name, n=n, dtype=args.dtype, pattern=report.pattern, sparsity=report.sparsity,
                       shape=list(report.shape), nnz=report.nnz, template=template.name, params=cand.params,
                       roofline_ms=est.seconds * 1e3, est_bytes=est.bytes)
            t0 = time.perf_counter()
            ver = run_and_verify(cand, matrix, n_values=(7, n) if n > 1 else (1, 7), dtype=args.dtype,
                                 backend=args.backend, timeout=args.timeout)
            row.update(status=ver.status, message=ver.message[:300], verify_s=time.perf_counter() - t0)
            if ver.ok:
                try:
                    res = bench(cand, matrix, n, dtype=args.dtype, backend=args.backend,
                                repeats=args.repeats, baselines=not baselines_done)
                except Exception as exc:  # a bench failure is a row, not the end of the suite
                    row.update(status="bench_error", message=str(exc)[:300])
                else:
                    if not baselines_done:
                        row["baselines"] = {b.name: (timing_ms(b.timing) if b.ok else None) for b in res.baselines}
                        row["baseline_errors"] = {b.name: b.error for b in res.baselines if not b.ok}
                        baselines_done = True
                    row.update(
                        median_ms=res.candidate.median_ms, graph_ms=timing_ms(res.candidate_graph),
                        dense_ms=res.dense.median_ms, dense_graph_ms=timing_ms(res.dense_graph),
                        conversion_ms=res.conversion_ms, speedup_vs_dense=res.speedup_vs_dense,
                        reverified=res.reverified, gpu=res.gpu_name, timings_are_gpu=res.timings_are_gpu)
                    kernel_ms = row["graph_ms"] or row["median_ms"]
                    row["pct_roofline"] = 100.0 * row["roofline_ms"] / kernel_ms if kernel_ms else None
            rows.append(row)
            with open(args.out, "a") as fh:
                fh.write(json.dumps(row, default=str) + "\n")
            if progress is not None:
                progress.update(progress_task, description=f"{name} N={n} {template.name} {row['status']}")
    return rows


def kernel_ms(row: dict) -> float | None:
    """The kernel's own time: cold L2, launch inside a CUDA graph (eager when no graph timing)."""
    return row.get("graph_ms") or row.get("median_ms")


def summarize(rows: list[dict], console: Console) -> None:
    """One line per (case, N): best verified template vs dense and the best vendor baseline.

    Headline speedups compare graph-launched kernel times (candidate graph vs cuBLAS graph), the
    kernels' true cold-L2 times; the eager column shows what a user without CUDA graphs pays.
    """
    table = Table(title="best template per case (us, cold L2)")
    for col in ("case", "N", "best", "graph", "eager", "dense graph", "x dense", "x dense eager", "best vendor", "x vendor", "% roof"):
        table.add_column(col)
    by_case: dict[tuple, list[dict]] = {}
    for r in rows:
        by_case.setdefault((r["case"], r["n"]), []).append(r)
    us = lambda ms: "-" if ms is None else f"{ms * 1e3:.1f}"
    for (case, n), rs in by_case.items():
        ok = [r for r in rs if r.get("median_ms")]
        base = next((r.get("baselines") for r in rs if r.get("baselines")), {}) or {}
        vendor = {k: v for k, v in base.items() if v and k != "cublas_dense"}
        if not ok:
            table.add_row(case[-40:], str(n), "none verified", *["-"] * 8)
            continue
        best = min(ok, key=kernel_ms)
        dense = best.get("dense_graph_ms") or best["dense_ms"]
        bname, bms = (min(vendor.items(), key=lambda kv: kv[1]) if vendor else ("-", None))
        table.add_row(case[-40:], str(n), best["template"], us(best.get("graph_ms")), us(best["median_ms"]), us(dense),
                      f"{dense / kernel_ms(best):.2f}", f"{best['speedup_vs_dense']:.2f}",
                      f"{bname} {us(bms)}" if bms else bname, f"{bms / kernel_ms(best):.2f}" if bms else "-",
                      f"{best['pct_roofline']:.0f}" if best.get("pct_roofline") else "-")
    console.print(table)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", choices=["all", "synthetic", "dlmc"], default="all")
    p.add_argument("--cases", nargs="*", help="only these synthetic case names")
    p.add_argument("--templates", nargs="*", help="only these templates")
    p.add_argument("--n", type=int, nargs="*", default=[1, 16, 128, 2048])
    p.add_argument("--preset", choices=["full", "core"], default="full",
                   help="core: the CORE_PRESET (case, N) pairs instead of every case at every --n")
    p.add_argument("--dlmc-n", type=int, default=256)
    p.add_argument("--dlmc-dir", default=os.environ.get("SPARSEDITTO_DATA", "../shared/data") + "/dlmc")
    p.add_argument("--dlmc-limit", type=int, default=None, help="evenly spaced subset of the DLMC files")
    p.add_argument("--size", type=int, default=SIZE)
    p.add_argument("--dtype", default="float16")
    p.add_argument("--backend", default="auto")
    p.add_argument("--grid", type=int, default=3, help="parameter sets per template")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--timeout", type=float, default=180.0)
    p.add_argument("--target", default="auto", help="target for cost models (auto: the local GPU)")
    p.add_argument("--out", default="bench_templates.jsonl")
    args = p.parse_args(argv)
    console = Console()
    target, note = resolve_target(args.target, fallback="H200")
    if note:
        console.print(f"[yellow]{note}")
    jobs = []
    if args.suite in ("all", "synthetic"):
        cases = synthetic_cases(args.size)
        for name, build in cases.items():
            if args.cases and name not in args.cases:
                continue
            ns = CORE_PRESET.get(name, ()) if args.preset == "core" else args.n
            jobs.extend((name, build, n) for n in ns)
    if args.suite in ("all", "dlmc"):
        jobs.extend((name, build, args.dlmc_n) for name, build in dlmc_cases(Path(args.dlmc_dir), args.dlmc_limit).items())
    rows: list[dict] = []
    cache: dict[str, object] = {}
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("benchmark", total=len(jobs))
        for name, build, n in jobs:
            if name not in cache:
                cache.clear()
                cache[name] = build()
            rows.extend(bench_case(name, cache[name], n, args, target, console, task, progress))
            progress.advance(task)
    summarize(rows, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
