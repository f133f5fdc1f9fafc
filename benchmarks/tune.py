"""Tune the kernel templates on one GPU in one run: many parameter variants, cold-L2 timings.

GPU time is scarce, so one invocation measures everything worth comparing and leaves a JSON file:
    python3 benchmarks/tune.py --out $OUT/tune.json                 # the full variant list
    python3 benchmarks/tune.py --out t.json --only u90 u99 --budget 120
    python3 benchmarks/tune.py --list                               # what would run (no GPU)
    python3 benchmarks/tune.py --smoke                              # tiny shapes, Triton interpreter
    python3 benchmarks/tune.py --host-cost --out h.json             # Python cost per call, launch stubbed

Per (case, N) the script times dense cuBLAS (torch.matmul on the densified A), then each variant
(template + params) the same way the harness's bench does: `prepare` timed on its own, one checked
run against an fp64 reference, eager cold-L2 timing (CUDA events around the call, L2 flushed
before each launch: includes the Python work in spmm), the same launch replayed from a CUDA graph
(the kernel's own time), and the host cost of one spmm call (50 calls enqueued back to back,
wall time before synchronizing). Outputs written by the timed runs are re-checked.

Compilation dominates a cold run, so a pool of worker processes first runs every variant once
(compiling into Triton's on-disk cache and checking the result); the main process then times
the variants serially with warm caches. A variant that fails in a worker is reported, not timed
(a crashing kernel must not take the timing process down). With --old DIR, the template files in
DIR (e.g. an earlier commit's) run as "<name>@old" variants in the same run, for before/after
tables measured under the same clocks. --harness also passes a few defaults through
sparseditto.harness.run_and_verify + bench (sandboxed workers, the planner's own path).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SIZE = 4096
PARAMS_LINE = re.compile(r'^PARAMS = dict\(META\["defaults"\]\)[ \t]*$', re.MULTILINE)


# ---- cases --------------------------------------------------------------------------------------

def synthetic(size: int) -> dict:
    """The kernel issue's cases at M = K = size: name -> zero-argument builder."""
    from sparseditto import generate

    return {
        "u90": lambda: generate.unstructured(size, size, 0.90, seed=1),
        "u99": lambda: generate.unstructured(size, size, 0.99, seed=1),
        "block32_90": lambda: generate.block_sparse(size, size, block=(32, 32), block_density=0.1,
                                                    occupancy=1.0, seed=2),
        "block64_90": lambda: generate.block_sparse(size, size, block=(64, 64), block_density=0.1,
                                                    occupancy=1.0, seed=2),
        "nm24": lambda: generate.nm_sparse(size, size, n=2, m_group=4, seed=3),
        "rowpruned50": lambda: generate.row_pruned(size, size, prune_fraction=0.5, density=1.0, seed=4),
    }


DLMC_FILES = [
    "transformer/magnitude_pruning/0.7/body_encoder_layer_0_ffn_conv1_fully_connected",
    "transformer/magnitude_pruning/0.9/body_encoder_layer_0_ffn_conv1_fully_connected",
    "transformer/magnitude_pruning/0.98/body_encoder_layer_0_ffn_conv1_fully_connected",
    "transformer/magnitude_pruning/0.9/body_encoder_layer_0_self_attention_multihead_attention_q_fully_connected",
    "transformer/magnitude_pruning/0.98/body_decoder_layer_0_encdec_attention_multihead_attention_k_fully_connected",
    "rn50/magnitude_pruning/0.8/bottleneck_2_block_group4_1_1",
    "rn50/magnitude_pruning/0.9/bottleneck_3_block_group4_2_1",
    "rn50/magnitude_pruning/0.98/bottleneck_projection_block_group_projection_block_group2",
]


def dlmc(root: Path) -> dict:
    from sparseditto.io import load_matrix

    out = {}
    for rel in DLMC_FILES:
        path = root / "dlmc" / (rel + ".smtx.gz")
        if path.exists():
            short = "dlmc:" + rel.split("/")[0][:5] + rel.split("/")[2] + ":" + rel.split("/")[-1][-28:]
            out[short] = (lambda p=path: load_matrix(p, seed=0))
    return out


# ---- variants -----------------------------------------------------------------------------------

