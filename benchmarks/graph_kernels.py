"""Graph-kernel sweep (issue 11): csr_rowdecomp's variants, the other CSR templates and torch's cuSPARSE
on the graphs suite's matrices, fp32, in one process, with the harness method.

Why beside `sparseditto bench --suite graphs`: the bench measures what run_graph chooses (seconds of
agent work per case); this measures what each kernel can do, variant by variant, against the vendor
path a graph user would call, which is what the planner's rules and defaults come from.

Method (llm_layers.py's: `check` and `time_launch`): fresh fp64-referenced values and B, every
result checked with the verification tolerance before timing and again after; cold L2, median of
repeats, the launch replayed from a CUDA graph ("graph") and plain ("eager"); cuSPARSE CSR through
torch.sparse timed the same way on the same inputs. x cuSPARSE = cuSPARSE graph us / kernel graph us.

  python3 benchmarks/graph_kernels.py --out out/graph_kernels.json                 # core matrices, N 32 128
  python3 benchmarks/graph_kernels.py --matrices 'rmat|laplacian' --n 32 128 256
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from llm_layers import check, load, time_launch  # noqa: E402

VARIANTS = {
    "csr_rowdecomp": [{}, {"UNROLL": 8}, {"LANES": 16}, {"ORDER": "row"}, {"CHUNK": 32}],
    "csr_vector": [{}],
    "csr_rowsplit": [{}],
}
FILES = ("graphchallenge_dnn_n1024-l1", "pushpull", "bcsstk13", "cryg2500", "test_FW_2003")


def matrices(data: Path, pattern: str | None) -> list:
    """(label, SparseMatrix): the core suite's generated graphs and a few SuiteSparse files."""
    from sparseditto.benchmark.cases import build_matrix, from_file
    from sparseditto.benchmark.suites import graph_generated

    specs = list(graph_generated("core"))
    root = data / "suitesparse"
    for name in FILES:
        hits = sorted(root.glob(f"{name}.*"))
        if hits:
            specs.append(from_file(hits[0], data, "graph_file", label=f"suitesparse/{name}"))
    out = []
    for spec in specs:
        if pattern and not re.search(pattern, spec.label):
            continue
        out.append((spec.label, build_matrix(spec)))
    return out


def run(args) -> list[dict]:
    import numpy as np
    import torch

    from sparseditto.harness.numerics import draw_matrix_values, with_values
    from sparseditto.harness.vendor_kernels import vendor_kernel

    rows = []
    variants = json.loads(args.variants) if args.variants else VARIANTS
    for label, base in matrices(args.data, args.matrices):
        rng = np.random.default_rng([args.seed, *base.shape])
        values64 = draw_matrix_values(base, rng, "float32")
        matrix = with_values(base, values64, "float32")
        cusparse = vendor_kernel("cusparse_csr_torch")
        vp = cusparse.prepare(matrix, torch.float32, torch.device("cuda"))
        vendor_fn = lambda b, out, _p=vp: cusparse.spmm(_p, b, out)  # noqa: E731
        vendor_us = {}
        for template, plist in variants.items():
            for params in plist:
                t0 = time.perf_counter()
                try:
                    mod = load(template, params)
                    packed = mod.prepare(matrix, torch.float32, torch.device("cuda"))
                    torch.cuda.synchronize()
                except Exception as exc:  # noqa: BLE001 - recorded, the sweep goes on
                    rows.append({"matrix": label, "template": template, "params": params, "error": f"prepare: {exc}"[:400]})
                    print(f"{label} {template} {params}: prepare failed: {exc}", flush=True)
                    continue
                prep_s = time.perf_counter() - t0
                fn = lambda b, out, _m=mod, _p=packed: _m.spmm(_p, b, out)  # noqa: E731
                for n in args.n:
                    m, k = matrix.shape
                    row = {"matrix": label, "M": m, "K": k, "nnz": matrix.nnz, "template": template, "params": params,
                           "N": n, "prepare_s": prep_s}
                    try:
                        row["check"] = check(fn, matrix, values64, "float32", n, rng)
                        if row["check"]["ok"]:
                            b = torch.randn((k, n), device="cuda")
                            out = torch.empty((m, n), device="cuda")
                            row.update(time_launch(fn, b, out, args.repeats))
                            if n not in vendor_us:
                                vendor_us[n] = time_launch(vendor_fn, b, out, args.repeats)
                                vendor_us[n]["check"] = check(vendor_fn, matrix, values64, "float32", n, rng)
                            row["cusparse"] = vendor_us[n]
                            row["recheck"] = check(fn, matrix, values64, "float32", n, rng)
                            if row["graph_us"] and vendor_us[n]["graph_us"]:
                                row["x_cusparse"] = vendor_us[n]["graph_us"] / row["graph_us"]
                    except Exception as exc:  # noqa: BLE001
                        row["error"] = f"run: {type(exc).__name__}: {exc}"[:400]
                    rows.append(row)
                    tag = ",".join(f"{a}={v}" for a, v in params.items()) or "default"
                    if "error" in row:
                        print(f"{label:30s} {template:14s} {tag:18s} N={n:<4d} {row['error']}", flush=True)
                        continue
                    c = row["check"]
                    print(f"{label:30s} {template:14s} {tag:18s} N={n:<4d} ok={c['ok']}"
                          + (f" graph {row['graph_us']:.1f}us eager {row['eager_us']:.1f}us cusparse "
                             f"{row['cusparse']['graph_us']:.1f}us x{row.get('x_cusparse', 0):.2f} "
                             f"recheck={row['recheck']['ok']}" if row.get("graph_us") else f" {c['message'][:120]}"),
                          flush=True)
                del packed, mod
        del vp
        torch.cuda.empty_cache()
        if args.out:   # after every matrix: a run cut short keeps what it measured
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(rows, indent=1))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=Path("../shared/data"))
    ap.add_argument("--matrices", help="regex over the matrix labels")
    ap.add_argument("--n", type=int, nargs="*", default=[32, 128])
    ap.add_argument("--variants", help='JSON {template: [params, ...]} instead of the built-in sweep')
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("out/graph_kernels.json"))
    args = ap.parse_args(argv)
    rows = run(args)
    print(f"{len(rows)} rows -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
