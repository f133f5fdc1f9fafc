"""Row/column compaction: drop A's empty rows and columns, run a dense tensor-core GEMM on the rest.

Why this template exists: structured (channel / neuron / head) pruning removes whole rows or
columns of a weight. What remains is a smaller, (nearly) dense matrix, and a dense tiled `tl.dot`
on it beats any sparse format: no index per nonzero, tensor cores instead of CUDA cores, and the
bytes of A shrink to kept_rows x kept_cols values. At small N it is a weight-streaming GEMM, so it
should run at cuBLAS-like bandwidth on the kept part (row-pruned 50%: ~2x over dense).

Layout of the work, one launch, grid (row tiles x N tiles, SPLIT_K):
  * Programs on kept row tiles compute C[kept_rows[m-tile], n-tile] = dense[m-tile, k-slice] @
    B[kept_cols[k-slice], n-tile] with BLOCK_M x BLOCK_N x BLOCK_K tiles. When no column was
    dropped (row pruning) B is read directly (DIRECT_B), so its loads need no column-id load
    first and pipeline like a plain GEMM's; otherwise B's rows are gathered through kept_cols.
  * SPLIT_K ("auto": ~2 programs per SM) slices K when the kept row tiles alone cannot fill the
    GPU (N = 16: 2048 kept rows are only 32 tiles of 64). Each split writes an fp32 partial tile
    to a workspace, then bumps a per-tile counter (acq_rel atomic); the last split to arrive sums
    the partials in split order (deterministic), writes C and resets the counter. One launch.
  * Programs on the dropped-row tiles (split 0 only) write zeros to those rows of C, so every
    element of C is written (the verifier pre-fills C with NaN).
The dense block is padded in prepare() to multiples of BLOCK_M and BLOCK_K with zeros (A loads
need no mask); B rows past the kept columns are masked, so padding never multiplies B's values.
fp32 inputs use exact fp32 products unless ALLOW_TF32=True (tf32 is ~1e-3 relative error).
Launch cost: the grid, constexprs, workspace and Triton's compiled kernel are cached per (N, B/C
layout) in packed["scratch"], so a repeated spmm is one bare launch.
Counters make two concurrent launches of one prepared matrix on different streams unsafe when
SPLIT_K > 1 (one stream, the normal case, is fine).
"""
META = {
    "name": "compact_rows_cols",
    "backend": "triton",
    "format": "compact",
    "description": "Drop empty rows/cols, dense tl.dot GEMM (split-K for small N) on the kept submatrix, B read directly or gathered, zero the dropped C rows",
    "params": {
        "BLOCK_M": ["auto", 16, 32, 64, 128],
        "BLOCK_N": ["auto", 16, 32, 64, 128, 256],
        "BLOCK_K": ["auto", 16, 32, 64, 128, 256],
        "SPLIT_K": ["auto", 1, 2, 4, 8, 16, 32],
        "ALLOW_TF32": [False, True],
        "num_warps": ["auto", 1, 2, 4, 8],
        "num_stages": ["auto", 1, 2, 3, 4, 5],
    },
    "defaults": {
        "BLOCK_M": "auto",
        "BLOCK_N": "auto",
        "BLOCK_K": "auto",
        "SPLIT_K": "auto",
        "ALLOW_TF32": False,
        "num_warps": "auto",
        "num_stages": "auto",
    },
    "patterns": ["row_pruned", "column_pruned", "dense"],
    # Tried first by the registry's bounded search: the "auto" rules, then fixed alternatives.
    "grid": [{}, {"SPLIT_K": 1}, {"BLOCK_M": 32}, {"BLOCK_K": 64}],
}
PARAMS = dict(META["defaults"])

import numpy as np
import torch
import triton
import triton.language as tl

from sparseditto.kernel_templates import runtime as rt

_STAGE_SMEM_BUDGET = 160 * 1024  # shared memory the "auto" pipeline depth may spend on A/B buffers