def variants(dlmc_names: list[str]) -> list[tuple[str, int, str, dict]]:
    """(case, N, template, params), most important first (a run cut short keeps the head).
    "<template>@old" entries run the files of --old (the previous templates) for before/after."""
    V = []

    def add(case, n, template, *param_sets):
        for p in param_sets:
            V.append((case, n, template, dict(p)))

    # unstructured 99%, N = 16: latency-bound (0.7 MB of A); goal 5x over cuBLAS.
    add("u99", 16, "csr_rowsplit", {"ROWS_PER_PROGRAM": 2}, {"ROWS_PER_PROGRAM": 2, "num_warps": 4},
        {"ROWS_PER_PROGRAM": 2, "num_warps": 2}, {"ROWS_PER_PROGRAM": 1, "num_warps": 2},
        {"ROWS_PER_PROGRAM": 1, "num_warps": 4}, {"ROWS_PER_PROGRAM": 4, "num_warps": 8},
        {"ROWS_PER_PROGRAM": 2, "LAYOUT": "csr"}, {"ROWS_PER_PROGRAM": 1, "LAYOUT": "csr", "BLOCK_NNZ": 64,
                                                   "num_warps": 2},
        {"ROWS_PER_PROGRAM": 2, "BLOCK_NNZ": 64, "num_warps": 4})
    add("u99", 16, "csr_vector", {"GROUP": 16}, {"GROUP": 8})
    add("u99", 16, "csr_balanced", {}, {"NNZ_PER_PROGRAM": 128})
    # unstructured 90%, N = 16: 6.7 MB of A in CSR int16; goal 3x.
    add("u90", 16, "csr_rowsplit", {}, {"ROWS_PER_PROGRAM": 2}, {"ROWS_PER_PROGRAM": 2, "BLOCK_NNZ": 128},
        {"ROWS_PER_PROGRAM": 2, "BLOCK_NNZ": 128, "num_warps": 4}, {"ROWS_PER_PROGRAM": 4, "BLOCK_NNZ": 32},
        {"ROWS_PER_PROGRAM": 1, "BLOCK_NNZ": 128, "num_warps": 2},
        {"ROWS_PER_PROGRAM": 1, "BLOCK_NNZ": 64, "num_warps": 1},
        {"ROWS_PER_PROGRAM": 2, "LAYOUT": "padded"}, {"ROWS_PER_PROGRAM": 2, "BLOCK_NNZ": 64, "num_warps": 2},
        {"ROWS_PER_PROGRAM": 4, "BLOCK_NNZ": 64, "num_warps": 8})
    add("u90", 16, "csr_vector", {"WARPS_PER_BLOCK": 8, "GROUP": 16})
    add("u90", 16, "bitmap_tiles", {}, {"BLOCK_M": 32}, {"BLOCK_M": 32, "num_warps": 2},
        {"BLOCK_M": 16, "num_warps": 1})
    add("u90", 16, "nm_compressed", {"BLOCK_M": 32}, {"BLOCK_M": 32, "num_warps": 2})
    add("u90", 16, "csr_balanced", {})
    # block-sparse 32x32 blocks, 10% kept, N = 16: goal 4x.
    add("block32_90", 16, "bsr_tc", {}, {"SPLIT": 1}, {"SPLIT": 4}, {"BM": 16, "BK": 32},
        {"BM": 16, "BK": 32, "SPLIT": 1}, {"num_stages": 3}, {"GROUP": 1}, {"GROUP": 4},
        {"BM": 16, "BK": 16, "SPLIT": 1})
    # 2:4, N = 16: goal 1.5x.
    add("nm24", 16, "nm_compressed", {}, {"BLOCK_M": 32}, {"BLOCK_M": 32, "num_warps": 2},
        {"BLOCK_M": 32, "SPLIT_K": 4}, {"BLOCK_M": 32, "SPLIT_K": 2}, {"BLOCK_M": 16, "num_warps": 1},
        {"BLOCK_M": 32, "num_stages": 4}, {"BLOCK_M": 32, "BLOCK_G": 64}, {"BLOCK_M": 64, "SPLIT_K": 8},
        {"BLOCK_M": 32, "EXPAND": "planes"}, {"BLOCK_M": 16, "num_warps": 1, "SPLIT_K": 2})
    add("nm24", 16, "bitmap_tiles", {"BLOCK_M": 32})
    # row-pruned 50% (kept rows dense), N = 16: goal ~2x (cuBLAS-like on the kept half).
    add("rowpruned50", 16, "compact_rows_cols", {}, {"SPLIT_K": 4}, {"SPLIT_K": 16}, {"BLOCK_M": 32},
        {"BLOCK_M": 128, "num_warps": 8}, {"BLOCK_K": 256}, {"num_stages": 3}, {"BLOCK_M": 32, "SPLIT_K": 8})
    add("rowpruned50", 16, "csr_rowsplit", {})
    # N = 2048.
    add("block32_90", 2048, "bsr_tc", {}, {"BLOCK_N": 256}, {"num_warps": 8}, {"BLOCK_N": 64},
        {"BLOCK_N": 256, "num_warps": 8})
    add("block64_90", 2048, "bsr_tc", {}, {"BLOCK_N": 256, "num_warps": 8}, {"num_warps": 8})
    add("u99", 2048, "csr_rowsplit", {"ROWS_PER_PROGRAM": 2}, {"ROWS_PER_PROGRAM": 1, "BLOCK_N": 64},
        {"ROWS_PER_PROGRAM": 1, "BLOCK_N": 128, "BLOCK_NNZ": 16},
        {"ROWS_PER_PROGRAM": 1, "BLOCK_N": 256, "BLOCK_NNZ": 16, "num_warps": 8})
    add("u99", 2048, "csr_balanced", {})
    add("nm24", 2048, "nm_compressed", {}, {"BLOCK_M": 128, "num_warps": 8})
    add("rowpruned50", 2048, "compact_rows_cols", {}, {"BLOCK_N": 256, "num_warps": 8}, {"num_stages": 3})
    # DLMC at N = 256 (vs torch's cuSPARSE CSR).
    for name in dlmc_names:
        add(name, 256, "csr_rowsplit", {}, {"ROWS_PER_PROGRAM": 2}, {"BLOCK_N": 64})
        add(name, 256, "bitmap_tiles", {"BLOCK_M": 32})
    return V


