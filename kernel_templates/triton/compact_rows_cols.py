"""Row/column compaction: drop A's empty rows and columns, run a dense tensor-core GEMM on the rest.

Why this template exists: structured (channel / neuron / head) pruning removes whole rows or
columns of a weight. What remains is a smaller, (nearly) dense matrix, and a dense tiled `tl.dot`
on it beats any sparse format: no index per nonzero, tensor cores instead of CUDA cores, and the
bytes of A shrink to kept_rows x kept_cols values.

Layout of the work, one launch:
  * Programs [0, kept_tiles) compute C[kept_rows[m-tile], n-tile] = dense[m-tile, :] @ B[kept_cols, n-tile]
    with BLOCK_M x BLOCK_N x BLOCK_K tiles; the rows of B are gathered through kept_cols.
  * Programs [kept_tiles, kept_tiles + dropped_tiles) write zeros to the dropped rows of C, so
    every element of C is written (the verifier pre-fills C with NaN).
The dense block is padded in prepare() to multiples of BLOCK_M and BLOCK_K (zeros, and column id 0
for padded k, which is a real row of B multiplied by zero), so the A-tile loads need no mask.
fp32 inputs use exact fp32 products unless ALLOW_TF32=True (tf32 is ~1e-3 relative error).
"""
META = {
    "name": "compact_rows_cols",
    "backend": "triton",
    "format": "compact",
    "description": "Drop empty rows/cols, dense tl.dot GEMM on the kept submatrix with gathered B rows, zero the dropped C rows",
    "params": {
        "BLOCK_M": [16, 32, 64, 128],
        "BLOCK_N": ["auto", 16, 32, 64, 128, 256],
        "BLOCK_K": [16, 32, 64, 128],
        "ALLOW_TF32": [False, True],
        "num_warps": [1, 2, 4, 8],
        "num_stages": [1, 2, 3, 4, 5],
    },
    "defaults": {
        "BLOCK_M": 64,
        "BLOCK_N": "auto",
        "BLOCK_K": 64,
        "ALLOW_TF32": False,
        "num_warps": 4,
        "num_stages": 3,
    },
    "patterns": ["row_pruned", "column_pruned", "dense"],
}
PARAMS = dict(META["defaults"])

import numpy as np
import torch
import triton
import triton.language as tl

from sparseditto.formats import Compacted


@triton.jit
def _compact_gemm_kernel(
    dense_ptr, rows_ptr, cols_ptr, dropped_ptr, b_ptr, out_ptr,
    kept_m, kept_k_padded, dropped_m, N, kept_tiles,
    stride_dm, stride_bk, stride_bn, stride_om, stride_on,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ALLOW_TF32: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    lanes_m = tl.arange(0, BLOCK_M)
    if pid_m < kept_tiles:
        offs_m = pid_m * BLOCK_M + lanes_m
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = dense_ptr + offs_m[:, None].to(tl.int64) * stride_dm + offs_k[None, :]
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, kept_k_padded, BLOCK_K):
            a = tl.load(a_ptrs)
            src = tl.load(cols_ptr + k0 + offs_k).to(tl.int64)
            b = tl.load(b_ptr + src[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                        mask=n_mask[None, :], other=0.0)
            if DOT_IN_FP32:
                acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
            elif ALLOW_TF32:
                acc = tl.dot(a, b.to(a.dtype), acc, input_precision="tf32")
            else:
                acc = tl.dot(a, b.to(a.dtype), acc, input_precision="ieee")
            a_ptrs += BLOCK_K
        m_mask = offs_m < kept_m
        dst = tl.load(rows_ptr + offs_m, mask=m_mask, other=0).to(tl.int64)
        tl.store(out_ptr + dst[:, None] * stride_om + offs_n[None, :] * stride_on,
                 acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])
    else:
        offs_m = (pid_m - kept_tiles) * BLOCK_M + lanes_m
        m_mask = offs_m < dropped_m
        dst = tl.load(dropped_ptr + offs_m, mask=m_mask, other=0).to(tl.int64)
        zeros = tl.zeros([BLOCK_M, BLOCK_N], dtype=out_ptr.dtype.element_ty)
        tl.store(out_ptr + dst[:, None] * stride_om + offs_n[None, :] * stride_on,
                 zeros, mask=m_mask[:, None] & n_mask[None, :])


