"""CSR SpMM in CUDA C++ through CuPy: a (sub-)warp per row, fp32 accumulation, fp32/fp16/bf16.

Why this template exists: it is the hand-written CUDA-core baseline the Triton templates are
measured against, and the place to reach for warp-level primitives Triton does not expose
(shuffles for the cross-lane row reduction, explicit vector loads). Two layouts, chosen per call
from N when LAYOUT="auto":
  * "nnz"  (N <= 16: SpMV and decode) GROUP lanes share a row and split its nonzeros; each lane
           keeps TILE_N columns of C in registers (up to 32 bytes of a B row: 16 fp16/bf16 or 8
           fp32 values, loaded as 16-byte vectors), unrolled 4 nonzeros deep so several B rows
           are in flight per lane; a shuffle reduction combines the lanes.
  * "cols" (N > 16) a warp per row, lanes over 32*VEC columns of B; each batch of 32 nonzeros is
           loaded once (coalesced) and broadcast with __shfl_sync; B strips load as 8/16-byte
           vectors when aligned.
The kernels live in csr_vector.cu; the registry inlines that file into CUDA_SRC when it
instantiates this template, so a candidate's source is self-contained. prepare() compiles them
through runtime.compile_cuda (cupy.RawModule: NVRTC, -std=c++17, name_expressions for every
instantiation this PARAMS can reach for the dtype) and keeps the kernel handles in the packed dict, so compilation is part of
the separately timed preparation and spmm() is a single launch on torch's current stream. The
launch plan (kernel, grid, vector flag) and the CuPy view of torch's stream are cached per
(N, B/C layout) and per stream under packed["scratch"], so a repeated call does no planning.
"""
META = {
    "name": "csr_vector",
    "backend": "cuda",
    "format": "csr",
    "description": "CUDA C++ CSR SpMM: sub-warp per row with shuffle reduction (small N) or warp per row with lanes over N (large N)",
    "params": {
        "LAYOUT": ["auto", "nnz", "cols"],
        "GROUP": ["auto", 2, 4, 8, 16, 32],
        "TILE_N": ["auto", 1, 2, 4, 8, 16],
        "VEC": ["auto", 1, 2, 4, 8],
        "WARPS_PER_BLOCK": [1, 2, 4, 8],
    },
    "defaults": {
        "LAYOUT": "auto",
        "GROUP": "auto",
        "TILE_N": "auto",
        "VEC": "auto",
        "WARPS_PER_BLOCK": 4,
    },
    "patterns": ["unstructured", "banded", "power_law"],
    "cuda_source": "csr_vector.cu",
}
PARAMS = dict(META["defaults"])

CUDA_SRC = r"""@SPARSEDITTO_INLINE dtypes.cuh csr_vector.cu@"""

import numpy as np
import torch

from sparseditto.formats import CSR
from sparseditto.kernel_templates import runtime as rt

_NNZ_LAYOUT_MAX_N = 16
_MAX_TILE_BYTES = 32    # a lane's strip of a B row in the "nnz" layout: two 16-byte vectors


def reachable_kernels(dtype, group: int) -> tuple:
    """Every kernel instantiation plan_launch can pick for this dtype and group (one compile)."""
    tag = rt.CUDA_VALUE_TAGS[dtype]
    max_vec = 16 // rt.element_size(dtype)  # one 16-byte vector per lane at most
    names = set()
    if PARAMS["LAYOUT"] in ("auto", "nnz"):
        max_tile = _MAX_TILE_BYTES // rt.element_size(dtype)
        tiles = tuple(t for t in (1, 2, 4, 8, 16) if t <= max_tile) if PARAMS["TILE_N"] == "auto" \
            else (int(PARAMS["TILE_N"]),)
        names.update(f"csr_vector_nnz<{tag}, {group}, {t}>" for t in tiles)
    if PARAMS["LAYOUT"] in ("auto", "cols"):
        vecs = (1, 2, 4, 8) if PARAMS["VEC"] == "auto" else (int(PARAMS["VEC"]),)
        names.update(f"csr_vector_cols<{tag}, {max(1, min(v, max_vec))}>" for v in vecs)
    return tuple(sorted(names))