# ---- loading candidates -------------------------------------------------------------------------

def candidate_source(template: str, params: dict, old_dir: Path | None) -> tuple[str, str]:
    """(source, sha256) of a template instance; "<name>@old" reads DIR/<name>.py instead."""
    if template.endswith("@old"):
        if old_dir is None:
            raise ValueError(f"{template} needs --old DIR")
        text = (old_dir / (template[:-4] + ".py")).read_text()
        source, count = PARAMS_LINE.subn(lambda _m: "PARAMS = " + repr(_merged_old(text, params)), text, count=1)
        if count != 1:
            raise ValueError(f"{template}: no PARAMS line")
    else:
        from sparseditto.kernel_templates.registry import get_template

        source = get_template(template).instantiate(params).source
    from sparseditto.harness.source_loader import source_hash

    return source, source_hash(source)


def _merged_old(text: str, params: dict) -> dict:
    import ast

    tree = ast.parse(text)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "META" for t in node.targets):
            meta = ast.literal_eval(node.value)
            return {**meta["defaults"], **params}
    raise ValueError("no META")


def load_module(source: str, digest: str, cache: Path):
    path = cache / f"tune_{digest[:20]}.py"
    if not path.exists():
        path.write_text(source)
    name = f"tune_cand_{digest[:20]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# ---- one variant --------------------------------------------------------------------------------

class Inputs:
    """A case's matrix at one N on the device: dtype-rounded values, B, and the fp64 reference with
    the verifier's own tolerance (`sparseditto.harness.numerics`: one rule for verify and tuning)."""

    def __init__(self, matrix, n: int, dtype: str, device: str, seed: int = 0):
        import numpy as np
        import torch

        from sparseditto.harness.numerics import Reference, round_to_dtype, torch_dtype, with_values

        self.matrix, self.n, self.dtype, self.device = matrix, n, dtype, device
        self.tdtype = torch_dtype(dtype)
        vals = round_to_dtype(matrix.data.astype(np.float64), dtype)
        self.a = with_values(matrix, vals, dtype)
        M, K = matrix.shape
        gen = torch.Generator(device="cpu").manual_seed(seed)
        b = (torch.rand(K, n, generator=gen, dtype=torch.float64) * 2 - 1).to(self.tdtype)
        self.B = b.to(device)
        self.ref = Reference.compute(self.a, vals, b.double().numpy(), dtype)
        self.dense = torch.from_numpy(self.a.to_dense()).to(device=device, dtype=self.tdtype)  # dense's timing

    def check(self, out) -> str | None:
        from sparseditto.harness.numerics import compare

        result = compare(out.double().cpu().numpy(), self.ref.value, self.ref)
        return None if result.ok else result.message


