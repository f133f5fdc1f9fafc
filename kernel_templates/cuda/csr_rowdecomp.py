"""Row-decomposed CSR SpMM in CUDA C++ through CuPy, for graphs and scientific matrices (N >= 8).

Why this template exists: on a power-law graph one warp per row waits on the hub rows, and the
Triton CSR kernels pay a dependent load round trip per nonzero chunk; on the H200 both ran behind
torch's cuSPARSE on the R-MAT case of issue 11. Here `prepare` cuts the rows into work items of at
most CHUNK nonzeros (sparseditto.row_items: a short row is one item, a hub row several) and orders
them (ORDER "length": longest first, so hub pieces start early and the groups of a warp have similar
work; "row": neighbouring rows, which on a mesh share columns of B, run together). A group of LANES
lanes owns an item and LANES * VEC columns of N: it loads LANES (column, value) pairs at once, then
broadcasts each with a shuffle while every lane loads its VEC columns of that B row as one vector;
UNROLL rows are in flight per lane. ITEMS > 1 launches ITEMS times fewer groups, each walking several
items as a pipeline that loads the next item's (column, value) pairs and the header after it before
this item's B rows: one dependent round trip per item instead of three (csr_rowdecomp.cu). WALK: the
groups of the grid interleave over all items ("grid": long and short items mixed, for the longest-first
order) or each block owns a run of neighbouring items ("block": rows sharing B rows on one SM, for the
row order); "auto" follows ORDER. Rows cut into several items write fp32 partial rows to a workspace,
and a second small launch sums them in nonzero order: deterministic, no atomics.
ORDER "auto" picks "length" when the row lengths are skewed (coefficient of variation > 1).

prepare() builds the items, moves them and the CSR arrays to the device and compiles every kernel
this PARAMS can launch for the dtype; spmm() is one launch (two when a row was split) on torch's
current stream, the plans and the partial-row workspace made once per (N, layout of B and C).
"""
META = {
    "name": "csr_rowdecomp",
    "backend": "cuda",
    "format": "csr",
    "description": "CUDA C++ row-decomposed CSR SpMM: rows cut into items of <= CHUNK nonzeros (longest first), "
                   "a lane group per item with shuffled broadcasts and vector B loads, split rows summed in order",
    "params": {
        "CHUNK": ["auto", 16, 32, 64, 128, 256, 512, 1024],
        "ORDER": ["auto", "length", "row"],
        "LANES": ["auto", 1, 2, 4, 8, 16, 32],
        "VEC": ["auto", 1, 2, 4, 8],
        "UNROLL": [2, 4, 8],
        "WARPS_PER_BLOCK": [2, 4, 8],
        "ITEMS": [1, 2, 4, 8, 16],
        "WALK": ["auto", "grid", "block"],
    },
    "defaults": {"CHUNK": "auto", "ORDER": "auto", "LANES": "auto", "VEC": "auto", "UNROLL": 4,
                 "WARPS_PER_BLOCK": 4, "ITEMS": 1, "WALK": "auto"},
    "patterns": ["power_law", "banded", "unstructured"],
    "cuda_source": "csr_rowdecomp.cu",
}
PARAMS = dict(META["defaults"])

CUDA_SRC = r"""@SPARSEDITTO_INLINE dtypes.cuh csr_rowdecomp.cu@"""

import numpy as np
import torch

from sparseditto.formats import CSR
from sparseditto.kernel_templates import runtime as rt
from sparseditto.row_items import RowItems, auto_chunk

_VECS = (1, 2, 4, 8)
SKEWED_CV = 1.0          # ORDER "auto": longest first above this coefficient of variation of row lengths
PARTIAL_ALIGN = 8        # floats between partial rows: a multiple of the widest VEC


