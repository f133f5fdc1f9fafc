"""CSR SpMM split by nonzeros (merge-path style): every program gets the same number of nonzeros.

Why this template exists: on skewed matrices (power-law graphs, a few dense rows) a row-split kernel
is only as fast as the program that drew the longest row, while most SMs idle. Here program p owns
nonzeros [p*P, (p+1)*P) with P = NNZ_PER_PROGRAM, whatever rows they fall in, so the work per
program is equal by construction.

How rows crossing a program boundary are combined, deterministically (no atomics, so two runs give
bit-identical results and verification is stable):
  * prepare() gives each program a row range [row_lo, row_hi] (found by binary search of indptr,
    numpy searchsorted). Ranges tile all M rows: empty rows are owned by exactly one program and
    written as zeros, so every element of C is written.
  * A row entirely inside one program's nonzeros is written straight to C.
  * A row cut by a boundary ("shared row") gets one fp32 partial per program that touches it:
    slot 0 of a program holds its first row's partial, slot 1 its last row's.
  * FIXUP="inline" (default, one launch): after publishing a partial, a program bumps the shared
    row's arrival counter (acq_rel atomic); the last of the row's (program, N tile) arrivals sums
    the row's partials in program order, writes C and resets the counter to zero. The sum's order
    does not depend on who arrives last, so results are deterministic. (Concurrent launches of
    one prepared matrix on several streams would share the counters: unsafe, as for any split-K.)
  * FIXUP="launch": a second small launch sums the partials of each shared row instead (no
    atomics). Either way nothing extra runs when no row is shared.
Each row's slice is walked in masked chunks of BLOCK_NNZ nonzeros into a 2-D [BLOCK_NNZ, BLOCK_N]
fp32 accumulator reduced once per row (a reduction per chunk would cross warps every step). The
launch (grid, constexprs, the partials buffer) is planned once per (N, B/C layout) and cached in
packed["scratch"]; later calls launch Triton's compiled kernel directly.
"""
META = {
    "name": "csr_balanced",
    "backend": "triton",
    "format": "csr",
    "description": "CSR SpMM with equal nonzeros per program (nnz split) and a deterministic fix-up for rows crossing programs",
    "params": {
        "NNZ_PER_PROGRAM": ["auto", 64, 128, 256, 512, 1024, 2048, 4096],
        "BLOCK_N": ["auto", 1, 2, 4, 8, 16, 32, 64, 128, 256],
        "BLOCK_NNZ": [8, 16, 32, 64, 128],
        "INDEX_BITS": ["auto", 32, 16],
        "FIXUP": ["inline", "launch"],
        "num_warps": ["auto", 1, 2, 4, 8],
        "num_stages": [1, 2, 3, 4],
    },
    "defaults": {
        "NNZ_PER_PROGRAM": "auto",
        "BLOCK_N": "auto",
        "BLOCK_NNZ": 32,
        "INDEX_BITS": "auto",
        "FIXUP": "inline",
        "num_warps": "auto",
        "num_stages": 2,
    },
    "patterns": ["power_law", "unstructured"],
}
PARAMS = dict(META["defaults"])

import numpy as np
import torch
import triton
import triton.language as tl

from sparseditto.formats import CSR
from sparseditto.kernel_templates import runtime as rt

_PAD_TO = 128


@triton.jit
def _sum_partials(row, p_first, p_last, row_lo_ptr, part_ptr, N, offs_n, n_mask, BLOCK_N: tl.constexpr):
    """Sum a shared row's fp32 partials over programs p_first..p_last, in program order."""
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for p in range(p_first, p_last + 1):
        slot = (tl.load(row_lo_ptr + p) != row).to(tl.int64)
        acc += tl.load(part_ptr + (tl.cast(p, tl.int64) * 2 + slot) * N + offs_n, mask=n_mask, other=0.0,
                       cache_modifier=".cg")
    return acc