def run_once(module, inputs: Inputs) -> tuple[dict, float, str | None]:
    """prepare + one checked spmm; (packed, conversion ms, error or None)."""
    import torch

    torch.cuda.synchronize() if inputs.device == "cuda" else None
    t0 = time.perf_counter()
    packed = module.prepare(inputs.a, inputs.tdtype, inputs.device)
    if inputs.device == "cuda":
        torch.cuda.synchronize()
    conv_ms = (time.perf_counter() - t0) * 1e3
    out = torch.full((inputs.matrix.shape[0], inputs.n), float("nan"), dtype=inputs.tdtype, device=inputs.device)
    module.spmm(packed, inputs.B, out)
    return packed, conv_ms, inputs.check(out)


def plan_config(packed: dict) -> dict:
    """The resolved launch configuration a template cached in packed["scratch"] (when it does)."""
    scratch = packed.get("scratch") if isinstance(packed, dict) else None
    if not isinstance(scratch, dict):
        return {}
    for plan in scratch.values():
        for p in (plan if isinstance(plan, list) else [plan]):
            if isinstance(p, dict) and "grid" in p:
                cfg = dict(p.get("config") or {})
                cfg.update(p.get("options") or {})
                cfg["grid"] = list(p["grid"])
                if "name" in p:            # csr_vector: the CUDA kernel's name expression
                    cfg.update(kernel=p["name"], block=list(p["block"]))
                return {k: (v if isinstance(v, (int, float, str, bool, list)) else str(v)) for k, v in cfg.items()}
    return {}


def time_variant(module, inputs: Inputs, repeats: int) -> dict:
    import torch

    from sparseditto.harness.timing import time_cuda, time_cuda_graph

    packed, conv_ms, err = run_once(module, inputs)
    row = {"conversion_ms": conv_ms, "config": plan_config(packed)}
    for key in ("layout", "width", "block_shape", "group", "expand", "direct_b", "residual_nnz"):
        if key in packed:
            v = packed[key]
            row["config"][key] = list(v) if isinstance(v, tuple) else v
    if err:
        row.update(status="wrong", message=err)
        return row
    M, n = inputs.matrix.shape[0], inputs.n
    out = torch.full((M, n), float("nan"), dtype=inputs.tdtype, device="cuda")
    eager = time_cuda(lambda: module.spmm(packed, inputs.B, out), repeats=repeats, warmup=3)
    out_g = torch.full((M, n), float("nan"), dtype=inputs.tdtype, device="cuda")
    try:
        graph = time_cuda_graph(lambda: module.spmm(packed, inputs.B, out_g), repeats=repeats, warmup=3)
        graph_us = graph.median_ms * 1e3
    except Exception as exc:  # noqa: BLE001 - recorded, eager kept
        graph_us, row["graph_error"] = None, f"{type(exc).__name__}: {str(exc)[:200]}"
        torch.cuda.synchronize()
        out_g = None
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(50):
        module.spmm(packed, inputs.B, out)
    host_us = (time.perf_counter() - t0) / 50 * 1e6
    torch.cuda.synchronize()
    problems = [p for p in (inputs.check(out), inputs.check(out_g) if out_g is not None else None) if p]
    row.update(status="ok" if not problems else "wrong_after_timing", message="; ".join(problems),
               eager_us=eager.median_ms * 1e3, eager_p10_us=eager.p10_ms * 1e3, graph_us=graph_us, host_us=host_us)
    return row


def time_dense(inputs: Inputs, repeats: int) -> dict:
    import torch

    from sparseditto.harness.timing import time_cuda, time_cuda_graph

    out = torch.empty((inputs.matrix.shape[0], inputs.n), dtype=inputs.tdtype, device="cuda")
    eager = time_cuda(lambda: torch.matmul(inputs.dense, inputs.B, out=out), repeats=repeats, warmup=3)
    graph = time_cuda_graph(lambda: torch.matmul(inputs.dense, inputs.B, out=out), repeats=repeats, warmup=3)
    return {"dense_eager_us": eager.median_ms * 1e3, "dense_graph_us": graph.median_ms * 1e3}


