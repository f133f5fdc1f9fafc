"""Block-sparse (BSR) SpMV / skinny SpMM in CUDA C++ through CuPy, for block-pruned weights at decode N.

Why this template exists: a block-pruned weight keeps one index per BS x BS values, so at N <= 8 a
kernel can read it at close to the bytes of its values, where the tensor-core BSR kernel computes
16 columns whatever N is and the per-nonzero kernels pay an index per value. On the H200 (session
39's llm suite, fp16, 4096x4096 block-32 75% at N = 1) bsr_tc took 16.4 us against cuBLAS's 16.0 and
delta_spmv 22.4 us for 8.4 MB of values, a read of ~3 us at the copy bandwidth.

`prepare` stores the weight as BS x BS blocks (BS "auto": 32 unless 16 stores fewer values), block
rows in order, and compiles one kernel per NN. A CTA owns a block row and NN columns of C; its WARPS
warps split the block row's blocks, UNROLL in flight per warp; each warp stages its block's rows of
B in shared memory and its lanes multiply 16-byte vectors of the block into fp32 sums, summed across
lanes by shuffles and across warps in warp order through shared memory (bsr_spmv.cu): no atomics,
the same bits on every call. Any N runs (grid.y walks strips of NN columns); NN "auto" is the
smallest of 1, 2, 4, 8 covering N, so N > 8 takes several strips (meant for N <= 8).
"""
META = {
    "name": "bsr_spmv",
    "backend": "cuda",
    "format": "bsr",
    "description": "CUDA C++ block-sparse SpMV for skinny N: a CTA per block row, warps over its blocks, "
                   "B's slice staged in shared memory, 16-byte block loads, warp-ordered sums",
    "params": {
        "BS": ["auto", 16, 32],
        "NN": ["auto", 1, 2, 4, 8],
        "WARPS": [4, 8, 16],
        "UNROLL": [1, 2],
    },
    "defaults": {"BS": "auto", "NN": "auto", "WARPS": 8, "UNROLL": 2},
    "patterns": ["block"],
    "cuda_source": "bsr_spmv.cu",
    "dtypes": ["float16", "bfloat16"],
}
PARAMS = dict(META["defaults"])

CUDA_SRC = r"""@SPARSEDITTO_INLINE dtypes.cuh bsr_spmv.cu@"""

import numpy as np
import torch

from sparseditto.formats import BSR, occupied_blocks
from sparseditto.kernel_templates import runtime as rt

_BLOCK_SIZES = (16, 32)
_NNS = (1, 2, 4, 8)


def stored_values(A, bs: int) -> int:
    """Values (kept and padding zeros) BS x BS blocks store for A: the count of occupied blocks."""
    return int(occupied_blocks(A, (bs, bs))[0].size) * bs * bs


AUTO_SLACK = 1.15   # BS "auto": 16 only where 32 would store 15% more values (kernel_templates.cuda.planning too)


def block_size(A) -> int:
    """PARAMS' BS, "auto" resolved: 32 (one index per 1024 values, 8-row lane groups) unless 16
    stores AUTO_SLACK times fewer values (not just the padding of a last partial block row)."""
    bs = PARAMS["BS"]
    if bs != "auto":
        return int(bs)
    return 16 if stored_values(A, 16) * AUTO_SLACK < stored_values(A, 32) else 32


def nn_for(n: int) -> int:
    """The columns of C a CTA covers: PARAMS' NN, or the smallest of 1, 2, 4, 8 covering N."""
    nn = PARAMS["NN"]
    if nn != "auto":
        return int(nn)
    return next(v for v in _NNS if v >= min(n, 8))


def kernel_name(dtype, bs: int, nn: int) -> str:
    tag = rt.CUDA_VALUE_TAGS[rt.torch_dtype(dtype)]
    return f"bsr_spmv<{tag}, {bs}, {nn}, {int(PARAMS['WARPS'])}, {int(PARAMS['UNROLL'])}>"


def reachable_kernels(dtype, bs: int) -> tuple:
    """Every kernel plan_launch can pick for this dtype and block size (one compile)."""
    nns = _NNS if PARAMS["NN"] == "auto" else (int(PARAMS["NN"]),)
    return tuple(kernel_name(dtype, bs, nn) for nn in nns)


def prepare(A, dtype, device) -> dict:
    """The weight's BS x BS blocks, block-row pointers and block-column ids on `device` (values in
    `dtype`), and (on a GPU) the kernels."""
    rt.check_params(META, PARAMS)
    dtype = rt.cuda_value_dtype(dtype, "bsr_spmv")
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"bsr_spmv takes float16 or bfloat16 values, got {dtype}.")
    device = torch.device(device)
    bs = block_size(A)
    bsr = BSR.from_matrix(A, block_shape=(bs, bs))
    kernels = rt.compile_cuda(CUDA_SRC, reachable_kernels(dtype, bs), device, "bsr_spmv") if device.type == "cuda" else {}
    return {"blocks": torch.from_numpy(np.ascontiguousarray(bsr.blocks)).to(device=device, dtype=dtype),
            "brow_ptr": torch.from_numpy(bsr.indptr.astype(np.int32)).to(device),
            "bcol": torch.from_numpy(bsr.indices.astype(np.int32)).to(device),
            "block_rows": int(bsr.indptr.shape[0] - 1), "nblocks": bsr.nblocks, "bs": bs,
            "shape": tuple(A.shape), "kernels": kernels, "scratch": {}}


def plan_launch(packed: dict, N: int, dtype) -> dict:
    """Kernel name, grid and block for one call (pure Python)."""
    nn = nn_for(N)
    grid = (packed["block_rows"], -(-N // nn), 1)
    if grid[1] > 65535:
        raise ValueError(f"N = {N} needs {grid[1]} column strips of NN = {nn}, more than CUDA's grid.y limit of "
                         "65535; use a wider NN.")
    return {"name": kernel_name(dtype, packed["bs"], nn), "grid": grid, "block": (int(PARAMS["WARPS"]) * 32, 1, 1),
            "nn": nn}


def spmm(packed: dict, B, out) -> None:
    """out[M, N] = A @ B (B [K, N] on the GPU, any strides), fp32 accumulation, out in B's dtype."""
    M, K = packed["shape"]
    N, b, target = rt.cuda_operands(packed, B, out, packed["blocks"].dtype, "bsr_spmv")
    if N == 0 or M == 0:
        return
    key = (N, b.dtype, b.device, b.stride(0), target.stride(0))
    rt.launch_cuda(packed, key, lambda: _make_plan(packed, N, b, target), b, target, out)


def _make_plan(packed: dict, N: int, b, target) -> dict:
    """plan_launch plus the kernel and its fixed arguments (runtime.launch_cuda's plan)."""
    plan = plan_launch(packed, N, b.dtype)
    M, K = packed["shape"]
    ptr = lambda t: np.uint64(t.data_ptr())  # noqa: E731
    plan["kernel"] = packed["kernels"][plan["name"]]
    plan["head"] = (ptr(packed["brow_ptr"]), ptr(packed["bcol"]), ptr(packed["blocks"]), np.int32(M), np.int32(K))
    plan["tail"] = (np.int32(N), np.int64(b.stride(0)), np.int64(target.stride(0)))
    return plan