@triton.jit
def _csr_balanced_kernel(
    indptr_ptr, indices_ptr, values_ptr, row_lo_ptr, row_hi_ptr, b_ptr, out_ptr, part_ptr,
    shared_of_prog_ptr, shared_rows_ptr, first_prog_ptr, last_prog_ptr, counter_ptr,
    nnz, N, nnz_per_program, n_tiles,
    stride_bk, stride_bn, stride_om, stride_on,
    BLOCK_N: tl.constexpr, BLOCK_NNZ: tl.constexpr, INLINE_FIXUP: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    lanes = tl.arange(0, BLOCK_NNZ)
    lo = pid * nnz_per_program
    hi = tl.minimum(lo + nnz_per_program, nnz)
    row_lo = tl.load(row_lo_ptr + pid)
    row_hi = tl.load(row_hi_ptr + pid)
    for row in range(row_lo, row_hi + 1):
        row_start = tl.load(indptr_ptr + row)
        row_end = tl.load(indptr_ptr + row + 1)
        start = tl.maximum(row_start, lo)
        end = tl.minimum(row_end, hi)
        # A 2-D accumulator, reduced once per row: a reduction per chunk would put a cross-warp
        # round trip through shared memory on every step.
        acc2 = tl.zeros([BLOCK_NNZ, BLOCK_N], dtype=tl.float32)
        for k0 in range(start, end, BLOCK_NNZ):
            offs = k0 + lanes
            live = offs < end
            cols = tl.load(indices_ptr + offs, mask=live, other=0)
            vals = tl.load(values_ptr + offs, mask=live, other=0.0).to(tl.float32)
            b = tl.load(b_ptr + cols.to(tl.int64)[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                        mask=live[:, None] & n_mask[None, :], other=0.0)
            acc2 += vals[:, None] * b.to(tl.float32)
        acc = tl.sum(acc2, axis=0)
        owned = (row_start >= lo) & (row_end <= hi)
        tl.store(out_ptr + tl.cast(row, tl.int64) * stride_om + offs_n * stride_on,
                 acc.to(out_ptr.dtype.element_ty), mask=n_mask & owned)
        slot = (row != row_lo).to(tl.int64)
        tl.store(part_ptr + (pid.to(tl.int64) * 2 + slot) * N + offs_n, acc, mask=n_mask & (owned == 0))
    if INLINE_FIXUP:
        for k in tl.static_range(2):
            shared = tl.load(shared_of_prog_ptr + pid * 2 + k)
            if shared >= 0:
                p_first = tl.load(first_prog_ptr + shared)
                p_last = tl.load(last_prog_ptr + shared)
                tl.debug_barrier()  # every thread's partial is written before the release below
                arrived = tl.atomic_add(counter_ptr + shared, 1, sem="acq_rel", scope="gpu")
                if arrived == (p_last - p_first + 1) * n_tiles - 1:
                    row = tl.load(shared_rows_ptr + shared)
                    for t in range(0, n_tiles):
                        cols_t = t * BLOCK_N + tl.arange(0, BLOCK_N)
                        mask_t = cols_t < N
                        total = _sum_partials(row, p_first, p_last, row_lo_ptr, part_ptr, N, cols_t, mask_t,
                                              BLOCK_N)
                        tl.store(out_ptr + tl.cast(row, tl.int64) * stride_om + cols_t * stride_on,
                                 total.to(out_ptr.dtype.element_ty), mask=mask_t)
                    tl.atomic_xchg(counter_ptr + shared, 0)  # ready for the next launch


@triton.jit
def _csr_balanced_fixup_kernel(
    shared_rows_ptr, first_prog_ptr, last_prog_ptr, row_lo_ptr, part_ptr, out_ptr,
    N, stride_om, stride_on,
    BLOCK_N: tl.constexpr,
):
    i = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    row = tl.load(shared_rows_ptr + i)
    acc = _sum_partials(row, tl.load(first_prog_ptr + i), tl.load(last_prog_ptr + i), row_lo_ptr, part_ptr,
                        N, offs_n, n_mask, BLOCK_N)
    tl.store(out_ptr + tl.cast(row, tl.int64) * stride_om + offs_n * stride_on,
             acc.to(out_ptr.dtype.element_ty), mask=n_mask)


def _pad(t, length: int):
    if t.shape[0] == length:
        return t
    return torch.cat([t, torch.zeros(length - t.shape[0], dtype=t.dtype, device=t.device)])


def _nnz_per_program(nnz: int) -> int:
    """NNZ_PER_PROGRAM; "auto" aims at ~2K programs for big matrices, at least 128 nonzeros each."""
    chosen = PARAMS["NNZ_PER_PROGRAM"]
    if chosen != "auto":
        return int(chosen)
    return int(min(4096, max(128, rt.next_pow2(-(-nnz // 2048)))))


def split_by_nonzeros(indptr: np.ndarray, nnz_per_program: int) -> dict:
    """Row ranges of each program and the shared rows to fix up (vectorized numpy).

    Program p owns nonzeros [p*P, min((p+1)*P, nnz)). Its first row is the row holding nonzero p*P
    (program 0: row 0, so leading empty rows are covered); its last row is the row just before the
    next program's first row, or that row itself when the next program starts inside it. The last
    program ends at row M-1. Ranges therefore cover every row; a row is shared when its nonzeros
    span several programs.
    """
    indptr = np.asarray(indptr, dtype=np.int64)
    M = indptr.shape[0] - 1
    nnz = int(indptr[-1])
    P = int(nnz_per_program)
    programs = max(1, -(-nnz // P))
    starts = np.arange(programs, dtype=np.int64) * P
    row_lo = np.searchsorted(indptr, starts, side="right") - 1
    row_lo[0] = 0
    row_lo = np.minimum(row_lo, M - 1)
    row_hi = np.empty(programs, dtype=np.int64)
    row_hi[-1] = M - 1
    if programs > 1:
        nxt = row_lo[1:]
        row_hi[:-1] = np.where(indptr[nxt] == starts[1:], nxt - 1, nxt)
    lengths = np.diff(indptr)
    first_prog = indptr[:-1] // P
    last_prog = np.maximum(indptr[1:] - 1, 0) // P
    shared = np.flatnonzero((lengths > 0) & (first_prog != last_prog))
    # Per program, the index (into `shared`) of its first / last row when that row is shared.
    index_of_row = np.full(M, -1, dtype=np.int64)
    index_of_row[shared] = np.arange(shared.size)
    shared_of_prog = np.stack([index_of_row[row_lo],
                               np.where(row_hi != row_lo, index_of_row[row_hi], -1)], axis=1)
    return {
        "programs": programs,
        "row_lo": row_lo.astype(np.int32),
        "row_hi": row_hi.astype(np.int32),
        "shared_rows": shared.astype(np.int32),
        "shared_first": first_prog[shared].astype(np.int32),
        "shared_last": last_prog[shared].astype(np.int32),
        "shared_of_prog": shared_of_prog.astype(np.int32),
    }


def prepare(A, dtype, device) -> dict:
    """CSR on `device` (padded for aligned chunk loads) plus the nonzero split and fix-up lists."""
    dtype = rt.torch_dtype(dtype)
    M, K = A.shape
    bits = rt.index_bits(PARAMS["INDEX_BITS"], K)
    csr = CSR.from_matrix(A, index_dtype="int16" if bits == 16 else "int32")
    tensors = csr.to_torch(device=device, dtype=dtype)
    padded = -(-max(csr.nnz, 1) // _PAD_TO) * _PAD_TO
    P = _nnz_per_program(csr.nnz)
    split = split_by_nonzeros(A.indptr, P)

    def dev(a):
        # A zero-length tensor has no valid device pointer for a launch: keep one unused element.
        return torch.from_numpy(a if a.size else np.zeros(1, dtype=a.dtype)).to(device)

    return {
        "indptr": tensors["indptr"],
        "indices": _pad(tensors["indices"], padded),
        "values": _pad(tensors["values"], padded),
        "row_lo": dev(split["row_lo"]),
        "row_hi": dev(split["row_hi"]),
        "shared_rows": dev(split["shared_rows"]),
        "shared_first": dev(split["shared_first"]),
        "shared_last": dev(split["shared_last"]),
        "shared_of_prog": dev(split["shared_of_prog"]),
        # Arrival counters of the inline fix-up; the last arrival resets its counter to zero.
        "counters": torch.zeros(max(1, split["shared_rows"].size), dtype=torch.int32, device=device),
        "n_shared": int(split["shared_rows"].size),
        "programs": split["programs"],
        "nnz_per_program": P,
        "shape": (M, K),
        "nnz": csr.nnz,
        "scratch": {},
    }


def launch_config(packed: dict, N: int) -> dict:
    """BLOCK_N, BLOCK_NNZ and warps for N ("auto" rules); pure Python."""
    block_n = PARAMS["BLOCK_N"]
    if block_n == "auto":
        block_n = min(rt.next_pow2(N), 128)
    block_nnz = int(PARAMS["BLOCK_NNZ"])
    warps = PARAMS["num_warps"]
    if warps == "auto":
        warps = max(1, min(8, (block_n * block_nnz) // 512))
    return {"BLOCK_N": int(block_n), "BLOCK_NNZ": block_nnz, "num_warps": int(warps),
            "n_tiles": -(-N // int(block_n))}


def _plan(packed: dict, B, out) -> list:
    """The one or two launches of one spmm for this (N, B/C layout), with the partials buffer."""
    N = int(B.shape[1])
    cfg = launch_config(packed, N)
    block_n, n_tiles = cfg["BLOCK_N"], cfg["n_tiles"]
    programs, n_shared = packed["programs"], packed["n_shared"]
    inline = PARAMS["FIXUP"] == "inline"
    # Partials exist only when some row is shared; a 1-element buffer otherwise (never written).
    partials = torch.empty((programs * 2 * N) if n_shared else 1, dtype=torch.float32, device=B.device)
    named = dict(
        indptr_ptr=packed["indptr"], indices_ptr=packed["indices"], values_ptr=packed["values"],
        row_lo_ptr=packed["row_lo"], row_hi_ptr=packed["row_hi"], b_ptr=None, out_ptr=None, part_ptr=partials,
        shared_of_prog_ptr=packed["shared_of_prog"], shared_rows_ptr=packed["shared_rows"],
        first_prog_ptr=packed["shared_first"], last_prog_ptr=packed["shared_last"], counter_ptr=packed["counters"],
        nnz=packed["nnz"], N=N, nnz_per_program=packed["nnz_per_program"], n_tiles=n_tiles,
        stride_bk=B.stride(0), stride_bn=B.stride(1), stride_om=out.stride(0), stride_on=out.stride(1),
        BLOCK_N=block_n, BLOCK_NNZ=cfg["BLOCK_NNZ"], INLINE_FIXUP=bool(inline and n_shared))
    plans = [rt.make_plan(_csr_balanced_kernel, named, (programs, n_tiles, 1),
                          {"num_warps": cfg["num_warps"], "num_stages": int(PARAMS["num_stages"])},
                          partials=partials)]
    if n_shared and not inline:
        fix = dict(shared_rows_ptr=packed["shared_rows"], first_prog_ptr=packed["shared_first"],
                   last_prog_ptr=packed["shared_last"], row_lo_ptr=packed["row_lo"], part_ptr=partials,
                   out_ptr=None, N=N, stride_om=out.stride(0), stride_on=out.stride(1), BLOCK_N=block_n)
        # the fix-up kernel reads no B: its plan has b_at None
        plans.append(rt.make_plan(_csr_balanced_fixup_kernel, fix, (n_shared, n_tiles, 1),
                                  {"num_warps": max(1, min(4, block_n // 32))}))
    return plans


def spmm(packed: dict, B, out) -> None:
    """out[M, N] = A @ B with B [K, N] (any strides), fp32 accumulation, out in B's dtype."""
    rt.run_plans(packed, B, out, _plan, META, PARAMS)