def time_cusparse(inputs: Inputs, repeats: int) -> float | None:
    from sparseditto.harness.baselines import measure_baselines

    res = measure_baselines(inputs.a, inputs.B, inputs.dtype, "cuda", repeats=repeats, warmup=3,
                            include=["cusparse_csr_torch"])
    return res[0].timing.median_ms * 1e3 if res and res[0].ok and res[0].timing else None


# ---- phase A: compile + check in worker processes -----------------------------------------------

_WORKER_MATS: dict = {}


def _worker(job):
    """Run each variant of one (case, N) once: compiles into Triton's disk cache, checks the result."""
    case, n, items, cfg = job
    import torch  # noqa: F401

    results = []
    try:
        if case not in _WORKER_MATS:
            _WORKER_MATS.clear()
            _WORKER_MATS[case] = builders(cfg)[case]()
        inputs = Inputs(_WORKER_MATS[case], n, cfg["dtype"], cfg["device"])
    except Exception as exc:  # noqa: BLE001
        return [(i, "error", f"inputs: {type(exc).__name__}: {exc}", 0.0) for i, _, _ in items]
    for i, template, params in items:
        t0 = time.perf_counter()
        try:
            source, digest = candidate_source(template, params, Path(cfg["old"]) if cfg["old"] else None)
            module = load_module(source, digest, Path(cfg["cache"]))
            _, _, err = run_once(module, inputs)
            results.append((i, "wrong" if err else "ok", err or "", time.perf_counter() - t0))
        except Exception as exc:  # noqa: BLE001
            results.append((i, "error", f"{type(exc).__name__}: {str(exc)[:400]}", time.perf_counter() - t0))
            text = str(exc)
            if "illegal memory access" in text or "illegal instruction" in text or "CUDA error" in text:
                break  # the context is poisoned: the rest of this job cannot run here
    return results


def builders(cfg: dict) -> dict:
    out = synthetic(cfg["size"])
    if cfg.get("dlmc_root"):
        out.update(dlmc(Path(cfg["dlmc_root"])))
    return out


def compile_all(jobs_by_key: dict, cfg: dict, workers: int) -> dict:
    """{variant index: (status, message, seconds)} from a spawn pool (or in-process with 0 workers)."""
    jobs = []
    for (case, n), items in jobs_by_key.items():
        for k in range(0, len(items), 4):
            jobs.append((case, n, items[k:k + 4], cfg))
    status = {}
    if workers <= 0:
        for job in jobs:
            for i, st, msg, sec in _worker(job):
                status[i] = (st, msg, sec)
        return status
    import multiprocessing as mp

    with mp.get_context("spawn").Pool(workers, maxtasksperchild=6) as pool:
        for res in pool.imap_unordered(_worker, jobs):
            for i, st, msg, sec in res:
                status[i] = (st, msg, sec)
    return status


# ---- reporting ----------------------------------------------------------------------------------

def fmt(x, digits=1):
    return "-" if x is None else f"{x:.{digits}f}"


def print_table(rows: list[dict]) -> None:
    print("\n=== all variants (us; graph = kernel's own time; x = dense/candidate, graph) ===")
    print(f"{'case':26s} {'N':>5s} {'template':18s} {'graph':>7s} {'eager':>7s} {'host':>6s} {'dense':>7s} "
          f"{'x':>5s} {'conv ms':>8s}  params / status")
    for r in rows:
        x = r["dense_graph_us"] / r["graph_us"] if r.get("graph_us") and r.get("dense_graph_us") else None
        p = json.dumps(r["params"], separators=(",", ":"))
        tail = p if r["status"] == "ok" else f"{p} {r['status']}: {r.get('message', '')[:90]}"
        print(f"{r['case'][:26]:26s} {r['n']:5d} {r['template'][:18]:18s} {fmt(r.get('graph_us')):>7s} "
              f"{fmt(r.get('eager_us')):>7s} {fmt(r.get('host_us')):>6s} {fmt(r.get('dense_graph_us')):>7s} "
              f"{fmt(x, 2):>5s} {fmt(r.get('conversion_ms'), 0):>8s}  {tail}")
    print("\n=== best per (case, N) by graph time ===")
    best = {}
    for r in rows:
        if r.get("status") == "ok" and r.get("graph_us"):
            key = (r["case"], r["n"])
            if key not in best or r["graph_us"] < best[key]["graph_us"]:
                best[key] = r
    for (case, n), r in best.items():
        x = r["dense_graph_us"] / r["graph_us"]
        xe = r["dense_eager_us"] / r["eager_us"] if r.get("eager_us") else None
        extra = f" cusparse {fmt(r.get('cusparse_us'))} (x{fmt(r['cusparse_us'] / r['eager_us'], 2)} eager)" \
            if r.get("cusparse_us") else ""
        print(f"{case[:26]:26s} {n:5d} {r['template']:18s} graph {fmt(r['graph_us'])} eager {fmt(r.get('eager_us'))} "
              f"dense {fmt(r['dense_graph_us'])}/{fmt(r['dense_eager_us'])} -> x{x:.2f} graph, x{fmt(xe, 2)} eager"
              f"{extra}  {json.dumps(r['params'], separators=(',', ':'))} {json.dumps(r.get('config', {}))[:160]}")
    dl = {}
    for (case, n), r in best.items():
        if case.startswith("dlmc") and r.get("cusparse_us") and r.get("eager_us"):
            dl[case] = r["cusparse_us"] / r["eager_us"]
    if dl:
        g = math.exp(sum(math.log(v) for v in dl.values()) / len(dl))
        print(f"DLMC geomean speedup of the best template (eager) over torch cuSPARSE CSR (eager): x{g:.2f} "
              f"over {len(dl)} matrices")