def prepare(A, dtype, device) -> dict:
    """int32 CSR on `device` (values in `dtype`), the lane-group size, and (on a GPU) the kernels."""
    dtype = rt.cuda_value_dtype(dtype, "csr_vector")
    device = torch.device(device)
    csr = CSR.from_matrix(A, index_dtype="int32")
    tensors = csr.to_torch(device=device, dtype=dtype)
    mean_row = float(csr.nnz) / max(1, A.shape[0])
    group = PARAMS["GROUP"]
    if group == "auto":
        group = max(2, min(32, rt.next_pow2(int(np.ceil(mean_row)))))
    kernels = (rt.compile_cuda(CUDA_SRC, reachable_kernels(dtype, int(group)), device, "csr_vector")
               if device.type == "cuda" else {})
    return {**tensors, "shape": tuple(A.shape), "nnz": csr.nnz, "group": int(group), "kernels": kernels,
            "scratch": {}}


def plan_launch(packed: dict, N: int, dtype, b_ptr: int, ldb: int) -> dict:
    """Kernel name expression, grid, block and the vector-load flag for one call (pure Python)."""
    dtype = rt.torch_dtype(dtype)
    tag = rt.CUDA_VALUE_TAGS[dtype]
    esize = rt.element_size(dtype)
    M = packed["shape"][0]
    warps = int(PARAMS["WARPS_PER_BLOCK"])
    layout = PARAMS["LAYOUT"]
    if layout == "auto":
        layout = "nnz" if N <= _NNZ_LAYOUT_MAX_N else "cols"
    if layout == "nnz":
        group = int(packed["group"])
        tile = PARAMS["TILE_N"]
        tile = min(rt.next_pow2(N), _MAX_TILE_BYTES // esize) if tile == "auto" else int(tile)
        rows_per_block = warps * 32 // group
        grid = (-(-M // rows_per_block), -(-N // tile), 1)
        vec = tile
        name = f"csr_vector_nnz<{tag}, {group}, {tile}>"
    else:
        vec = PARAMS["VEC"]
        vec = rt.next_pow2(-(-N // 32)) if vec == "auto" else int(vec)
        vec = max(1, min(vec, 16 // esize))
        grid = (-(-M // warps), -(-N // (32 * vec)), 1)
        name = f"csr_vector_cols<{tag}, {vec}>"
    if grid[1] > 65535:
        raise ValueError(f"N = {N} needs {grid[1]} column tiles, more than CUDA's grid.y limit of 65535; "
                         "use a wider TILE_N/VEC or LAYOUT='cols'.")
    vec_ok = int(rt.vectors_fit(b_ptr, ldb, vec, esize))
    return {"name": name, "grid": grid, "block": (warps * 32, 1, 1), "vec_ok": vec_ok, "layout": layout}


def spmm(packed: dict, B, out) -> None:
    """out[M, N] = A @ B (B [K, N] on the GPU, any strides), fp32 accumulation, out in B's dtype."""
    M = packed["shape"][0]
    N, b, target = rt.cuda_operands(packed, B, out, packed["values"].dtype, "csr_vector")
    if N == 0:
        return
    key = (N, b.dtype, b.device, b.stride(0), target.stride(0), b.data_ptr() % 64)  # vec_ok: <= 64-byte vectors

    def make_plan() -> dict:
        plan = plan_launch(packed, N, b.dtype, b.data_ptr(), b.stride(0))
        plan["kernel"] = packed["kernels"][plan["name"]]
        plan["head"] = (np.uint64(packed["indptr"].data_ptr()), np.uint64(packed["indices"].data_ptr()),
                        np.uint64(packed["values"].data_ptr()))
        plan["tail"] = (np.int32(M), np.int32(N), np.int64(b.stride(0)), np.int64(target.stride(0)),
                        np.int32(plan["vec_ok"]))
        return plan

    rt.launch_cuda(packed, key, make_plan, b, target, out)
