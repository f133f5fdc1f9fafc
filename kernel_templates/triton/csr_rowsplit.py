"""CSR row-split SpMM: one Triton program per group of rows x one tile of N columns.

Why this template exists: for a pruned weight at N <= ~256 the SpMM is memory-bound and the bytes
of A (values + column ids) dominate, so the kernel must stream A once, with wide loads, and keep
every program busy. Each program walks its rows' nonzeros in chunks of BLOCK_NNZ: one contiguous
load of column ids and one of values per chunk, a gather of the matching rows of B (B is small at
small N and stays in L2), and an fp32 multiply-add reduced over the chunk.

Choices that matter on H100/H200-class GPUs:
  * Aligned chunks: every chunk starts at a multiple of BLOCK_NNZ and the index/value arrays are
    padded (prepare) so chunk loads need no mask; nonzeros outside the row are zeroed after the
    load. Triton can then emit vector loads for A instead of scalar masked loads (Sputnik's
    "reverse offset alignment" idea).
  * 16-bit column ids (INDEX_BITS=16, or "auto" when K <= 32768): 4 instead of 6 bytes per fp16
    nonzero, which moves the break-even against dense from ~67% to ~50% sparsity.
  * Several rows per program (ROWS_PER_PROGRAM) for short rows, so a program does enough work to
    amortize its launch; REORDER="length" sorts rows longest-first so rows grouped in a program
    have similar lengths and long rows start first (row swizzle). The permutation is applied when
    C is written: program slot i computes row order[i] and stores it to row order[i] of C.
Wins for regular (not power-law) rows; for skewed rows csr_balanced splits by nonzeros instead.
"""
META = {
    "name": "csr_rowsplit",
    "backend": "triton",
    "format": "csr",
    "description": "CSR SpMM, a program per row group x N tile; aligned vector loads of A, gathered B rows, fp32 accumulate",
    "params": {
        "BLOCK_N": ["auto", 1, 2, 4, 8, 16, 32, 64, 128, 256],
        "BLOCK_NNZ": ["auto", 8, 16, 32, 64, 128],
        "ROWS_PER_PROGRAM": [1, 2, 4, 8, 16],
        "INDEX_BITS": ["auto", 32, 16],
        "REORDER": ["none", "length"],
        "num_warps": ["auto", 1, 2, 4, 8],
        "num_stages": [1, 2, 3, 4],
    },
    "defaults": {
        "BLOCK_N": "auto",
        "BLOCK_NNZ": "auto",
        "ROWS_PER_PROGRAM": 1,
        "INDEX_BITS": "auto",
        "REORDER": "none",
        "num_warps": "auto",
        "num_stages": 2,
    },
    "patterns": ["unstructured", "banded", "row_pruned", "column_pruned"],
}
PARAMS = dict(META["defaults"])

import numpy as np
import torch
import triton
import triton.language as tl

from sparseditto.formats import CSR
from sparseditto.reorder import row_permutation

# Chunk loads are unmasked, so the index and value arrays are padded to a multiple of the largest
# legal BLOCK_NNZ: an aligned chunk that starts inside the arrays never reads past their end.
_PAD_TO = 128
_INT16_COLUMN_LIMIT = 32768