# ---- harness path -------------------------------------------------------------------------------

HARNESS_CHECKS = [("nm_compressed", {}, "nm24", 2048), ("csr_rowsplit", {"ROWS_PER_PROGRAM": 2}, "u99", 16),
                  ("compact_rows_cols", {}, "rowpruned50", 16), ("bsr_tc", {}, "block32_90", 16),
                  ("csr_vector", {}, "u99", 16), ("bitmap_tiles", {}, "u90", 16), ("csr_balanced", {}, "u99", 16)]


def harness_checks(cfg: dict, deadline: float) -> list[dict]:
    from sparseditto.harness import bench, run_and_verify
    from sparseditto.kernel_templates.registry import get_template

    out, mats = [], {}
    for template, params, case, n in HARNESS_CHECKS:
        if time.time() > deadline:
            print(f"harness: deadline reached before {template} on {case}", flush=True)
            break
        if case not in mats:
            mats.clear()
            mats[case] = builders(cfg)[case]()
        cand = get_template(template).instantiate(params)
        t0 = time.perf_counter()
        ver = run_and_verify(cand, mats[case], n_values=(n, 7) if n > 7 else (n,), timeout=300)
        row = {"template": template, "params": params, "case": case, "n": n, "verify": ver.status,
               "verify_message": ver.message[:300], "verify_s": time.perf_counter() - t0}
        if ver.ok:
            try:
                res = bench(cand, mats[case], n, baselines=False, repeats=20, timeout=300)
                row.update(bench="ok", eager_us=res.candidate.median_ms * 1e3,
                           graph_us=res.candidate_graph.median_ms * 1e3 if res.candidate_graph else None,
                           dense_graph_us=res.dense_graph.median_ms * 1e3 if res.dense_graph else None,
                           conversion_ms=res.conversion_ms, reverified=res.reverified)
            except Exception as exc:  # noqa: BLE001
                row.update(bench=f"{type(exc).__name__}: {str(exc)[:300]}")
        print("harness:", json.dumps(row), flush=True)
        out.append(row)
    return out


# ---- host cost with the launch stubbed (CPU, no GPU needed) -------------------------------------

