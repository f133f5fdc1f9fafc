"""How long `analyze` takes on weight-sized matrices (CPU; run anywhere).

The analyzer runs once per graph run and once per unique layer in batch jobs, so it must stay
around a second even for an LLM-sized weight. Run:

    .venv/bin/python benchmarks/analyze_speed.py [--repeat 3] [--quick]

Prints one row per matrix: shape, nnz, the first (cold) call and the best of ``--repeat`` calls,
and the class found. Generation time is not counted.
"""
from __future__ import annotations

import argparse
import time

from sparseditto import generate as gen
from sparseditto.analysis import analyze
from sparseditto.pattern_features import DENSE_TILE_LIMIT

CASES = [
    ("llama-mlp 50% unstructured", lambda: gen.unstructured(4096, 11008, 0.5, seed=0)),
    ("llama-mlp 2:4 (rows)", lambda: gen.nm_sparse(4096, 11008, 2, 4, seed=0)),
    ("llama-mlp 32x32 blocks 30%", lambda: gen.block_sparse(4096, 11008, (32, 32), 0.3, 1.0, seed=0)),
    ("DLMC 33288x512 50%", lambda: gen.unstructured(33288, 512, 0.5, seed=0)),
    ("DLMC 33288x512 90%", lambda: gen.unstructured(33288, 512, 0.9, seed=0)),
    ("4096^2 row-pruned 50%", lambda: gen.row_pruned(4096, 4096, 0.5, 0.5, seed=0)),
    ("R-MAT scale 16", lambda: gen.rmat(16, seed=0)),
    ("R-MAT scale 20 (sparse tiles)", lambda: gen.rmat(20, seed=0)),
]
QUICK = {"DLMC 33288x512 90%", "R-MAT scale 16", "4096^2 row-pruned 50%"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="only the small cases")
    args = parser.parse_args()
    print(f"{'matrix':32s} {'shape':>14s} {'nnz':>11s} {'tiles':>6s} {'cold s':>7s} {'best s':>7s}  pattern")
    for label, build in CASES:
        if args.quick and label not in QUICK:
            continue
        A = build()
        t0 = time.perf_counter()
        report = analyze(A)
        cold = time.perf_counter() - t0
        best = cold
        for _ in range(max(0, args.repeat - 1)):
            t0 = time.perf_counter()
            analyze(A)
            best = min(best, time.perf_counter() - t0)
        tiles = "dense" if -(-A.shape[0] // 8) * -(-A.shape[1] // 8) <= DENSE_TILE_LIMIT else "sorted"
        shape = f"{A.shape[0]}x{A.shape[1]}"
        print(f"{label:32s} {shape:>14s} {A.nnz:>11,d} {tiles:>6s} {cold:7.3f} {best:7.3f}  "
              f"{report.pattern} ({report.confidence:.2f})", flush=True)
        del A


if __name__ == "__main__":
    main()
