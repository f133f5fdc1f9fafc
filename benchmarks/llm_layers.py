"""Decode-tier benchmark on LLM layer shapes: every template variant vs dense cuBLAS, one process.

Why a template-level sweep beside `sparseditto bench`: the bench command measures what run_graph
*chooses*; this script measures what each kernel *can do* on the shapes and pruning styles of the
kernel issue (Llama-style 4096x4096, 11008x4096, 4096x11008, 14336x4096; per-row magnitude and
random unstructured 50-90%, 2:4, 4:8, block, row-pruned), N from 1 to 128, fp16 and bf16. It is the
data the planner's rules and cost calibration come from, and the place to see % of roofline.

Method (the harness's): fresh values on the pattern (numerics.draw_matrix_values) and a fresh B,
every result checked against an fp64 reference with the verification tolerance before it is timed
and re-checked on new inputs after timing; cold L2 (a 2x-L2 buffer read before every launch),
median of repeats, launch replayed from a CUDA graph ("graph", the kernel's own time) and plain
("eager"); dense cuBLAS (torch.matmul on the dense weight) timed the same way in the same process.
"chain" (harness.timing.time_cuda_chain): the launch repeated back to back from one graph, each on its
own copy of the weight (cold in L2, B shared), per launch: what a layer costs inside a model's graph,
without the ~4 us a lone replay between events carries; cuBLAS and the read floor are chained the same
way, and x dense (chain) compares those. % roofline = format bytes (A + B + C) at the measured copy bandwidth over the graph time; % floor =
the time of a pure streaming read of those bytes, timed the same way in the same run
(read_floor_probe.py), over the graph time: at 5-60 MB the method's own fixed cost (an empty kernel
measures ~4 us) keeps even a pure read at 0.8-3.3 TB/s, so % floor is what the kernel wastes.

  python3 benchmarks/llm_layers.py --preset core --out out/llm_layers.json
  python3 benchmarks/llm_layers.py --preset check          # correctness only, small odd shapes
"""
from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

SHAPES = {"4096x4096": (4096, 4096), "11008x4096": (11008, 4096), "4096x11008": (4096, 11008),
          "14336x4096": (14336, 4096)}


# ---- pruned weights ----------------------------------------------------------------------------

