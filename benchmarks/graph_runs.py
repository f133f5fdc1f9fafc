"""Run the whole agent graph (expert policy) on real and synthetic matrices, twice each.

    python benchmarks/graph_runs.py --out graph_runs.json            # on the GPU machine
The first run of each matrix starts from an empty key in memory; the second run of the same matrix
must find it (exact hit) and finish faster with fewer candidates. Per case it records the chosen
strategy, its speedup over dense cuBLAS and over the best vendor baseline measured in the same run,
and the wall time of both runs.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sparseditto import generate
from sparseditto.api import run_graph
from sparseditto.io import load_matrix

DLMC_DEFAULT = [
    "transformer/magnitude_pruning/0.5/body_decoder_layer_0_ffn_conv1_fully_connected.smtx.gz",
    "transformer/magnitude_pruning/0.7/body_encoder_layer_0_self_attention_multihead_attention_q_fully_connected.smtx.gz",
    "transformer/magnitude_pruning/0.8/body_encoder_layer_0_ffn_conv2_fully_connected.smtx.gz",
    "transformer/magnitude_pruning/0.9/body_decoder_layer_0_ffn_conv1_fully_connected.smtx.gz",
    "transformer/magnitude_pruning/0.95/body_encoder_layer_0_ffn_conv1_fully_connected.smtx.gz",
    "transformer/magnitude_pruning/0.98/body_encoder_layer_0_ffn_conv2_fully_connected.smtx.gz",
    "transformer/random_pruning/0.7/body_encoder_layer_0_ffn_conv1_fully_connected.smtx.gz",
    "transformer/random_pruning/0.9/body_decoder_layer_0_encdec_attention_multihead_attention_k_fully_connected.smtx.gz",
    "rn50/magnitude_pruning/0.8/bottleneck_2_block_group2_2_1.smtx.gz",
    "rn50/magnitude_pruning/0.9/bottleneck_3_block_group4_2_1.smtx.gz",
    "rn50/magnitude_pruning/0.95/bottleneck_projection_block_group_projection_block_group2.smtx.gz",
    "rn50/magnitude_pruning/0.98/bottleneck_1_block_group1_1_1.smtx.gz",
]


def cases(args) -> list[tuple[str, object, int]]:
    root = Path(args.data) / "dlmc"
    out = []
    for rel in DLMC_DEFAULT[: args.dlmc]:
        path = root / rel
        if not path.exists():
            raise SystemExit(f"DLMC file not found: {path} (set --data or SPARSEDITTO_DATA)")
        out.append((str(path.relative_to(root)), path, args.dlmc_n))
    s = args.size
    synthetic = {
        "unstructured_90": lambda: generate.unstructured(s, s, 0.9, seed=1),
        "unstructured_99": lambda: generate.unstructured(s, s, 0.99, seed=1),
        "block32_90": lambda: generate.block_sparse(s, s, block=(32, 32), block_density=0.1, seed=2),
        "nm_2of4": lambda: generate.nm_sparse(s, s, n=2, m_group=4, seed=3),
        "row_pruned_50": lambda: generate.row_pruned(s, s, prune_fraction=0.5, density=1.0, seed=4),
    }
    for name in args.synthetic:
        out.append((name, synthetic[name], args.n))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=os.environ.get("SPARSEDITTO_DATA", "../shared/data"))
    p.add_argument("--dlmc", type=int, default=10, help="how many DLMC files")
    p.add_argument("--dlmc-n", type=int, default=256)
    p.add_argument("--synthetic", nargs="*", default=["unstructured_90", "unstructured_99", "block32_90", "nm_2of4", "row_pruned_50"])
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--size", type=int, default=4096)
    p.add_argument("--target", default="auto")
    p.add_argument("--backend", default="auto")
    p.add_argument("--budget", type=int, default=None)
    p.add_argument("--memory", default=os.environ.get("SPARSEDITTO_MEMORY", "graph_runs_memory.sqlite"))
    p.add_argument("--ncu", default="best", choices=["all", "best", "off"], help="Nsight Compute per candidate")
    p.add_argument("--out", default="graph_runs.json")
    args = p.parse_args(argv)
    console = Console()
    rows = []
    for name, source, n in cases(args):
        matrix = source() if callable(source) else load_matrix(source, seed=0)
        row = {"case": name, "n": n, "shape": list(matrix.shape), "nnz": matrix.nnz}
        for attempt in ("first", "second"):
            t0 = time.perf_counter()
            try:
                res = run_graph(matrix, target=args.target, n=n, backend=args.backend, budget=args.budget,
                                memory=args.memory, thread_id=f"{name}-{n}-{attempt}-{time.time_ns()}",
                                ncu=args.ncu)
            except Exception as exc:  # one failing case is a row, not the end of the run
                row[attempt] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
                continue
            wall = time.perf_counter() - t0
            vendor = {k: v for k, v in res.speedups.items() if k not in ("dense", "cublas_dense") and v}
            row[attempt] = {
                "wall_s": wall, "pattern": res.report.get("pattern"), "best": res.best.template,
                "params": res.best.params, "selection": res.best.selection, "reason": res.best.reason,
                "speedup_vs_dense": res.best.speedup_vs_dense, "speedups": res.speedups,
                "speedup_vs_best_vendor": min(vendor.values()) if vendor else None,
                "candidates": len(res.candidates), "memory_hits": len(res.memory_hits),
                "timings_are_gpu": res.timings_are_gpu, "stop_reason": res.stop_reason,
                "summary": res.summary(),
            }
        rows.append(row)
        Path(args.out).write_text(json.dumps(rows, indent=2, default=str))
        console.print(f"{name}: {json.dumps({k: row.get(k, {}).get('best') for k in ('first', 'second')})}")
    table = Table(title="run_graph (expert policy), two runs per matrix")
    for col in ("case", "N", "pattern", "chosen", "x dense", "x best vendor", "wall 1st (s)", "wall 2nd (s)", "cands 1st/2nd", "hit 2nd"):
        table.add_column(col)
    for r in rows:
        a, b = r.get("first", {}), r.get("second", {})
        f = lambda x, d=2: "-" if x is None else f"{x:.{d}f}"
        table.add_row(r["case"][-48:], str(r["n"]), str(a.get("pattern", a.get("error", "-"))[:40]), str(a.get("best")),
                      f(a.get("speedup_vs_dense")), f(a.get("speedup_vs_best_vendor")), f(a.get("wall_s"), 1),
                      f(b.get("wall_s"), 1), f"{a.get('candidates')}/{b.get('candidates')}", str(b.get("memory_hits")))
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
