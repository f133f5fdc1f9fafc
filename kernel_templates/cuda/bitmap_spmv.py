"""Row-bitmap SpMV / skinny SpMM in CUDA C++ through CuPy: the decode kernel (N <= 8) for 30-90%
unstructured sparsity.

Why this template exists: at N = 1..8 a pruned weight's SpMM is a pure stream of A, and its time is
A's bytes over the bandwidth. A bitmap (one bit per element, a mask word per 32 columns) plus the
kept values is the smallest exact format between ~25% and ~90% sparsity (1.125 bytes per element at
50% in fp16, against 2 for the dense weight cuBLAS reads at ~60% of the copy bandwidth), and at
these N the tensor-core bitmap (tc_bitmap) spends its time expanding values into MMA fragments,
which only pays once N fills an n8 tile many times over. Measured on the H200 it does not pay off
either: ~25 instructions per 32-element step make it instruction-bound at 0.63-0.85x of cuBLAS at
N = 1 (docs/kernels.md), and its planning module's measured floor keeps the planner from spending a
candidate on it until a per-nonzero version exists. Each
warp owns ROWS rows; per 32-column word, lane l owns column 32w + l, finds its value at
base + popc(word & below(l)), so every load instruction of a warp is one or two 128-byte lines; a CTA
of SPLIT warps shares ROWS rows, each warp taking every SPLIT-th span of 1024 columns, and a batch of
steps' loads is in flight at once (bitmap_spmv.cu says more). The format is
``sparseditto.formats.BitmapTiles(tile_k=32)`` with one offset per row and span instead of per word
(the kernel derives the rest by a warp scan of popcounts) and a trailing zero value.

prepare() compiles every kernel an N can launch (NV in {1, 2, 4, 8} for NV="auto") through
runtime.compile_cuda and keeps the handles in the packed dict; spmm() is one launch on torch's current
stream, its launch plan cached per (N, layout of B and C) under packed["scratch"].
"""
META = {
    "name": "bitmap_spmv",
    "backend": "cuda",
    "format": "bitmap",
    "description": "CUDA C++ row-bitmap SpMV/SpMM for decode N <= 8: a mask word per 32 columns, popcount offsets, warp per ROWS rows",
    "params": {
        "NV": ["auto", 1, 2, 4, 8],
        "ROWS": [1, 2],
        "SPLIT": [1, 2, 4, 8],
    },
    # H200 sweep (llm_layers --preset decode): ROWS=2 is 8-15% faster than ROWS=1 on every shape
    "defaults": {"NV": "auto", "ROWS": 2, "SPLIT": 4},
    "grid": [{}, {"ROWS": 1}, {"SPLIT": 8}, {"SPLIT": 2}],
    "patterns": ["unstructured", "nm", "block", "row_pruned", "column_pruned", "banded"],
    "cuda_source": "bitmap_spmv.cu",
}
PARAMS = dict(META["defaults"])

CUDA_SRC = r"""@SPARSEDITTO_INLINE dtypes.cuh bitmap_spmv.cu@"""

import numpy as np
import torch

from sparseditto.formats import BitmapTiles
from sparseditto.kernel_templates import runtime as rt

_NV_CHOICES = (1, 2, 4, 8)
WORD_COLUMNS = 32
SPAN_WORDS = 32          # a warp's unit of work: 32 mask words = 1024 columns


def nv_for(n: int) -> int:
    """Columns of B per launch column block: PARAMS["NV"], or the smallest power of two covering N
    (at most 8: wider N runs as several column blocks)."""
    if PARAMS["NV"] != "auto":
        return int(PARAMS["NV"])
    return min(rt.next_pow2(max(1, n)), _NV_CHOICES[-1])


def reachable_kernels(dtype) -> tuple:
    """Every kernel name expression plan_launch can pick for this dtype under PARAMS."""
    tag = rt.CUDA_VALUE_TAGS[rt.torch_dtype(dtype)]
    nvs = _NV_CHOICES if PARAMS["NV"] == "auto" else (int(PARAMS["NV"]),)
    return tuple(f"bitmap_spmv<{tag}, {nv}, {int(PARAMS['ROWS'])}, {int(PARAMS['SPLIT'])}>" for nv in nvs)