def vec_lanes(n: int, dtype) -> tuple[int, int]:
    """(VEC, LANES) for N columns: PARAMS, or the widest vector (16 bytes; two for N > 32 such
    vectors) and the fewest lanes that cover N in one strip, so that short rows share a warp."""
    esize = rt.element_size(dtype)
    vec = PARAMS["VEC"]
    if vec == "auto":
        per16 = 16 // esize
        vec = min(8, 2 * per16) if n > 32 * per16 else per16
    vec = int(vec)
    lanes = PARAMS["LANES"]
    lanes = min(32, rt.next_pow2(-(-max(1, n) // vec))) if lanes == "auto" else int(lanes)
    return vec, lanes


def item_layout(indptr: np.ndarray, shape: tuple[int, int]) -> RowItems:
    """The work items for PARAMS' CHUNK and ORDER (resolving "auto" from the row lengths)."""
    lengths = np.diff(indptr.astype(np.int64))
    mean = float(lengths.mean()) if lengths.size else 0.0
    chunk = auto_chunk(mean) if PARAMS["CHUNK"] == "auto" else int(PARAMS["CHUNK"])
    order = PARAMS["ORDER"]
    if order == "auto":
        cv = float(lengths.std() / mean) if mean > 0 else 0.0
        order = "length" if cv > SKEWED_CV else "row"
    return RowItems.from_indptr(indptr, shape, chunk, order)


def reachable_kernels(dtype) -> tuple:
    """Every kernel name expression plan_launch can pick for this dtype under PARAMS (one compile)."""
    tag = rt.CUDA_VALUE_TAGS[rt.torch_dtype(dtype)]
    vecs = _VECS if PARAMS["VEC"] == "auto" else (int(PARAMS["VEC"]),)
    lanes = (1, 2, 4, 8, 16, 32) if PARAMS["LANES"] == "auto" else (int(PARAMS["LANES"]),)
    unroll = int(PARAMS["UNROLL"])
    names = {f"{_items_kernel()}<{tag}, {v}, {l}, {unroll}>" for v in vecs for l in lanes}
    names.update(f"csr_rowdecomp_fixup<{tag}, {v}>" for v in vecs)
    return tuple(sorted(names))


def _items_kernel() -> str:
    """One item per group (ITEMS 1), or the pipelined walk over several."""
    return "csr_rowdecomp_items" if int(PARAMS["ITEMS"]) == 1 else "csr_rowdecomp_stream"


def prepare(A, dtype, device) -> dict:
    """int32 CSR and its work items on `device` (values in `dtype`), and (on a GPU) the kernels."""
    rt.check_params(META, PARAMS)
    dtype = rt.cuda_value_dtype(dtype, "csr_rowdecomp")
    device = torch.device(device)
    csr = CSR.from_matrix(A, index_dtype="int32")
    layout = item_layout(csr.indptr, tuple(A.shape))
    tensors = csr.to_torch(device=device, dtype=dtype)
    kernels = rt.compile_cuda(CUDA_SRC, reachable_kernels(dtype), device, "csr_rowdecomp") if device.type == "cuda" else {}
    return {"indices": tensors["indices"], "values": tensors["values"],
            "items": torch.from_numpy(layout.items).to(device), "fix_rows": torch.from_numpy(layout.fix_rows).to(device),
            "fix_ptr": torch.from_numpy(layout.fix_ptr).to(device), "n_items": layout.n_items,
            "n_fix": int(layout.fix_rows.shape[0]), "n_slots": layout.n_slots, "chunk": layout.chunk,
            "order": layout.order, "shape": tuple(A.shape), "nnz": csr.nnz, "kernels": kernels, "scratch": {}}


def plan_launch(packed: dict, N: int, dtype, b_ptr: int, ldb: int, c_ptr: int, ldc: int) -> dict:
    """Kernel names, grids and the vector flags for one call (pure Python)."""
    dtype = rt.torch_dtype(dtype)
    tag = rt.CUDA_VALUE_TAGS[dtype]
    esize = rt.element_size(dtype)
    vec, lanes = vec_lanes(N, dtype)
    warps = int(PARAMS["WARPS_PER_BLOCK"])
    groups_per_block = warps * 32 // lanes
    items_per_block = groups_per_block * int(PARAMS["ITEMS"])
    grid = (-(-packed["n_items"] // items_per_block), -(-N // (lanes * vec)), 1)
    if grid[1] > 65535:
        raise ValueError(f"N = {N} needs {grid[1]} column strips of LANES x VEC = {lanes * vec}, more than CUDA's "
                         "grid.y limit of 65535; use a wider LANES or VEC.")
    walk = PARAMS["WALK"]
    if walk == "auto":
        walk = "block" if packed["order"] == "row" else "grid"
    block_items = items_per_block if walk == "block" and int(PARAMS["ITEMS"]) > 1 else 0
    vec_ok = int(rt.vectors_fit(b_ptr, ldb, vec, esize)) | 2 * int(rt.vectors_fit(c_ptr, ldc, vec, esize))
    fix_grid = (-(-packed["n_fix"] // warps), -(-N // (32 * vec)), 1)
    return {"name": f"{_items_kernel()}<{tag}, {vec}, {lanes}, {int(PARAMS['UNROLL'])}>", "grid": grid,
            "block": (warps * 32, 1, 1), "vec_ok": vec_ok, "vec": vec, "lanes": lanes, "items": int(PARAMS["ITEMS"]),
            "block_items": block_items,
            "fix_name": f"csr_rowdecomp_fixup<{tag}, {vec}>" if packed["n_fix"] else None, "fix_grid": fix_grid,
            "pstride": -(-N // PARTIAL_ALIGN) * PARTIAL_ALIGN}


def spmm(packed: dict, B, out) -> None:
    """out[M, N] = A @ B (B [K, N] on the GPU, any strides), fp32 accumulation, out in B's dtype."""
    M = packed["shape"][0]
    N, b, target = rt.cuda_operands(packed, B, out, packed["values"].dtype, "csr_rowdecomp")
    if N == 0 or M == 0:
        return
    key = (N, b.dtype, b.device, b.stride(0), target.stride(0), b.data_ptr() % 64, target.data_ptr() % 64)
    rt.launch_cuda(packed, key, lambda: _make_plan(packed, N, b, target), b, target, out)


def _make_plan(packed: dict, N: int, b, target) -> dict:
    """plan_launch plus the kernels and their fixed arguments (numpy scalars built once, runtime.launch_cuda's
    plan) and the workspace of split rows' partial sums, made once per plan and reused by every call
    (the fixup launch follows the items launch on the same stream)."""
    plan = plan_launch(packed, N, b.dtype, b.data_ptr(), b.stride(0), target.data_ptr(), target.stride(0))
    plan["partials"] = torch.empty((max(1, packed["n_slots"]), plan["pstride"]), dtype=torch.float32, device=b.device)
    ptr = lambda t: np.uint64(t.data_ptr())  # noqa: E731
    partials, pstride = ptr(plan["partials"]), np.int32(plan["pstride"])
    ldc, vec_ok = np.int64(target.stride(0)), np.int32(plan["vec_ok"])
    plan["kernel"] = packed["kernels"][plan["name"]]
    # the stream kernel takes block_items after n_items (csr_rowdecomp.cu)
    walk = (np.int32(plan["block_items"]),) if plan["items"] > 1 else ()
    plan["head"] = (ptr(packed["items"]), np.int32(packed["n_items"]), *walk, ptr(packed["indices"]),
                    ptr(packed["values"]), partials, pstride)
    plan["tail"] = (np.int32(N), np.int64(b.stride(0)), ldc, vec_ok)
    if plan["fix_name"]:
        plan["then"] = [{"kernel": packed["kernels"][plan["fix_name"]], "grid": plan["fix_grid"], "block": plan["block"],
                         "head": (ptr(packed["fix_rows"]), ptr(packed["fix_ptr"]), np.int32(packed["n_fix"]), partials,
                                  pstride),
                         "tail": (np.int32(N), ldc, vec_ok)}]
    return plan