def _torch_dtype(dtype):
    if isinstance(dtype, torch.dtype):
        return dtype
    named = {"float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
             "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float32": torch.float32, "fp32": torch.float32, "float": torch.float32}
    if dtype not in named:
        raise ValueError(f"Unsupported value dtype {dtype!r}; expected float16, bfloat16 or float32.")
    return named[dtype]


def _next_pow2(x: int) -> int:
    return 1 if x <= 1 else 1 << (int(x) - 1).bit_length()


def prepare(A, dtype, device) -> dict:
    """Kept rows/cols (formats.Compacted), the dense block padded to whole tiles, the dropped rows."""
    dtype = _torch_dtype(dtype)
    M, K = A.shape
    comp = Compacted.from_matrix(A)
    bm, bk = int(PARAMS["BLOCK_M"]), int(PARAMS["BLOCK_K"])
    kept_m, kept_k = comp.dense.shape
    pad_m = -(-kept_m // bm) * bm
    pad_k = -(-kept_k // bk) * bk
    dense = np.zeros((pad_m, pad_k), dtype=np.float32)
    dense[:kept_m, :kept_k] = comp.dense
    cols = np.zeros(pad_k, dtype=np.int32)
    cols[:kept_k] = comp.cols
    keep = np.zeros(M, dtype=bool)
    keep[comp.rows] = True
    dropped = np.flatnonzero(~keep).astype(np.int32)

    def dev(a, dt=None):
        t = torch.from_numpy(np.ascontiguousarray(a)).to(device)
        return t.to(dt) if dt is not None else t

    return {
        "dense": dev(dense, dtype),
        # A zero-length tensor has no valid pointer for the kernel: keep at least one id (unused).
        "rows": dev(comp.rows.astype(np.int32) if kept_m else np.zeros(1, dtype=np.int32)),
        "cols": dev(cols if pad_k else np.zeros(1, dtype=np.int32)),
        "dropped": dev(dropped if dropped.size else np.zeros(1, dtype=np.int32)),
        "kept_m": kept_m,
        "kept_k_padded": pad_k,
        "dropped_m": int(dropped.size),
        "shape": (M, K),
    }


def spmm(packed: dict, B, out) -> None:
    """out[M, N] = A @ B with B [K, N] (any strides), fp32 accumulation, out in B's dtype."""
    M, K = packed["shape"]
    if B.dim() != 2 or B.shape[0] != K:
        raise ValueError(f"Expected B of shape ({K}, N), got {tuple(B.shape)}.")
    N = B.shape[1]
    if tuple(out.shape) != (M, N):
        raise ValueError(f"Expected out of shape ({M}, {N}), got {tuple(out.shape)}.")
    if N == 0:
        return
    bm, bk = int(PARAMS["BLOCK_M"]), int(PARAMS["BLOCK_K"])
    block_n = PARAMS["BLOCK_N"]
    if block_n == "auto":
        block_n = max(16, min(_next_pow2(N), 128))  # tl.dot needs tiles of at least 16
    kept_tiles = triton.cdiv(packed["kept_m"], bm)
    grid = (kept_tiles + triton.cdiv(packed["dropped_m"], bm), triton.cdiv(N, block_n))
    _compact_gemm_kernel[grid](
        packed["dense"], packed["rows"], packed["cols"], packed["dropped"], B, out,
        packed["kept_m"], packed["kept_k_padded"], packed["dropped_m"], N, kept_tiles,
        packed["dense"].stride(0), B.stride(0), B.stride(1), out.stride(0), out.stride(1),
        BLOCK_M=bm, BLOCK_N=block_n, BLOCK_K=bk, ALLOW_TF32=bool(PARAMS["ALLOW_TF32"]),
        # Triton's CPU interpreter (the only way a CPU tensor reaches a Triton kernel) multiplies
        # bf16 dot operands as raw uint16 bits (triton 3.6); upcast there. Never taken on a GPU.
        DOT_IN_FP32=B.device.type == "cpu" and B.dtype == torch.bfloat16,
        num_warps=int(PARAMS["num_warps"]), num_stages=int(PARAMS["num_stages"]),
    )