class _StubKernel:
    """Stands in for a Triton kernel (JIT or compiled): indexing by grid gives a no-op launcher."""

    def __init__(self, arg_names=()):
        self.arg_names = list(arg_names)

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def host_cost(old_dir: Path | None, calls: int = 2000) -> list[dict]:
    """Python work per spmm call with every kernel launch stubbed (CPU tensors, N = 16): what a
    caller pays on top of the launch itself. With --old, the earlier files are measured too."""
    import torch

    from sparseditto import generate

    cache = Path(os.environ.get("TMPDIR", "/tmp")) / "sparseditto_tune"
    cache.mkdir(parents=True, exist_ok=True)
    mats = {"csr_rowsplit": generate.unstructured(1024, 1024, 0.9, seed=1),
            "csr_balanced": generate.unstructured(1024, 1024, 0.9, seed=1),
            "compact_rows_cols": generate.row_pruned(1024, 1024, 0.5, seed=4),
            "bsr_tc": generate.block_sparse(1024, 1024, block=(32, 32), block_density=0.1, occupancy=1.0, seed=2),
            "nm_compressed": generate.nm_sparse(1024, 1024, n=2, m_group=4, seed=3),
            "bitmap_tiles": generate.unstructured(1024, 1024, 0.7, seed=1)}
    rows = []
    for name, A in mats.items():
        B = torch.randn(A.shape[1], 16, dtype=torch.float16)
        out = torch.empty(A.shape[0], 16, dtype=torch.float16)
        row = {"template": name}
        for tag in ("new", "old"):
            if tag == "old" and old_dir is None:
                continue
            source, digest = candidate_source(name + ("@old" if tag == "old" else ""), {}, old_dir)
            module = load_module(source, digest, cache)
            for attr in [a for a in list(vars(module)) if a.startswith("_") and a.endswith("_kernel")]:
                setattr(module, attr, _StubKernel(getattr(getattr(module, attr), "arg_names", ())))
            packed = module.prepare(A, torch.float16, "cpu")
            module.spmm(packed, B, out)
            for plan in (packed.get("scratch") or {}).values():   # what a GPU run keeps after call 1
                for p in (plan if isinstance(plan, list) else [plan]):
                    if isinstance(p, dict) and "compiled" in p:
                        p["compiled"] = _StubKernel()
            t0 = time.perf_counter()
            for _ in range(calls):
                module.spmm(packed, B, out)
            row[f"{tag}_us"] = (time.perf_counter() - t0) / calls * 1e6
        rows.append(row)
        print("host cost (launch stubbed):", json.dumps(row), flush=True)
    return rows


# ---- main ---------------------------------------------------------------------------------------