@triton.jit
def _csr_rowsplit_kernel(
    indptr_ptr, indices_ptr, values_ptr, order_ptr, b_ptr, out_ptr,
    M, N,
    stride_bk, stride_bn, stride_om, stride_on,
    ROWS_PER_PROGRAM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_NNZ: tl.constexpr,
    USE_ORDER: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    lanes = tl.arange(0, BLOCK_NNZ)
    for i in range(ROWS_PER_PROGRAM):
        slot = pid_m * ROWS_PER_PROGRAM + i
        slot_ok = slot < M
        if USE_ORDER:
            row = tl.load(order_ptr + slot, mask=slot_ok, other=0)
        else:
            row = slot
        start = tl.load(indptr_ptr + row, mask=slot_ok, other=0)
        end = tl.load(indptr_ptr + row + 1, mask=slot_ok, other=0)
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        first = (start // BLOCK_NNZ) * BLOCK_NNZ
        for k0 in range(first, end, BLOCK_NNZ):
            offs = tl.multiple_of(k0, BLOCK_NNZ) + lanes  # aligned chunk: vector loads of A
            live = (offs >= start) & (offs < end)
            cols = tl.load(indices_ptr + offs).to(tl.int64)
            vals = tl.where(live, tl.load(values_ptr + offs).to(tl.float32), 0.0)
            b = tl.load(b_ptr + cols[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                        mask=live[:, None] & n_mask[None, :], other=0.0)
            acc += tl.sum(vals[:, None] * b.to(tl.float32), axis=0)
        tl.store(out_ptr + row.to(tl.int64) * stride_om + offs_n * stride_on,
                 acc.to(out_ptr.dtype.element_ty), mask=n_mask & slot_ok)


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


def _pad(t, length: int):
    if t.shape[0] == length:
        return t
    return torch.cat([t, torch.zeros(length - t.shape[0], dtype=t.dtype, device=t.device)])


def prepare(A, dtype, device) -> dict:
    """CSR (int32 or int16 column ids) on `device`, padded for aligned chunk loads; the row order."""
    dtype = _torch_dtype(dtype)
    M, K = A.shape
    bits = PARAMS["INDEX_BITS"]
    if bits == "auto":
        bits = 16 if K <= _INT16_COLUMN_LIMIT else 32
    if bits == 16 and K > _INT16_COLUMN_LIMIT:
        raise ValueError(f"INDEX_BITS=16 needs K <= {_INT16_COLUMN_LIMIT}, got K = {K}.")
    csr = CSR.from_matrix(A, index_dtype="int16" if bits == 16 else "int32")
    tensors = csr.to_torch(device=device, dtype=dtype)
    padded = -(-max(csr.nnz, 1) // _PAD_TO) * _PAD_TO
    lengths = np.diff(A.indptr)
    if PARAMS["REORDER"] == "length":
        # Slot i of the launch computes row order[i] (longest rows first) and writes C[order[i]].
        order = row_permutation(A, method="length").astype(np.int32)
    else:
        order = np.arange(M, dtype=np.int32)
    return {
        "indptr": tensors["indptr"],
        "indices": _pad(tensors["indices"], padded),
        "values": _pad(tensors["values"], padded),
        "order": torch.from_numpy(order).to(device),
        "shape": (M, K),
        "nnz": csr.nnz,
        "mean_row_nnz": float(lengths.mean()) if M else 0.0,
        "max_row_nnz": int(lengths.max()) if M else 0,
    }


def _launch_config(packed: dict, N: int) -> tuple[int, int, int]:
    """Resolve the "auto" tile sizes from N and the row lengths."""
    block_n = PARAMS["BLOCK_N"]
    if block_n == "auto":
        block_n = min(_next_pow2(N), 128)
    block_nnz = PARAMS["BLOCK_NNZ"]
    if block_nnz == "auto":
        # Aim at ~2K gathered elements per chunk, but not far beyond a typical row.
        by_tile = max(8, 2048 // block_n)
        by_rows = _next_pow2(max(8, int(np.ceil(packed["mean_row_nnz"]))))
        block_nnz = max(8, min(by_tile, by_rows, 128))
    warps = PARAMS["num_warps"]
    if warps == "auto":
        warps = max(1, min(8, (block_n * block_nnz) // 512))
    return int(block_n), int(block_nnz), int(warps)


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
    block_n, block_nnz, warps = _launch_config(packed, N)
    rows = int(PARAMS["ROWS_PER_PROGRAM"])
    grid = (triton.cdiv(M, rows), triton.cdiv(N, block_n))
    _csr_rowsplit_kernel[grid](
        packed["indptr"], packed["indices"], packed["values"], packed["order"], B, out,
        M, N, B.stride(0), B.stride(1), out.stride(0), out.stride(1),
        ROWS_PER_PROGRAM=rows, BLOCK_N=block_n, BLOCK_NNZ=block_nnz,
        USE_ORDER=PARAMS["REORDER"] != "none",
        num_warps=warps, num_stages=int(PARAMS["num_stages"]),
    )
