"""Classifier accuracy over a large labelled sweep of generated matrices (CPU; run anywhere).

    .venv/bin/python benchmarks/analyzer_accuracy.py [--per-class 100] [--seeds 0 1] [--edge]

Prints the confusion matrix (rows = true class, columns = predicted), per-class accuracy and mean
confidence, how often the class parameters (block shape, N:M ratio and axis) match the
generator's, and every misclassified case. ``--edge`` adds a sweep *outside* the ranges the
issue asks for (sparser, noisier, less skewed), to show where the rules stop working.
"""
from __future__ import annotations

import argparse
import time
from collections import Counter, defaultdict

import numpy as np

from sparseditto import generate as gen
from sparseditto.analysis import analyze
from sparseditto.pattern_classes import PATTERNS


def edge_suite(per_class: int, seed: int) -> list[tuple[str, str, dict]]:
    """Harder cases beyond the issue's ranges: where should the rules be expected to break?"""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(per_class):
        s = int(rng.integers(2**31))
        n = int(rng.choice((256, 512, 1024)))
        out += [
            ("unstructured", "unstructured", dict(m=n, k=n, sparsity=float(rng.uniform(0.99, 0.998)), seed=s)),
            ("unstructured", "unstructured", dict(m=n, k=n, sparsity=float(rng.uniform(0.2, 0.5)), seed=s)),
            ("nm", "nm", dict(m=n, k=n, n=2, m_group=4, violations=float(rng.uniform(0.02, 0.05)), seed=s)),
            ("block", "block", dict(m=n, k=n, block=(16, 16), block_density=float(rng.uniform(0.5, 0.8)),
                                    occupancy=float(rng.uniform(0.3, 0.6)), seed=s)),
            ("block", "block", dict(m=n, k=n, block=(8, 8), block_density=float(rng.uniform(0.02, 0.1)),
                                    occupancy=float(rng.uniform(0.15, 0.3)), seed=s)),
            ("row_pruned", "row_pruned", dict(m=n, k=n, prune_fraction=float(rng.uniform(0.1, 0.3)),
                                              density=float(rng.uniform(0.05, 0.2)), seed=s)),
            ("banded", "banded", dict(m=n, k=n, bandwidth=int(n * rng.uniform(0.06, 0.12)),
                                      fill=float(rng.uniform(0.1, 0.3)), seed=s)),
            ("power_law", "rmat", dict(scale=int(rng.integers(9, 12)), edge_factor=int(rng.choice((4, 8))),
                                       a=0.45, b=0.22, c=0.22, seed=s)),
        ]
    return out


def run(cases, title: str) -> None:
    confusion = Counter()
    confidence = defaultdict(list)
    params_ok = Counter()
    wrong = []
    t0 = time.perf_counter()
    for label, kind, kw in cases:
        report = analyze(gen.make(kind, **kw))
        confusion[(label, report.pattern)] += 1
        confidence[label].append(report.confidence)
        if report.pattern != label:
            wrong.append((label, report.pattern, round(report.confidence, 2), kind, kw))
        elif label == "block":
            params_ok["block shape"] += tuple(report.params["block_shape"]) == tuple(kw["block"])
            params_ok["block total"] += 1
        elif label == "nm":
            params_ok["nm ratio+axis"] += (report.params["nm"] == [kw["n"], kw["m_group"]]
                                           and report.params["axis"] == kw.get("axis", "row"))
            params_ok["nm total"] += 1
    seconds = time.perf_counter() - t0
    right = sum(v for (t, p), v in confusion.items() if t == p)
    print(f"\n== {title}: {right}/{len(cases)} right ({right / len(cases):.1%}), {seconds:.1f} s "
          f"(generation + analysis)")
    labels = [p for p in PATTERNS if any(t == p for t, _ in confusion)]
    print("true \\ predicted".ljust(16) + "".join(p[:9].rjust(10) for p in PATTERNS) + "   acc   conf")
    for t in labels:
        row = [confusion[(t, p)] for p in PATTERNS]
        total = sum(row)
        print(t.ljust(16) + "".join(str(v).rjust(10) for v in row)
              + f"  {confusion[(t, t)] / total:5.1%}  {np.mean(confidence[t]):.2f}")
    if params_ok["block total"]:
        print(f"block shape = generator's: {params_ok['block shape']}/{params_ok['block total']}")
    if params_ok["nm total"]:
        print(f"N:M ratio and axis = generator's: {params_ok['nm ratio+axis']}/{params_ok['nm total']}")
    for case in wrong:
        print("  wrong:", *case)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-class", type=int, default=100)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--edge", action="store_true", help="also run the harder out-of-range sweep")
    args = parser.parse_args()
    cases = [c for seed in args.seeds for c in gen.labelled_suite(args.per_class, seed=seed)]
    run(cases, f"labelled suite, {args.per_class} per class x seeds {args.seeds}")
    if args.edge:
        run(edge_suite(max(1, args.per_class // 4), seed=args.seeds[0]), "edge sweep (outside the issue's ranges)")


if __name__ == "__main__":
    main()