def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a finished child that nobody reaped yet is a zombie: not running
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tune.json")
    ap.add_argument("--only", nargs="*", help="case names (or prefixes) to run")
    ap.add_argument("--templates", nargs="*", help="template names to run")
    ap.add_argument("--n", type=int, nargs="*", help="only these N")
    ap.add_argument("--size", type=int, default=SIZE)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--repeats", type=int, default=25)
    ap.add_argument("--budget", type=float, default=230.0, help="seconds; no new timing starts after it")
    ap.add_argument("--workers", type=int, default=min(12, max(1, (os.cpu_count() or 2) - 2)))
    ap.add_argument("--old", default=str(ROOT / ".gpu" / "old_templates"), help="dir of earlier template files")
    ap.add_argument("--dlmc-dir", default=os.environ.get("SPARSEDITTO_DATA", str(ROOT / ".gpu" / "data")))
    ap.add_argument("--harness", action="store_true", help="also run a few defaults through run_and_verify + bench")
    ap.add_argument("--harness-until", type=float, default=270.0,
                    help="start no harness check after this many seconds from the start")
    ap.add_argument("--wait-pid", type=int, default=0,
                    help="before timing, wait for this process (e.g. GPU tests run during compilation)")
    ap.add_argument("--wait-max", type=float, default=60.0, help="longest wait for --wait-pid, seconds")
    ap.add_argument("--list", action="store_true", help="print the variants and exit")
    ap.add_argument("--host-cost", action="store_true",
                    help="CPU only: Python work per spmm call with the launches stubbed, then exit")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes in the Triton interpreter (no timings)")
    args = ap.parse_args(argv)
    t_start = time.time()

    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        from sparseditto.harness.interpreter_compat import patch_triton_interpreter

        patch_triton_interpreter()
        args.size, args.workers = min(args.size, 128), 0
    old = Path(args.old) if args.old and Path(args.old).is_dir() else None
    dlmc_root = Path(args.dlmc_dir) if Path(args.dlmc_dir).is_dir() else None
    dlmc_names = list(dlmc(dlmc_root)) if dlmc_root and not args.smoke else []
    V = variants(dlmc_names)
    if args.smoke:
        V = [v for v in V if v[1] <= 256 and v[2] != "csr_vector"]
    if args.only:
        V = [v for v in V if any(v[0] == o or v[0].startswith(o) for o in args.only)]
    if args.templates:
        V = [v for v in V if v[2].split("@")[0] in args.templates or v[2] in args.templates]
    if args.n:
        V = [v for v in V if v[1] in args.n]
    if old is None:
        V = [v for v in V if not v[2].endswith("@old")]
    if args.list:
        for i, v in enumerate(V):
            print(i, *v)
        return 0
    if args.host_cost:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        Path(args.out).write_text(json.dumps({"host_cost": host_cost(old)}, indent=1))
        return 0

    import torch

    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    cache = Path(os.environ.get("TMPDIR", "/tmp")) / "sparseditto_tune"
    cache.mkdir(parents=True, exist_ok=True)
    cfg = {"size": args.size, "dtype": args.dtype, "device": device, "old": str(old) if old else "",
           "cache": str(cache), "dlmc_root": str(dlmc_root) if dlmc_root and not args.smoke else ""}
    env = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__}
    if device == "cuda":
        import triton

        p = torch.cuda.get_device_properties(0)
        env.update(triton=triton.__version__, sms=p.multi_processor_count, l2=p.L2_cache_size)
    print("env:", json.dumps(env), flush=True)

    by_key: dict = {}
    for i, (case, n, template, params) in enumerate(V):
        by_key.setdefault((case, n), []).append((i, template, params))
    t0 = time.time()
    status = compile_all(by_key, cfg, args.workers if device == "cuda" else 0)
    print(f"phase A (compile + check, {args.workers} workers): {time.time() - t0:.1f} s; "
          f"{sum(1 for s in status.values() if s[0] == 'ok')}/{len(V)} ok", flush=True)
    for i, (st, msg, sec) in sorted(status.items()):
        if st != "ok":
            print(f"  variant {i} {V[i][:3]} {V[i][3]}: {st}: {msg[:300]}", flush=True)

    if args.wait_pid:
        waited = time.time()
        while time.time() - waited < args.wait_max and _alive(args.wait_pid):
            time.sleep(0.5)
        print(f"waited {time.time() - waited:.1f} s for pid {args.wait_pid} "
              f"({'still running: timings may overlap it' if _alive(args.wait_pid) else 'done'})", flush=True)

    rows: list[dict] = []
    out_path = Path(args.out)
    mats: dict = {}
    stopped = False
    for (case, n), items in by_key.items():
        if time.time() - t_start > args.budget:
            stopped = True
            break
        if case not in mats:
            mats.clear()
            mats[case] = builders(cfg)[case]()
        inputs = Inputs(mats[case], n, args.dtype, device)
        base = {}
        if device == "cuda":
            base = time_dense(inputs, args.repeats)
            if case.startswith("dlmc"):
                try:
                    base["cusparse_us"] = time_cusparse(inputs, args.repeats)
                except Exception as exc:  # noqa: BLE001
                    base["cusparse_error"] = str(exc)[:200]
        for i, template, params in items:
            if time.time() - t_start > args.budget:
                stopped = True
                break
            row = {"case": case, "n": n, "template": template, "params": params,
                   "shape": list(inputs.matrix.shape), "nnz": int(inputs.matrix.nnz), **base}
            st = status.get(i, ("error", "not compiled", 0.0))
            if st[0] != "ok":
                row.update(status=f"phaseA_{st[0]}", message=st[1])
            else:
                try:
                    source, digest = candidate_source(template, params, old)
                    module = load_module(source, digest, cache)
                    if device == "cuda":
                        row.update(time_variant(module, inputs, args.repeats))
                    else:
                        _, conv, err = run_once(module, inputs)
                        row.update(status="wrong" if err else "ok", message=err or "", conversion_ms=conv)
                except Exception as exc:  # noqa: BLE001
                    row.update(status="error", message=f"{type(exc).__name__}: {str(exc)[:300]}")
                    traceback.print_exc()
            rows.append(row)
            print("row:", json.dumps({k: row.get(k) for k in ("case", "n", "template", "params", "status",
                                                              "graph_us", "eager_us", "host_us", "dense_graph_us",
                                                              "conversion_ms")}), flush=True)
            out_path.write_text(json.dumps({"env": env, "rows": rows}, indent=1, default=str))
        del inputs
        if stopped:
            break
    if stopped:
        print(f"budget of {args.budget:.0f} s reached: {len(rows)} of {len(V)} variants timed", flush=True)
    harness = []
    if args.harness and device == "cuda":
        harness = harness_checks(cfg, t_start + args.harness_until)
    out_path.write_text(json.dumps({"env": env, "rows": rows, "harness": harness}, indent=1, default=str))
    print_table(rows)
    print(f"total {time.time() - t_start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