@triton.jit
def _compact_kernel(
    dense_ptr, rows_ptr, cols_ptr, dropped_ptr, b_ptr, out_ptr, ws_ptr, cnt_ptr,
    kept_m, kept_k, dropped_m, N, K_STEPS, kept_tiles, N_TILES, NUM_TILES,
    stride_dm, stride_bk, stride_bn, stride_om, stride_on,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr,
    DIRECT_B: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, IN_PREC: tl.constexpr,
    UPCAST: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    pid = tl.program_id(0)          # row tile * N_TILES + N tile: a row tile's N tiles are adjacent
    pid_k = tl.program_id(1)        # split index
    tile_m = pid // N_TILES
    pid_n = pid % N_TILES
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    lanes_m = tl.arange(0, BLOCK_M)
    if tile_m < kept_tiles:
        steps_per = tl.cdiv(K_STEPS, SPLIT)
        s_lo = pid_k * steps_per
        s_hi = tl.minimum(s_lo + steps_per, K_STEPS)
        offs_m = tile_m * BLOCK_M + lanes_m
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = dense_ptr + offs_m.to(tl.int64)[:, None] * stride_dm + (s_lo * BLOCK_K + offs_k)[None, :]
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for s in tl.range(s_lo, s_hi, num_stages=NUM_STAGES):
            a = tl.load(a_ptrs)
            kk = s * BLOCK_K + offs_k
            if DIRECT_B:
                src = kk
            else:
                src = tl.load(cols_ptr + kk)
            b_ptrs = b_ptr + src.to(tl.int64)[:, None] * stride_bk + offs_n[None, :] * stride_bn
            if EVEN_K and EVEN_N:
                b = tl.load(b_ptrs)
            elif EVEN_K:
                b = tl.load(b_ptrs, mask=n_mask[None, :], other=0.0)
            else:
                b = tl.load(b_ptrs, mask=(kk < kept_k)[:, None] & n_mask[None, :], other=0.0)
            if UPCAST:
                acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(a, b.to(a.dtype), acc, input_precision=IN_PREC)
            a_ptrs += BLOCK_K
        m_mask = offs_m < kept_m
        dst = tl.load(rows_ptr + offs_m, mask=m_mask, other=0)
        c_ptrs = out_ptr + dst.to(tl.int64)[:, None] * stride_om + offs_n[None, :] * stride_on
        c_mask = m_mask[:, None] & n_mask[None, :]
        if SPLIT == 1:
            tl.store(c_ptrs, acc.to(out_ptr.dtype.element_ty), mask=c_mask)
        else:
            # Publish the partial, then the last split to arrive sums all partials in split order.
            w_offs = lanes_m[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
            w_tile = ws_ptr + pid.to(tl.int64) * (BLOCK_M * BLOCK_N) + w_offs
            tl.store(w_tile + pid_k.to(tl.int64) * NUM_TILES * (BLOCK_M * BLOCK_N), acc)
            tl.debug_barrier()  # every thread's partial is written before the release below
            arrived = tl.atomic_add(cnt_ptr + pid, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLIT - 1:
                total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
                for k in tl.static_range(SPLIT):
                    part = tl.load(w_tile + k * NUM_TILES * (BLOCK_M * BLOCK_N), mask=c_mask & (pid_k != k),
                                   other=0.0, cache_modifier=".cg")
                    total += tl.where(pid_k == k, acc, part)
                tl.store(c_ptrs, total.to(out_ptr.dtype.element_ty), mask=c_mask)
                tl.atomic_xchg(cnt_ptr + pid, 0)  # ready for the next launch
    else:
        if pid_k == 0:
            offs_m = (tile_m - kept_tiles) * BLOCK_M + lanes_m
            m_mask = offs_m < dropped_m
            dst = tl.load(dropped_ptr + offs_m, mask=m_mask, other=0).to(tl.int64)
            zeros = tl.zeros([BLOCK_M, BLOCK_N], dtype=out_ptr.dtype.element_ty)
            tl.store(out_ptr + dst[:, None] * stride_om + offs_n[None, :] * stride_on,
                     zeros, mask=m_mask[:, None] & n_mask[None, :])


def block_sizes(N: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K) with the "auto" rules: small N streams A in long K steps
    (BLOCK_K 128); large N is a GEMM with 128 x 128 tiles."""
    block_n = PARAMS["BLOCK_N"]
    if block_n == "auto":
        block_n = max(16, min(rt.next_pow2(N), 128))  # tl.dot needs tiles of at least 16
    block_m = PARAMS["BLOCK_M"]
    if block_m == "auto":
        block_m = 64 if N <= 64 else 128
    block_k = PARAMS["BLOCK_K"]
    if block_k == "auto":
        block_k = 128 if N <= 64 else 64
    return int(block_m), int(block_n), int(block_k)


def _compact(A):
    """Kept rows/cols and the dense kept block, built with O(nnz) lookups (no sorting):
    (rows int32, cols int32, dense float32 [r, c])."""
    M, K = A.shape
    lengths = np.diff(A.indptr.astype(np.int64))
    rows = np.flatnonzero(lengths > 0)
    col_used = np.zeros(K, dtype=bool)
    col_used[A.indices] = True
    cols = np.flatnonzero(col_used)
    if cols.size == K and rows.size and A.nnz == rows.size * K:
        # Every kept row is full (row pruning of a dense weight): the values are the block.
        dense = A.data.astype(np.float32).reshape(rows.size, K)
        return rows.astype(np.int32), cols.astype(np.int32), dense
    row_map = np.cumsum(lengths > 0) - 1
    col_map = np.cumsum(col_used) - 1
    dense = np.zeros((rows.size, cols.size), dtype=np.float32)
    dense[np.repeat(row_map, lengths), col_map[A.indices]] = A.data
    return rows.astype(np.int32), cols.astype(np.int32), dense


def prepare(A, dtype, device) -> dict:
    """Kept rows/cols, the dense block padded to whole BLOCK_M x 256-column tiles (any legal
    BLOCK_K divides 256, so one prepared matrix serves every N), the dropped rows."""
    rt.check_params(META, PARAMS)
    dtype = rt.torch_dtype(dtype)
    M, K = A.shape
    rows, cols, block = _compact(A)
    kept_m, kept_k = block.shape
    bm = 128 if PARAMS["BLOCK_M"] == "auto" else int(PARAMS["BLOCK_M"])
    pad_m = -(-kept_m // bm) * bm
    pad_k = -(-kept_k // 256) * 256
    dense = torch.zeros((max(pad_m, 1), max(pad_k, 1)), dtype=dtype, device=device)
    if kept_m and kept_k:
        dense[:kept_m, :kept_k] = torch.from_numpy(np.ascontiguousarray(block)).to(device=device, dtype=dtype)
    cols_p = np.zeros(max(pad_k, 1), dtype=np.int32)
    cols_p[:kept_k] = cols
    keep = np.zeros(M, dtype=bool)
    keep[rows] = True
    dropped = np.flatnonzero(~keep).astype(np.int32)

    def dev(a):
        # A zero-length tensor has no valid pointer for the kernel: keep at least one id (unused).
        return torch.from_numpy(np.ascontiguousarray(a if a.size else np.zeros(1, dtype=np.int32))).to(device)

    return {
        "dense": dense,
        "rows": dev(rows),
        "cols": dev(cols_p),
        "dropped": dev(dropped),
        "kept_m": int(kept_m),
        "kept_k": int(kept_k),
        "direct_b": bool(kept_k == K),   # no column dropped: B is read without the column ids
        "dropped_m": int(dropped.size),
        "shape": (M, K),
        "dtype": dtype,
        "scratch": {},
    }


def launch_config(packed: dict, N: int, sms: int = rt.DEFAULT_SMS,
                  smem_limit: int = rt.DEFAULT_SMEM_PER_BLOCK) -> dict:
    """Tiles, split, warps and stages for N ("auto" rules); pure Python."""
    bm, bn, bk = block_sizes(N)
    kept_tiles = -(-packed["kept_m"] // bm)
    n_tiles = -(-N // bn)
    k_steps = -(-packed["kept_k"] // bk)
    split = PARAMS["SPLIT_K"]
    if split == "auto":
        # Only when the tiles cannot fill one wave: ~1 program per SM, each split keeping >= 2
        # K steps so its loads pipeline. (A full wave of tiles gains nothing from the workspace.)
        # H200, 2048 kept rows x 4096, N = 16 (32 row tiles): SPLIT 4 13.2 us, 8 14.7 us, 16 18.5 us.
        tiles = max(1, kept_tiles * n_tiles)
        want = -(-sms // tiles) if tiles < sms else 1
        cap = max(1, min(32, want, k_steps // 2))
        split = 1 << (cap.bit_length() - 1)
    warps = PARAMS["num_warps"]
    if warps == "auto":
        warps = 8 if bm * bn >= 128 * 128 else 4
    stages = PARAMS["num_stages"]
    if stages == "auto":
        # 4 at small N, 3 for the large-N GEMM (H200, N = 2048: 62.2 us at 3 stages, 65.7 at 4).
        step_bytes = (bm * bk + bk * bn) * packed["dtype"].itemsize
        stages = max(2, min(4 if N <= 64 else 3, rt.stage_budget(_STAGE_SMEM_BUDGET, smem_limit) // step_bytes))
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT": int(split), "num_warps": int(warps),
            "num_stages": int(stages), "kept_tiles": kept_tiles, "n_tiles": n_tiles, "k_steps": k_steps}


def _plan(packed: dict, B, out) -> dict:
    """Grid, constexprs, workspace and argument list for one (N, B/C layout)."""
    N = int(B.shape[1])
    cfg = launch_config(packed, N, rt.sm_count(B.device), rt.smem_per_block(B.device))
    bm, bn, bk, split = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["SPLIT"]
    if packed["kept_m"] and (packed["dense"].shape[0] % bm or packed["dense"].shape[1] % bk):
        raise ValueError(f"compact_rows_cols: BLOCK_M={bm}/BLOCK_K={bk} do not divide the prepared block "
                         f"{tuple(packed['dense'].shape)}; prepare with the same PARAMS.")
    kept_tiles, n_tiles = cfg["kept_tiles"], cfg["n_tiles"]
    tiles = kept_tiles * n_tiles
    device = B.device
    if split > 1:
        ws = torch.empty(split * tiles * bm * bn, dtype=torch.float32, device=device)
        cnt = torch.zeros(tiles, dtype=torch.int32, device=device)
    else:
        ws = torch.empty(1, dtype=torch.float32, device=device)
        cnt = torch.zeros(1, dtype=torch.int32, device=device)
    dropped_tiles = -(-packed["dropped_m"] // bm)
    grid = ((kept_tiles + dropped_tiles) * n_tiles, split, 1)
    fp32 = B.dtype == torch.float32
    args = [packed["dense"], packed["rows"], packed["cols"], packed["dropped"], None, None, ws, cnt,
            packed["kept_m"], packed["kept_k"], packed["dropped_m"], N, cfg["k_steps"], kept_tiles, n_tiles, tiles,
            packed["dense"].stride(0), B.stride(0), B.stride(1), out.stride(0), out.stride(1),
            bm, bn, bk, split, packed["direct_b"], packed["kept_k"] % bk == 0, N % bn == 0,
            "tf32" if (not fp32 or PARAMS["ALLOW_TF32"]) else "ieee",
            # Triton's CPU interpreter multiplies bf16 dot operands as raw uint16 bits (triton 3.6):
            # upcast there. Never taken on a GPU.
            B.device.type == "cpu" and B.dtype == torch.bfloat16,
            cfg["num_stages"]]
    return {"kernel": _compact_kernel, "grid": grid, "args": args, "b_at": 4, "out_at": 5,
            "options": {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}, "compiled": None,
            "config": cfg, "ws": ws, "cnt": cnt}


def spmm(packed: dict, B, out) -> None:
    """out[M, N] = A @ B with B [K, N] (any strides), fp32 accumulation, out in B's dtype."""
    rt.run_plans(packed, B, out, _plan, META, PARAMS)
