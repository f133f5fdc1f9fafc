"""CSR row-split SpMM: one Triton program per group of rows x one tile of N columns.

Why this template exists: for a pruned weight at N <= ~256 the SpMM is memory-bound and the bytes
of A (values + column ids) dominate, so the kernel must stream A once and keep every SM busy.
A program takes ROWS_PER_PROGRAM rows *at once* (a [rows, BLOCK_NNZ] tile of nonzeros per step,
each row reading its own contiguous chunk), gathers the matching rows of B into a
[rows, BLOCK_NNZ, BLOCK_N] tile (B is small at small N and stays in L2) and multiply-adds into an
fp32 accumulator of that same shape. The reduction over the nonzero axis happens once, after the
loop: a per-chunk reduction would put a cross-warp shuffle/shared-memory round trip on every step.

Choices that matter on H100/H200-class GPUs:
  * 16-bit column ids (INDEX_BITS=16, or "auto" when K <= 32768): 4 instead of 6 bytes per fp16
    nonzero, which moves the break-even against dense from ~67% to ~50% sparsity.
  * Latency, not bandwidth, bounds very sparse matrices (99%: 0.7 MB of A): every program is a
    chain of dependent loads (row extent -> column ids -> B rows -> store). LAYOUT="padded" stores
    each row's nonzeros at a fixed stride W (the longest row), so the column-id loads need no
    row pointer and issue at once beside the row-length load; "auto" picks it when the padding
    costs little (<= 15% more bytes of A, or under 1 MiB), and when every row fits one chunk the
    loop disappears too (straight-line code).
  * Several rows per program (ROWS_PER_PROGRAM) for short rows, so a program does enough work;
    REORDER="length" sorts rows longest-first so rows grouped in a program have similar lengths and
    long rows start first (row swizzle). The permutation is applied when C is written: program
    slot i computes row order[i] and stores it to row order[i] of C.
  * Index math in int32 unless an offset can pass 2^31 (then int64), decided once per shape.
  * Launch cost: everything that depends only on (A, N, the layout of B and C) is resolved once and
    cached in packed["scratch"]; later calls launch Triton's compiled kernel directly (see runtime.launch).
Wins for regular (not power-law) rows; for skewed rows csr_balanced splits by nonzeros instead.
"""
META = {
    "name": "csr_rowsplit",
    "backend": "triton",
    "format": "csr",
    "description": "CSR SpMM, a program per row group x N tile; per-row chunks of column ids, gathered B rows, fp32 accumulate reduced once",
    "params": {
        "BLOCK_N": ["auto", 1, 2, 4, 8, 16, 32, 64, 128, 256],
        "BLOCK_NNZ": ["auto", 8, 16, 32, 64, 128],
        "ROWS_PER_PROGRAM": [1, 2, 4, 8, 16],
        "INDEX_BITS": ["auto", 32, 16],
        "REORDER": ["none", "length"],
        "LAYOUT": ["auto", "csr", "padded"],
        "num_warps": ["auto", 1, 2, 4, 8],
        "num_stages": [1, 2, 3, 4],
    },
    "defaults": {
        "BLOCK_N": "auto",
        "BLOCK_NNZ": "auto",
        "ROWS_PER_PROGRAM": 1,
        "INDEX_BITS": "auto",
        "REORDER": "none",
        "LAYOUT": "auto",
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
from sparseditto.kernel_templates import runtime as rt
from sparseditto.reorder import row_permutation

_INT32_LIMIT = 2**31 - 1
_PAD_MAX_EXTRA = 0.15          # LAYOUT="auto": pad rows when it adds <= 15% bytes of A ...
_PAD_FREE_BYTES = 1 << 20      # ... or less than 1 MiB (latency-bound sizes: bytes are free)
# "auto" tile rules, from H200 measurements (benchmarks/tune.py, docs/kernels.md): a looped
# program step gathers ~1K B elements at N <= 32 and ~2K at N >= 64; a row that fits one chunk
# of up to 4K elements is done in one straight-line step. Accumulator elements per thread: 64
# for one-chunk programs and 32 for looped ones at small N (fewer, fuller warps won: u99 7.9 us
# at 2 warps vs 13.4 us at 8; u90 17.0 us at 1 warp vs 20.6 us at 4), 16 at N >= 64.
_STEP_ELEMS_SMALL_N = 1024
_STEP_ELEMS_LARGE_N = 2048
_ONE_CHUNK_ELEMS = 4096
_MIN_PROGRAMS_PER_SM = 8       # below this, BLOCK_N="auto" halves once (more, narrower N tiles)


@triton.jit
def _load_a(k, start, length, W, slot_ok, indices_ptr, values_ptr, PADDED: tl.constexpr):
    """Column ids and values of chunk k of each row (zeros past the row's end), shaped
    [rows, BLOCK_NNZ, 1]: already in the layout of the [rows, BLOCK_NNZ, BLOCK_N] tile they meet,
    so no layout conversion (a shared-memory round trip with barriers) sits in the loop."""
    live = k < length
    if PADDED:
        # The loads depend only on the program's rows, not on the loaded row lengths.
        amask = (k < W) & slot_ok
    else:
        amask = live
    offs = start + k
    cols = tl.load(indices_ptr + offs, mask=amask, other=0)
    vals = tl.load(values_ptr + offs, mask=amask, other=0.0)
    return cols, tl.where(live, vals.to(tl.float32), 0.0), live


@triton.jit
def _gather_fma(acc, cols, vals, live, b_ptr, offs_n, n_mask, stride_bk, stride_bn, WIDE: tl.constexpr):
    """acc[r, j, :] += vals[r, j] * B[cols[r, j], offs_n] (cols/vals/live are [rows, BLOCK_NNZ, 1])."""
    if WIDE:
        brow = cols.to(tl.int64) * stride_bk
    else:
        brow = cols.to(tl.int32) * stride_bk
    b = tl.load(b_ptr + brow + offs_n * stride_bn, mask=live & n_mask, other=0.0)
    return acc + vals * b.to(tl.float32)


@triton.jit
def _csr_rowsplit_kernel(
    indptr_ptr, lens_ptr, indices_ptr, values_ptr, order_ptr, b_ptr, out_ptr,
    M, N, W,
    stride_bk, stride_bn, stride_om, stride_on,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_NNZ: tl.constexpr,
    USE_ORDER: tl.constexpr, PADDED: tl.constexpr, ONE_CHUNK: tl.constexpr, WIDE: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    slots = pid_m * ROWS + tl.arange(0, ROWS)
    slot_ok = slots < M
    if USE_ORDER:
        rows = tl.load(order_ptr + slots, mask=slot_ok, other=0)
    else:
        rows = slots
    if WIDE:
        rows = rows.to(tl.int64)
    if PADDED:
        start = rows * W
        length = tl.load(lens_ptr + rows, mask=slot_ok, other=0)
    else:
        start = tl.load(indptr_ptr + rows, mask=slot_ok, other=0)
        length = tl.load(indptr_ptr + rows + 1, mask=slot_ok, other=0) - start
        if WIDE:
            start = start.to(tl.int64)
    # Everything below lives in the 3-D [rows, BLOCK_NNZ, BLOCK_N] tile's layout.
    lanes = tl.arange(0, BLOCK_NNZ)[None, :, None]
    start3 = start[:, None, None]
    length3 = length[:, None, None]
    ok3 = slot_ok[:, None, None]
    offs_n3 = offs_n[None, None, :]
    n_mask3 = n_mask[None, None, :]
    acc = tl.zeros([ROWS, BLOCK_NNZ, BLOCK_N], dtype=tl.float32)
    cols, vals, live = _load_a(lanes, start3, length3, W, ok3, indices_ptr, values_ptr, PADDED)
    if not ONE_CHUNK:
        if PADDED:
            span = W
        else:
            span = tl.max(length, axis=0)
        # Software pipelining by hand: the next chunk's ids/values are requested before this
        # chunk's B rows, so each step waits for one round trip instead of two. (Triton's own
        # pipeliner does not take these 2-byte loads.) The last prefetch is fully masked.
        for c in range(BLOCK_NNZ, span + BLOCK_NNZ, BLOCK_NNZ):
            next_cols, next_vals, next_live = _load_a(c + lanes, start3, length3, W, ok3, indices_ptr,
                                                      values_ptr, PADDED)
            acc = _gather_fma(acc, cols, vals, live, b_ptr, offs_n3, n_mask3, stride_bk, stride_bn, WIDE)
            cols, vals, live = next_cols, next_vals, next_live
    else:
        acc = _gather_fma(acc, cols, vals, live, b_ptr, offs_n3, n_mask3, stride_bk, stride_bn, WIDE)
    tile = tl.sum(acc, axis=1)
    tl.store(out_ptr + rows[:, None] * stride_om + offs_n[None, :] * stride_on,
             tile.to(out_ptr.dtype.element_ty), mask=slot_ok[:, None] & n_mask[None, :])


# ---- entry points (helpers below) ----------------------------------------------------------------

def prepare(A, dtype, device) -> dict:
    """CSR (int32 or int16 column ids) on `device`, optionally padded to a fixed row stride; the
    row order; an empty plan cache under "scratch"."""
    rt.check_params(META, PARAMS)
    dtype = rt.torch_dtype(dtype)
    M, K = A.shape
    bits = rt.index_bits(PARAMS["INDEX_BITS"], K)
    csr = CSR.from_matrix(A, index_dtype="int16" if bits == 16 else "int32")
    lengths = np.diff(csr.indptr.astype(np.int64))
    layout = PARAMS["LAYOUT"]
    if layout == "auto":
        layout = choose_layout(lengths, bits // 8, rt.element_size(dtype))
    if PARAMS["REORDER"] == "length":
        # Slot i of the launch computes row order[i] (longest rows first) and writes C[order[i]].
        order = row_permutation(A, method="length").astype(np.int32)
    else:
        order = np.arange(max(M, 1), dtype=np.int32)
    max_row = int(lengths.max()) if M else 0
    if layout == "padded":
        # A stride divisible by 16 lets Triton prove 16-element alignment of every row: vector loads.
        width = max(16, -(-max_row // 16) * 16)
        indices, values = _padded(csr, lengths, width)
        vals_t = torch.from_numpy(values).to(device=device, dtype=dtype)
        idx_t = torch.from_numpy(indices).to(device)
    else:
        width = 0
        tensors = csr.to_torch(device=device, dtype=dtype)
        idx_t, vals_t = tensors["indices"], tensors["values"]
        if csr.nnz == 0:  # a zero-length tensor has no valid pointer for the launch
            idx_t = torch.zeros(1, dtype=idx_t.dtype, device=device)
            vals_t = torch.zeros(1, dtype=dtype, device=device)
    return {
        "indptr": torch.from_numpy(csr.indptr).to(device),
        "lengths": torch.from_numpy(lengths.astype(np.int32) if M else np.zeros(1, np.int32)).to(device),
        "indices": idx_t,
        "values": vals_t,
        "order": torch.from_numpy(order).to(device),
        "shape": (M, K),
        "nnz": csr.nnz,
        "layout": layout,
        "width": width,
        "mean_row_nnz": float(lengths.mean()) if M else 0.0,
        "max_row_nnz": max_row,
        "scratch": {},
    }


def spmm(packed: dict, B, out) -> None:
    """out[M, N] = A @ B with B [K, N] (any strides), fp32 accumulation, out in B's dtype."""
    rt.run_plans(packed, B, out, _plan, META, PARAMS)


# ---- helpers --------------------------------------------------------------------------------------

def choose_layout(lengths: np.ndarray, index_bytes: int, value_bytes: int) -> str:
    """LAYOUT="auto": "padded" (rows at a fixed stride, no row pointer on the critical path) when
    padding every row to the longest adds <= 15% bytes of A or less than 1 MiB; else "csr"."""
    if lengths.size == 0:
        return "csr"
    nnz = int(lengths.sum())
    extra = (lengths.size * int(lengths.max()) - nnz) * (index_bytes + value_bytes)
    csr_bytes = nnz * (index_bytes + value_bytes) + (lengths.size + 1) * 4
    return "padded" if extra <= max(_PAD_MAX_EXTRA * csr_bytes, _PAD_FREE_BYTES) else "csr"


def _padded(csr: CSR, lengths: np.ndarray, width: int):
    """Row r's nonzeros at [r*width, r*width + len_r); padding entries are column 0, value 0."""
    M = lengths.size
    rows = np.repeat(np.arange(M, dtype=np.int64), lengths)
    pos = np.arange(csr.nnz, dtype=np.int64) - csr.indptr[:-1].astype(np.int64)[rows]
    dest = rows * width + pos
    indices = np.zeros(max(M * width, 1), dtype=csr.indices.dtype)
    values = np.zeros(max(M * width, 1), dtype=csr.values.dtype)
    indices[dest] = csr.indices
    values[dest] = csr.values
    return indices, values


def launch_config(packed: dict, N: int, sms: int = rt.DEFAULT_SMS) -> dict:
    """Tile sizes and warps for N (the "auto" rules above); pure Python, no device needed."""
    rows = int(PARAMS["ROWS_PER_PROGRAM"])
    M = packed["shape"][0]
    block_n = PARAMS["BLOCK_N"]
    if block_n == "auto":
        block_n = min(rt.next_pow2(N), 128)
        if block_n > 16 and -(-M // rows) * -(-N // block_n) < _MIN_PROGRAMS_PER_SM * sms:
            block_n //= 2   # few rows (e.g. 512): more N tiles keep the SMs busy
    block_n = int(block_n)
    large_n = block_n >= 64
    span = packed["width"] if packed["layout"] == "padded" else packed["max_row_nnz"]
    block_nnz = PARAMS["BLOCK_NNZ"]
    if block_nnz == "auto":
        one_chunk = min(128, _ONE_CHUNK_ELEMS // (block_n * rows))
        if span <= one_chunk:
            block_nnz = max(8, rt.next_pow2(max(span, 1)))
        else:
            step = _STEP_ELEMS_LARGE_N if large_n else _STEP_ELEMS_SMALL_N
            block_nnz = max(8, min(128, step // (block_n * rows)))
    block_nnz = int(block_nnz)
    one = span <= block_nnz
    warps = PARAMS["num_warps"]
    if warps == "auto":
        per_thread = 16 if large_n else (64 if one else 32)
        warps = max(1, min(8, (rows * block_nnz * block_n) // (32 * per_thread)))
        warps = 1 << (int(warps).bit_length() - 1)
    return {"ROWS": rows, "BLOCK_N": block_n, "BLOCK_NNZ": block_nnz, "num_warps": int(warps), "ONE_CHUNK": one}


def _plan(packed: dict, B, out) -> dict:
    """Everything one launch needs for this (A, N, B/C layout): grid, constexprs, argument list."""
    M, K = packed["shape"]
    N = int(B.shape[1])
    cfg = launch_config(packed, N, rt.sm_count(B.device))
    reach = max(K * abs(B.stride(0)) + N * abs(B.stride(1)), M * abs(out.stride(0)) + N * abs(out.stride(1)),
                M * max(packed["width"], 1), packed["nnz"])
    consts = dict(ROWS=cfg["ROWS"], BLOCK_N=cfg["BLOCK_N"], BLOCK_NNZ=cfg["BLOCK_NNZ"],
                  USE_ORDER=PARAMS["REORDER"] != "none", PADDED=packed["layout"] == "padded",
                  ONE_CHUNK=cfg["ONE_CHUNK"], WIDE=reach > _INT32_LIMIT)
    args = [packed["indptr"], packed["lengths"], packed["indices"], packed["values"], packed["order"], None, None,
            M, N, max(packed["width"], 1), B.stride(0), B.stride(1), out.stride(0), out.stride(1)]
    args += [consts[name] for name in ("ROWS", "BLOCK_N", "BLOCK_NNZ", "USE_ORDER", "PADDED", "ONE_CHUNK", "WIDE")]
    grid = (triton.cdiv(M, cfg["ROWS"]), triton.cdiv(N, cfg["BLOCK_N"]), 1)
    return {"kernel": _csr_rowsplit_kernel, "grid": grid, "args": args, "b_at": 5, "out_at": 6,
            "options": {"num_warps": cfg["num_warps"], "num_stages": int(PARAMS["num_stages"])},
            "compiled": None, "config": cfg}