def pack(A) -> dict:
    """The arrays the kernel reads, as numpy: int32 masks [M, W] (W = ceil(K/32)), int32
    span_offsets [M, S] (S = ceil(W/32): where each 1024-column span's values start) and the values
    with one trailing zero (what a lane whose bit is clear reads)."""
    fmt = BitmapTiles.from_matrix(A, tile_k=WORD_COLUMNS)
    return {"masks": fmt.masks, "span_offsets": np.ascontiguousarray(fmt.tile_offsets[:, ::SPAN_WORDS]),
            "values": np.concatenate([fmt.values, np.zeros(1, dtype=fmt.values.dtype)]), "nnz": fmt.nnz}


def prepare(A, dtype, device) -> dict:
    """The row bitmap (see `pack`) on `device`, and on a GPU the compiled kernels."""
    rt.check_params(META, PARAMS)
    dtype = rt.cuda_value_dtype(dtype, "bitmap_spmv")
    device = torch.device(device)
    arrays = pack(A)
    tensors = {name: torch.from_numpy(arrays[name]).to(device) for name in ("masks", "span_offsets")}
    tensors["values"] = torch.from_numpy(arrays["values"]).to(device=device, dtype=dtype)
    kernels = rt.compile_cuda(CUDA_SRC, reachable_kernels(dtype), device, "bitmap_spmv") if device.type == "cuda" else {}
    words, spans = arrays["masks"].shape[1], arrays["span_offsets"].shape[1]
    return {**tensors, "shape": tuple(A.shape), "words": int(words), "spans": int(spans), "nnz": arrays["nnz"],
            "kernels": kernels, "scratch": {}}


def plan_launch(packed: dict, N: int, dtype, b_ptr: int, ldb: int) -> dict:
    """Kernel name, grid, block and the vector-load flag for one call (pure Python)."""
    dtype = rt.torch_dtype(dtype)
    esize = rt.element_size(dtype)
    M = packed["shape"][0]
    nv, rows, split = nv_for(N), int(PARAMS["ROWS"]), int(PARAMS["SPLIT"])
    grid = (-(-M // rows), -(-N // nv), 1)
    if grid[1] > 65535:
        raise ValueError(f"N = {N} needs {grid[1]} column blocks of NV = {nv}, more than CUDA's grid.y limit "
                         "of 65535; bitmap_spmv is a decode kernel (N <= 8), use a tensor-core template.")
    vec_ok = int(rt.vectors_fit(b_ptr, ldb, nv, esize))
    return {"name": f"bitmap_spmv<{rt.CUDA_VALUE_TAGS[dtype]}, {nv}, {rows}, {split}>", "grid": grid,
            "block": (split * 32, 1, 1), "vec_ok": vec_ok, "nv": nv}


def spmm(packed: dict, B, out) -> None:
    """out[M, N] = A @ B (B [K, N] on the GPU, any strides), fp32 accumulation, out in B's dtype."""
    M = packed["shape"][0]
    N, b, target = rt.cuda_operands(packed, B, out, packed["values"].dtype, "bitmap_spmv")
    if N == 0 or M == 0:
        return
    key = (N, b.dtype, b.device, b.stride(0), target.stride(0), b.data_ptr() % 64)  # vec_ok: <= 32-byte vectors

    def make_plan() -> dict:
        plan = plan_launch(packed, N, b.dtype, b.data_ptr(), b.stride(0))
        plan["kernel"] = packed["kernels"][plan["name"]]
        plan["head"] = (np.uint64(packed["masks"].data_ptr()), np.uint64(packed["span_offsets"].data_ptr()),
                        np.uint64(packed["values"].data_ptr()))
        plan["tail"] = (np.int32(M), np.int32(packed["shape"][1]), np.int32(packed["words"]),
                        np.int32(packed["spans"]), np.int32(packed["nnz"]), np.int32(N), np.int64(b.stride(0)),
                        np.int64(target.stride(0)), np.int32(plan["vec_ok"]))
        return plan

    rt.launch_cuda(packed, key, make_plan, b, target, out)