def prune(m: int, k: int, style: str, sparsity: float, seed: int):
    """A SparseMatrix pruned the way LLM weights are: magnitude per row, random, n:m, block, rows."""
    from sparseditto.matrix import SparseMatrix

    rng = np.random.default_rng(seed)
    w = rng.standard_normal((m, k), dtype=np.float32)
    if style == "dense":
        keep = np.ones((m, k), dtype=bool)
    elif style == "magnitude":   # Wanda/SparseGPT-like: the same count kept in every row
        kept = int(round((1.0 - sparsity) * k))
        thresh = -np.partition(-np.abs(w), kept - 1, axis=1)[:, kept - 1:kept] if kept else np.inf
        keep = np.abs(w) >= thresh
    elif style == "random":
        keep = rng.random((m, k)) >= sparsity
    elif style in ("nm24", "nm48", "nm12"):
        n_keep, group = {"nm24": (2, 4), "nm48": (4, 8), "nm12": (1, 2)}[style]
        g = np.abs(w[:, : k // group * group]).reshape(m, -1, group)
        order = np.argsort(-g, axis=2)
        keep_g = np.zeros_like(g, dtype=bool)
        np.put_along_axis(keep_g, order[:, :, :n_keep], True, axis=2)
        keep = np.zeros((m, k), dtype=bool)
        keep[:, : k // group * group] = keep_g.reshape(m, -1)
    elif style.startswith("block"):
        b = int(style[5:])
        blocks = rng.random((-(-m // b), -(-k // b))) >= sparsity
        keep = np.kron(blocks, np.ones((b, b), dtype=bool))[:m, :k]
    elif style == "rows":
        keep = np.repeat(rng.random((m, 1)) >= sparsity, k, axis=1)
    else:
        raise ValueError(f"Unknown pruning style {style!r}.")
    return SparseMatrix.from_scipy(sp.csr_array(np.where(keep, w, 0.0)), dtype="float16",
                                   name=f"{m}x{k}_{style}_{sparsity:g}")


# ---- running one kernel ----------------------------------------------------------------------

def load(template: str, params: dict):
    from sparseditto.harness.source_loader import load_module
    from sparseditto.kernel_templates.registry import get_template

    return load_module(get_template(template).instantiate(params).source)


def check(fn, matrix, values64, dtype: str, n: int, rng) -> dict:
    """Run fn(B, out) on a fresh B and compare with the fp64 reference (harness tolerance)."""
    import torch

    from sparseditto.harness.numerics import Reference, compare, draw_dense, torch_dtype

    k = matrix.shape[1]
    b64 = draw_dense(rng, (k, n), dtype)
    ref = Reference.compute(matrix, values64, b64, dtype)
    b = torch.from_numpy(b64).to("cuda", torch_dtype(dtype))
    out = torch.full((matrix.shape[0], n), float("nan"), dtype=b.dtype, device="cuda")
    fn(b, out)
    torch.cuda.synchronize()
    cmp = compare(out.double().cpu().numpy(), ref.value, ref)
    return {"ok": bool(cmp.ok), "rel_err": cmp.rel_err, "message": cmp.message[:300]}


def time_chain(fns, b, out, repeats: int) -> float:
    """Per-launch microseconds of ``fns`` (one per copy of the weight) chained in one graph."""
    from sparseditto.harness.timing import time_cuda_chain

    return time_cuda_chain([lambda f=f: f(b, out) for f in fns], repeats=repeats, warmup=3).median_ms * 1e3


def chained_kernel(mod, packed, a_bytes: float, b, out, repeats: int, rng_seed: int) -> dict:
    """The kernel chained over copies of its packed matrix (timing.clone_packed), and a bitwise
    check that the last copy computes what the original does on a fresh B."""
    import torch

    from sparseditto.harness.timing import chain_copies
    from sparseditto.harness.timing import clone_packed

    copies = [packed] + [clone_packed(packed) for _ in range(chain_copies(a_bytes) - 1)]
    fns = [lambda bb, oo, _p=p: mod.spmm(_p, bb, oo) for p in copies]
    us = time_chain(fns, b, out, repeats)
    g = torch.Generator(device="cuda").manual_seed(rng_seed)
    b2 = torch.randn(b.shape, device="cuda", generator=g).to(b.dtype)
    o1, o2 = torch.empty_like(out), torch.empty_like(out)
    mod.spmm(packed, b2, o1)
    mod.spmm(copies[-1], b2, o2)
    same = bool(torch.equal(o1, o2))
    del copies
    return {"chain_us": us, "chain_copies_same": same}


def time_launch(fn, b, out, repeats: int) -> dict:
    from sparseditto.harness.timing import time_cuda, time_cuda_graph

    eager = time_cuda(lambda: fn(b, out), repeats=repeats, warmup=3)
    try:
        graph = time_cuda_graph(lambda: fn(b, out), repeats=repeats, warmup=3)
        graph_us = graph.median_ms * 1e3
    except Exception as exc:  # noqa: BLE001 - a launch that cannot be captured keeps its eager time
        graph_us, _ = None, exc
    return {"eager_us": eager.median_ms * 1e3, "graph_us": graph_us}


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write counted), 1 GiB, median of 10."""
    import torch

    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    y.copy_(x)
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        y.copy_(x)
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) * 1e-3)
    del x, y
    return 2.0 * (1 << 30) / float(np.median(times))


def read_bandwidth() -> float:
    """Pure-read bandwidth in bytes/s: torch's sum over a 2 GiB fp16 tensor (median of 10)."""
    import torch

    x = torch.ones(1 << 30, dtype=torch.float16, device="cuda")
    x.sum()
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        x.sum()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) * 1e-3)
    del x
    return 2.0 * (1 << 30) / float(np.median(times))


# ---- the sweep -----------------------------------------------------------------------------

PRESETS = {
    # correctness on odd shapes (M, K not multiples of the tiles, empty rows), every N class
    "check": dict(cases=[("37x130", 37, 130, "random", 0.5), ("100x300", 100, 300, "magnitude", 0.7),
                         ("64x64", 64, 64, "nm24", 0.5), ("260x1000", 260, 1000, "random", 0.9),
                         ("16x4096", 16, 4096, "dense", 0.0), ("1x70", 1, 70, "random", 0.3),
                         # 2:4 past one warpgroup's 64 rows and one B ring's chunks (tc_sp24's wgmma kernel)
                         ("100x300", 100, 300, "nm24", 0.5), ("200x4160", 200, 4160, "nm24", 0.5)],
                  ns=[1, 3, 8, 9, 16, 17, 33, 64, 65, 129], time=False),
    "core": dict(cases=[(s, *SHAPES[s], style, sp_) for s in ("11008x4096", "4096x4096")
                        for style, sp_ in (("dense", 0.0), ("magnitude", 0.5), ("nm24", 0.5), ("magnitude", 0.7),
                                           ("magnitude", 0.9))],
                 ns=[1, 16, 64], time=True),
    # the decode kernels (N <= 16) on the three Llama shapes: the row bitmap against the dense stream,
    # the sparse tensor cores and CSR
    "decode": dict(cases=[(s, *SHAPES[s], style, sp_) for s in ("4096x4096", "11008x4096", "4096x11008")
                          for style, sp_ in (("dense", 0.0), ("magnitude", 0.5), ("random", 0.5), ("nm24", 0.5),
                                             ("magnitude", 0.7), ("magnitude", 0.9))],
                   ns=[1, 4, 8, 16], time=True),
    # block-32 75% (session 41): bsr_tc measured 16.4 / 18.0 us at N = 1 against 11.9 / 14.5 at N = 16 on
    # 4096x4096 / 11008x4096 in one suite run (the memories of session 39's llm bench); N = 15 against 16
    # asks whether B's masked loads (EVEN_N false) are the difference; bsr_spmv (session 41) beside them
    "block": dict(cases=[(s, *SHAPES[s], "block32", 0.75) for s in ("4096x4096", "11008x4096")],
                  ns=[1, 2, 8, 15, 16], time=True),
}

# Launch-parameter variants swept per template: one prepare() per (case, template), then each variant
# only changes the launch parameters of the packed matrix (tc_launch compiles missing kernels on first
# use), so a sweep does not re-pack an 11008x4096 matrix per variant.
TEMPLATE_VARIANTS = {
    "check": {"tc_dense": [{}, {"R": 1, "PIPE": 4, "SPLIT": 1}, {"WARPS": 4, "PIPE": 3}],
              "tc_lanemask": [{}, {"SPLIT": 1, "PIPE": 2}, {"WARPS": 4, "PIPE": 6, "SPLIT": 8}, {"WARPS": 16, "PIPE": 3}],
              "tc_scatter": [{}, {"SPLIT": 1, "PIPE": 2}, {"WARPS": 4, "PIPE": 6, "SPLIT": 8}, {"WARPS": 16, "PIPE": 3}],
              "tc_bitmap": [{}, {"WARPS": 8, "RING_KB": 16}, {"SPLIT": 1, "RING_KB": 12}],
              "tc_sp24": [{}, {"R": 1, "PIPE": 4, "SPLIT": 1}, {"WARPS": 4, "PIPE": 3}]},
    "core": {"tc_dense": [{}, {"R": 1, "PIPE": 4}, {"SPLIT": 4}, {"SPLIT": 2, "R": 1}, {"WARPS": 4}],
             "tc_bitmap": [{}, {"WARPS": 8}, {"SPLIT": 8}, {"SPLIT": 4, "RING_KB": 16}, {"SPLIT": 1}],
             "tc_sp24": [{}, {"R": 1, "PIPE": 4}, {"SPLIT": 4}, {"SPLIT": 2, "R": 1}, {"WARPS": 4}, {"PIPE": 4}]},
    "decode": {"bitmap_spmv": [{}, {"SPLIT": 8}, {"ROWS": 2}, {"SPLIT": 2}], "tc_dense": [{}], "tc_lanemask": [{}],
               "tc_scatter": [{}, {"WARPS": 8}],
               "tc_sp24": [{"R": 1, "PIPE": 4}], "csr_vector": [{}], "delta_spmv": [{}, {"PIPE": 2}, {"WARPS": 4}]},
    "block": {"bsr_spmv": [{}, {"WARPS": 16}, {"UNROLL": 1}, {"WARPS": 4}], "bsr_tc": [{}], "delta_spmv": [{}],
              "csr_vector": [{}]},
}
# Templates whose parameters choose compiled kernels at prepare (module PARAMS), not launch
# parameters of the packed matrix: each variant is loaded and prepared on its own.
PREPARED_PER_VARIANT = ("bitmap_spmv", "csr_vector", "delta_spmv", "tc_words", "bsr_spmv")   # tc_words: UNIT packs


def cached_plan(packed: dict, n: int) -> dict | None:
    """The launch plan a tensor-core template's spmm cached in packed["scratch"] for N = n (None
    before the first call at that N, or for other templates)."""
    for key, plan in (packed.get("scratch") or {}).items():
        if isinstance(key, tuple) and key and key[0] == n and isinstance(plan, dict) and "geom" in plan:
            return plan
    return None


def launch_geometry(packed: dict, n: int) -> dict | None:
    """The tensor-core templates' launch at N = n as planned (grid, shared memory, registers per
    thread), read from the plan spmm cached: what decides occupancy and waves."""
    from sparseditto.kernel_templates import tc_launch

    plan = cached_plan(packed, n)
    if plan is None:
        return None
    return {"grid": list(plan["grid"]), "smem": plan["smem"], "regs": tc_launch.kernel_registers(plan["fn"])}


def packed_bytes(packed: dict) -> int:
    """Bytes of the device arrays a prepared matrix holds (its format bytes)."""
    import torch

    arrays = packed.get("arrays") or [key for key, v in packed.items() if torch.is_tensor(v)]
    return sum(packed[key].numel() * packed[key].element_size() for key in arrays)


def applicable(template: str, style: str) -> bool:
    if template == "tc_sp24":
        return style in ("nm24", "nm12")
    if template in ("tc_bitmap", "tc_lanemask", "tc_scatter", "tc_words"):
        return style != "dense"
    if template == "tc_dense":   # the dense stream's time does not depend on the pattern: time it once
        return style == "dense"
    if template in ("bitmap_spmv", "delta_spmv"):
        return style != "dense"
    if template == "csr_vector":
        return style == "magnitude"
    return True


def run(args) -> list[dict]:
    import torch

    from sparseditto.harness.numerics import draw_matrix_values, torch_dtype, with_values

    preset = PRESETS[args.preset]
    ns = args.n or preset["ns"]
    rows: list[dict] = []
    bw = copy_bandwidth() if preset["time"] else None
    if bw:
        print(f"copy bandwidth {bw / 1e12:.2f} TB/s (read + write), read-only {read_bandwidth() / 1e12:.2f} TB/s")
    variants = json.loads(args.variants) if args.variants else TEMPLATE_VARIANTS[args.preset]
    dense_cache: dict = {}
    dense_chain: dict = {}
    floor = None
    if preset["time"]:
        # a pure read of each row's bytes, timed the same way (read_floor_probe.py): what the method
        # allows at that size, where bytes over the copy bandwidth leave out the fixed costs
        from read_floor_probe import ReadFloor
        floor = ReadFloor(args.repeats)
    for (label, m, k, style, sparsity) in preset["cases"]:
        if args.cases and not re.search(args.cases, f"{label}/{style}/{sparsity}"):
            continue
        base = prune(m, k, style, sparsity, seed=args.seed)
        for dtype in args.dtype:
            rng = np.random.default_rng([args.seed, m, k])
            values64 = draw_matrix_values(base, rng, dtype)
            matrix = with_values(base, values64, dtype)
            tdt = torch_dtype(dtype)
            dense_w = torch.zeros((m, k), dtype=torch.float64, device="cuda")
            dense_w[torch.from_numpy(matrix.row_ids()).cuda(), torch.from_numpy(matrix.indices.astype(np.int64)).cuda()] = \
                torch.from_numpy(values64).cuda()
            dense_w = dense_w.to(tdt)
            cublas = lambda b, out: torch.matmul(dense_w, b, out=out)  # noqa: E731
            for template, plist in variants.items():
                if not applicable(template, style):
                    continue
                per_variant = template in PREPARED_PER_VARIANT
                packed = None
                for params in plist:
                    if packed is None or per_variant:
                        t0 = time.perf_counter()
                        try:
                            mod = load(template, params if per_variant else {})
                            packed = mod.prepare(matrix, tdt, torch.device("cuda"))
                            torch.cuda.synchronize()
                        except Exception as exc:  # noqa: BLE001 - recorded, the sweep goes on
                            rows.append({"case": label, "style": style, "sparsity": sparsity, "dtype": dtype,
                                         "template": template, "params": params, "error": f"prepare: {exc}"[:500]})
                            print(f"{label} {style} {template} {params}: prepare failed: {exc}")
                            packed = None
                            continue
                        prep_s = time.perf_counter() - t0
                        defaults = dict(packed.get("params", {}))
                        fn = lambda b, out, _m=mod, _p=packed: _m.spmm(_p, b, out)  # noqa: E731
                    if not per_variant:
                        packed["params"] = {**defaults, **params}
                    packed["scratch"].clear()
                    for n in ns:
                        row = {"case": label, "M": m, "K": k, "style": style, "sparsity": sparsity, "dtype": dtype,
                               "template": template, "params": packed.get("params", {**mod.PARAMS}), "N": n,
                               "prepare_s": prep_s}
                        try:
                            row["check"] = check(fn, matrix, values64, dtype, n, rng)
                        except Exception as exc:  # noqa: BLE001
                            row["error"] = f"run: {exc}"[:500]
                            rows.append(row)
                            print(f"{label} {style} {template} {params} N={n}: {row['error']}")
                            continue
                        geometry = launch_geometry(packed, n)
                        if geometry:
                            row["geometry"] = geometry
                        if preset["time"] and row["check"]["ok"]:
                            b = torch.randn((k, n), device="cuda").to(tdt)
                            out = torch.empty((m, n), dtype=tdt, device="cuda")
                            row.update(time_launch(fn, b, out, args.repeats))
                            key = (label, style, sparsity, dtype, n)
                            if key not in dense_cache:
                                dense_cache[key] = time_launch(cublas, b, out, args.repeats)
                            row["cublas_graph_us"], row["cublas_eager_us"] = dense_cache[key]["graph_us"], dense_cache[key]["eager_us"]
                            row["recheck"] = check(fn, matrix, values64, dtype, n, rng)
                            nbytes = packed_bytes(packed)
                            if args.chain:
                                try:
                                    row.update(chained_kernel(mod, packed, nbytes, b, out, args.repeats, args.seed + n))
                                except Exception as exc:  # noqa: BLE001 - recorded; the single-launch timing stays
                                    row["chain_error"] = f"{type(exc).__name__}: {exc}"[:300]
                                if key not in dense_chain:
                                    from sparseditto.harness.timing import chain_copies
                                    dws = [dense_w] + [dense_w.clone() for _ in range(chain_copies(m * k * 2) - 1)]
                                    dense_chain[key] = time_chain(
                                        [lambda bb, oo, _w=w: torch.matmul(_w, bb, out=oo) for w in dws], b, out,
                                        args.repeats)
                                    del dws
                                row["cublas_chain_us"] = dense_chain[key]
                            row["a_bytes"] = nbytes
                            total = nbytes + (k * n + m * n) * 2
                            if row["graph_us"]:
                                row["speedup"] = row["cublas_graph_us"] / row["graph_us"]
                                row["roofline_pct"] = 100.0 * total / bw / (row["graph_us"] * 1e-6)
                                row["read_floor_us"] = floor.floor_us(total)
                                row["floor_pct"] = 100.0 * row["read_floor_us"] / row["graph_us"]
                            if row.get("chain_us"):
                                row["speedup_chain"] = row["cublas_chain_us"] / row["chain_us"]
                                row["read_floor_chain_us"] = floor.chain_us(total)
                                row["floor_chain_pct"] = 100.0 * row["read_floor_chain_us"] / row["chain_us"]
                        rows.append(row)
                        c = row["check"]
                        tag = ",".join(f"{a}={b}" for a, b in params.items()) or "default"
                        print(f"{label:11s} {style:9s} {sparsity:4.2f} {dtype:8s} {template:9s} {tag:26s} N={n:<4d} "
                              f"ok={c['ok']} rel={c['rel_err']:.1e}"
                              + (f" graph {row['graph_us']:.1f}us eager {row['eager_us']:.1f}us cublas "
                                 f"{row['cublas_graph_us']:.1f}us x{row.get('speedup', 0):.2f} "
                                 f"roof {row.get('roofline_pct', 0):.0f}% floor {row.get('floor_pct', 0):.0f}%"
                                 + (f" | chain {row['chain_us']:.1f}us cublas {row['cublas_chain_us']:.1f}us "
                                    f"x{row['speedup_chain']:.2f} floor {row['floor_chain_pct']:.0f}%"
                                    + ("" if row["chain_copies_same"] else " COPIES DIFFER")
                                    if row.get("chain_us") else "")
                                 if row.get("graph_us") else "")
                              + (f" [grid {tuple(geometry['grid'])} smem {geometry['smem'] // 1024}K regs {geometry['regs']}]"
                                 if geometry else "")
                              + ("" if c["ok"] else f"  {c['message'][:160]}"), flush=True)
                packed = mod = None
            del dense_w
            torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="core")
    ap.add_argument("--n", type=int, nargs="*", help="override the preset's N values")
    ap.add_argument("--dtype", nargs="*", default=["float16"], choices=["float16", "bfloat16"])
    ap.add_argument("--variants", help='JSON {template: [launch params, ...]} to sweep instead of the preset\'s')
    ap.add_argument("--cases", help="regex over 'SHAPE/style/sparsity' (e.g. '11008x4096/magnitude'): only those cases")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--no-chain", dest="chain", action="store_false",
                    help="skip the chained timing (launches back to back from one graph, each on a cold copy)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("out/llm_layers.json"))
    args = ap.parse_args(argv)
    rows = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1, default=str))
    bad = [r for r in rows if r.get("error") or not r.get("check", {}).get("ok", False)
           or not r.get("recheck", {"ok": True})["ok"] or r.get("chain_copies_same") is False]
    print(f"{len(rows)} rows, {len(bad)} failed -> {args.out}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
