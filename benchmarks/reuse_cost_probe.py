"""Where a reused batch layer's seconds go (issue 12): the sandbox verification and timing of a
group winner's kernel on a fresh layer, as `batch.reuse.try_reuse` runs them, with the worker's
cProfile on.

    SPARSEDITTO_WORKER_PROFILE=/tmp/wprof python benchmarks/reuse_cost_probe.py --shapes 4096x4096 11008x4096

Why: on the H200 (session 39) a reused 4096 x 4096 layer of the 7B-shaped batch spent 2.0-2.9 s in
its verification and 0.65-0.86 s in its timing; the worker's side of those seconds (packing, fresh
values, references, checks) is not in the batch's own phases. Prints each call's wall seconds, then
the costliest calls (cumulative) of each shape's second verification (the first pays the worker's
start and the compile), the worker's and the driver's. Never a timing run: the profiler slows the worker.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["4096x4096", "11008x4096"])
    parser.add_argument("--sparsity", type=float, default=0.5)
    parser.add_argument("--template", default="delta_spmv")
    parser.add_argument("-n", type=int, default=1)
    parser.add_argument("--layers", type=int, default=3, help="fresh weights verified per shape")
    parser.add_argument("--top", type=int, default=28)
    args = parser.parse_args()

    from llm_layers import prune

    from sparseditto import harness
    from sparseditto.io import load_matrix
    from sparseditto.kernel_templates.registry import get_template

    profile_dir = os.environ.get("SPARSEDITTO_WORKER_PROFILE")
    source = get_template(args.template).instantiate({}).source
    for shape in args.shapes:
        m, k = (int(x) for x in shape.split("x"))
        driver = "(not profiled: --layers below 2)"
        for layer in range(args.layers):
            t0 = time.perf_counter()
            A = load_matrix(prune(m, k, "magnitude", args.sparsity, layer + 1), name=f"{shape}-{layer}")
            t1 = time.perf_counter()
            prof = cProfile.Profile() if layer == 1 else None   # the driver's side of one verification
            vr = (prof.runcall if prof else lambda f, *a, **k: f(*a, **k))(
                harness.run_and_verify, source, A, n_values=[args.n], dtype="float16", backend="cuda")
            t2 = time.perf_counter()
            if prof:
                text = io.StringIO()
                pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(12)
                driver = "\n".join(x for x in text.getvalue().splitlines() if x.strip())
            res = harness.bench(source, A, args.n, dtype="float16", backend="cuda", repeats=50, warmup=5,
                                baselines=False, time_dense=False)
            t3 = time.perf_counter()
            print(f"{shape} layer {layer}: make {t1 - t0:.2f} s, verify {t2 - t1:.2f} s ({vr.status}, "
                  f"{len(vr.checks)} checks, worker {vr.seconds:.2f} s), time {t3 - t2:.2f} s "
                  f"({(res.candidate_graph or res.candidate).median_ms * 1e3:.1f} us)", flush=True)
        if profile_dir:
            files = sorted(Path(profile_dir).glob("verify-*.txt"), key=lambda p: p.stat().st_mtime)
            print(f"--- {shape}: the driver's side of a verification ---\n{driver}")
            if len(files) >= 2:
                lines = [x for x in files[-2].read_text().splitlines() if x.strip()]
                print(f"--- {shape}: worker profile of a verification ({files[-2].name}) ---")
                print("\n".join(lines[:args.top + 8]))
            for f in files:
                f.unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
