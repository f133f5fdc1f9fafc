"""Block-sparse (BSR) SpMM on tensor cores: one program per (block row, N tile), tl.dot per block.

Why this template exists: when a pruned weight's nonzeros cluster into dense (bm x bk) blocks, the
blocks can go straight into tensor-core dots with no expansion at all, and the only index cost is
one int32 block-column id per block (4 / (2*bm*bk) bytes per fp16 element: 0.8% at 16x16). It is
the fastest of the "load as sparse, compute as dense" kernels whenever the block fill is high.

Per program: walk the block row's nonzero blocks (or a 1/SPLIT slice of them) GROUP at a time:
prepare stores each group of GROUP blocks side by side as one contiguous [BM, GROUP*BK] tile
(rows padded to whole groups with zero blocks of column id -1), so a step is one unmasked
16-byte-vector load of A, the GROUP block-column ids, the matching rows of B [GROUP*BK, BLOCK_N]
and one tl.dot (fp32 accumulate). Choices that matter on H100/H200-class GPUs:
  * Bytes in flight: a 16x16 block is only 512 bytes and the id load feeds B's address, so
    Triton prefetches about (num_stages-1)/2 steps ahead; GROUP="auto" widens a step to >= 64
    columns (unless padding adds > 12.5% blocks) and num_stages="auto" deepens the pipeline
    for small steps (5 stages) while keeping big steps within ~96 KiB of shared memory.
  * Block shape: BM/BK "auto" re-blocks the matrix at the 16..128 shape that stores the fewest
    elements (within 15%, the largest block wins: fewer, longer dots). Blocks smaller than 16
    (tl.dot needs >= 16 per dim) are re-blocked at 16, which never stores more than padding each
    small block to 16 would.
  * Load balance: ORDER="length" launches block rows longest-first (LPT order), so the long rows
    start in the first wave and short ones fill the tail; the store uses the real block row.
    Groups are stored in that launch order, so a program's extent loads depend on its slot only.
  * Filling 132 SMs: when block rows x N tiles is below ~2 waves, SPLIT slices each block row's
    blocks across SPLIT programs. Partial tiles go to an fp32 workspace; the last program to finish
    a tile (an acq_rel atomic counter per tile) sums the partials in a fixed order, writes C and
    resets the counter, so split-K costs one launch and stays deterministic.
  * N tiles of one block row are adjacent program ids, so a block row fetched from HBM is reused
    from L2 by its other N tiles.
The counters make concurrent launches of one prepared matrix on different streams unsafe when
SPLIT > 1; launches on one stream (the normal case) are fine. The launch (grid, constexprs,
workspace) is planned once per (N, B/C layout) and cached in packed["scratch"]; later calls
launch Triton's compiled kernel directly (docs/kernels.md, "Launch plans").
"""
META = {
    "name": "bsr_tc",
    "backend": "triton",
    "format": "bsr",
    "description": "BSR SpMM on tensor cores: a program per (block row, N tile), tl.dot per nonzero block, fp32 accumulate, optional split-K",
    "params": {
        "BM": ["auto", 8, 16, 32, 64, 128],
        "BK": ["auto", 8, 16, 32, 64, 128],
        "GROUP": ["auto", 1, 2, 4, 8],
        "BLOCK_N": ["auto", 16, 32, 64, 128, 256],
        "SPLIT": ["auto", 1, 2, 4, 8],
        "ORDER": ["length", "natural"],
        "FP32_DOT": ["ieee", "tf32"],
        "num_warps": ["auto", 1, 2, 4, 8],
        "num_stages": ["auto", 2, 3, 4, 5, 6],
    },
    "defaults": {
        "BM": "auto",
        "BK": "auto",
        "GROUP": "auto",
        "BLOCK_N": "auto",
        "SPLIT": "auto",
        "ORDER": "length",
        "FP32_DOT": "ieee",
        "num_warps": "auto",
        "num_stages": "auto",
    },
    "patterns": ["block", "block_sparse", "blocked", "structured_block"],
    # Tried first by the registry's bounded search (each entry overrides the defaults).
    "grid": [{}, {"GROUP": 1}, {"SPLIT": 1}, {"num_stages": 3}, {"ORDER": "natural"}, {"BLOCK_N": 32}],
}
PARAMS = dict(META["defaults"])

import numpy as np
import torch
import triton
import triton.language as tl

from sparseditto.formats import BSR
from sparseditto.kernel_templates import runtime as rt

_BLOCK_SIZES = (16, 32, 64, 128)
_MIN_DOT = 16
_AUTO_FILL_SLACK = 1.15   # "auto" block shape: largest block storing <= 15% more than the best
_GROUP_TARGET_K = 64      # "auto" GROUP: put >= 64 columns of blocks into each dot ...
_GROUP_MAX_PAD = 0.125    # ... unless padding block rows to whole groups adds > 12.5% blocks
_STAGE_SMEM_BUDGET = 96 * 1024  # shared memory the "auto" pipeline depth may spend on A/B buffers


@triton.jit
def _dot_acc(a, b, acc, UPCAST: tl.constexpr, IN_PREC: tl.constexpr):
    """acc += a @ b in fp32. UPCAST: the Triton interpreter multiplies bf16 as raw uint16, so there
    (only) bf16 operands are widened to fp32 first; compiled kernels never set it."""
    if UPCAST:
        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        acc = tl.dot(a.to(b.dtype), b, acc, input_precision=IN_PREC)
    return acc


@triton.jit
def _write_tile(acc, out_ptr, ws_ptr, cnt_ptr, tile, pid_k, rows, cols, M, N, stride_om, stride_on,
                NUM_TILES, BM: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr):
    """Store the fp32 tile to C, or (split-K) publish it and let the last arriving split reduce.

    The reduction sums partials in split order (the caller's own partial taken from registers),
    so the result does not depend on which split finished last.
    """
    c_ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_om + cols[None, :] * stride_on
    c_mask = (rows < M)[:, None] & (cols < N)[None, :]
    if SPLIT == 1:
        tl.store(c_ptrs, acc.to(out_ptr.dtype.element_ty), mask=c_mask)
    else:
        w_offs = tl.arange(0, BM)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        w_tile = ws_ptr + tile.to(tl.int64) * (BM * BLOCK_N) + w_offs
        tl.store(w_tile + pid_k.to(tl.int64) * NUM_TILES * (BM * BLOCK_N), acc)
        tl.debug_barrier()  # every thread's partial is written before the release below
        arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT - 1:
            total = tl.zeros((BM, BLOCK_N), tl.float32)
            for s in tl.static_range(SPLIT):
                part = tl.load(w_tile + s * NUM_TILES * (BM * BLOCK_N), mask=c_mask & (pid_k != s),
                               other=0.0, cache_modifier=".cg")
                total += tl.where(pid_k == s, acc, part)
            tl.store(c_ptrs, total.to(out_ptr.dtype.element_ty), mask=c_mask)
            tl.atomic_xchg(cnt_ptr + tile, 0)  # ready for the next launch


@triton.jit
def _load_b(ptrs, krow, K, n_mask, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, CHECK_NEG: tl.constexpr):
    """Load a [rows, BLOCK_N] tile of B, masking only what can actually fall outside B."""
    if EVEN_K and EVEN_N and not CHECK_NEG:
        b = tl.load(ptrs)
    else:
        ok = krow < K
        if CHECK_NEG:
            ok = ok & (krow >= 0)
        b = tl.load(ptrs, mask=ok[:, None] & n_mask[None, :], other=0.0)
    return b


@triton.jit
def _bsr_tc_kernel(
    gptr_ptr, gidx_ptr, blocks_ptr, order_ptr, b_ptr, out_ptr, ws_ptr, cnt_ptr,
    M, N, K, N_TILES, NUM_TILES,
    stride_bk, stride_bn, stride_om, stride_on,
    BM: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, NUM_STAGES: tl.constexpr,
    UPCAST: tl.constexpr, IN_PREC: tl.constexpr,
):
    pid = tl.program_id(0)          # slot * N_TILES + N tile: a block row's N tiles are adjacent
    pid_k = tl.program_id(1)        # split index
    slot = pid // N_TILES
    pid_n = pid % N_TILES
    # Groups are stored in launch (slot) order, so the extent loads depend on the slot alone and
    # issue together with the block-row id that only the final store needs.
    brow = tl.load(order_ptr + slot)
    start = tl.load(gptr_ptr + slot)
    end = tl.load(gptr_ptr + slot + 1)
    if SPLIT > 1:
        chunk = tl.cdiv(end - start, SPLIT)
        lo = tl.minimum(start + pid_k * chunk, end)
        hi = tl.minimum(lo + chunk, end)
    else:
        lo = start
        hi = end

    GK: tl.constexpr = GROUP * BK   # K extent of one group of blocks stored side by side
    rm = tl.arange(0, BM)
    rc = tl.arange(0, GK)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = cols < N
    a_base = blocks_ptr + lo.to(tl.int64) * (BM * GK) + (rm[:, None] * GK + rc[None, :])
    acc = tl.zeros((BM, BLOCK_N), tl.float32)
    for g in tl.range(lo, hi, num_stages=NUM_STAGES):
        a = tl.load(a_base + (g - lo) * (BM * GK))       # groups of a block row are contiguous

        if GROUP == 1:
            kk = tl.load(gidx_ptr + g) * BK + rc
        else:
            kk = tl.load(gidx_ptr + g * GROUP + rc // BK) * BK + rc % BK     # -1 * BK.. for padding
        b = _load_b(b_ptr + kk.to(tl.int64)[:, None] * stride_bk + cols[None, :] * stride_bn,
                    kk, K, n_mask, EVEN_K, EVEN_N, GROUP > 1)
        acc = _dot_acc(a, b, acc, UPCAST, IN_PREC)

    _write_tile(acc, out_ptr, ws_ptr, cnt_ptr, pid, pid_k, brow * BM + rm, cols, M, N,
                stride_om, stride_on, NUM_TILES, BM, BLOCK_N, SPLIT)


# ---- host side ----------------------------------------------------------------------------------

def _occupancy16(A) -> np.ndarray:
    """Boolean [ceil(M/16), ceil(K/16)] grid: which 16x16 tiles hold a stored entry."""
    M, K = A.shape
    mb, kb = -(-M // 16), -(-K // 16)
    occ = np.zeros(mb * kb, dtype=bool)
    occ[(A.row_ids() // 16) * kb + A.indices.astype(np.int64) // 16] = True
    return occ.reshape(mb, kb)


def _stored_blocks(occ16: np.ndarray, bm: int, bk: int) -> int:
    """Nonzero (bm x bk) blocks, by OR-pooling the 16x16 occupancy grid (bm, bk multiples of 16)."""
    fm, fk = bm // 16, bk // 16
    mb, kb = occ16.shape
    padded = np.zeros((-(-mb // fm) * fm, -(-kb // fk) * fk), dtype=bool)
    padded[:mb, :kb] = occ16
    return int(padded.reshape(padded.shape[0] // fm, fm, padded.shape[1] // fk, fk).any(axis=(1, 3)).sum())


def choose_block_shape(A) -> tuple[int, int]:
    """The block shape BM/BK="auto" uses: fewest stored elements (values + padding zeros), and
    among shapes within 15% of that, the largest block (longer dots, fewer index loads)."""
    occ = _occupancy16(A)
    cands = []
    for bm in _BLOCK_SIZES:
        for bk in _BLOCK_SIZES:
            cands.append((_stored_blocks(occ, bm, bk) * bm * bk, bm, bk))
    best = min(c[0] for c in cands)
    eligible = [c for c in cands if c[0] <= best * _AUTO_FILL_SLACK]
    _, bm, bk = max(eligible, key=lambda c: (c[1] * c[2], c[2], -c[0]))
    return bm, bk


def _resolve_block_shape(A) -> tuple[int, int]:
    bm, bk = PARAMS["BM"], PARAMS["BK"]
    if bm == "auto" or bk == "auto":
        abm, abk = choose_block_shape(A)
        bm = abm if bm == "auto" else bm
        bk = abk if bk == "auto" else bk
    # tl.dot needs >= 16 in every dimension: smaller analyzer blocks are re-blocked at 16.
    return max(int(bm), _MIN_DOT), max(int(bk), _MIN_DOT)


def choose_group(lengths: np.ndarray, bk: int) -> int:
    """GROUP="auto": blocks per loop step so that one dot spans >= 64 columns (bigger loads in
    flight per step), backing off while the zero blocks that pad rows to whole groups exceed 12.5%."""
    total = max(int(lengths.sum()), 1)
    group = max(1, min(8, _GROUP_TARGET_K // bk))
    while group > 1 and (int((-(-lengths // group)).sum()) * group - total) / total > _GROUP_MAX_PAD:
        group //= 2
    return group


def _group_blocks(bsr, group: int):
    """Store each block row's blocks `group` at a time side by side: [ngroups, bm, group*bk].

    Rows are padded to whole groups with zero blocks whose block-column id is -1 (the kernel masks
    their B rows). Returns (group pointer [Mb+1], block-column ids [ngroups*group], grouped blocks).
    """
    bm, bk = bsr.block_shape
    lengths = np.diff(bsr.indptr.astype(np.int64))
    groups = -(-lengths // group)
    gptr = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(groups, out=gptr[1:])
    ngroups = int(gptr[-1])
    brow = np.repeat(np.arange(lengths.size), lengths)
    pos = np.arange(bsr.nblocks, dtype=np.int64) - bsr.indptr[brow].astype(np.int64)
    slot = (gptr[brow] + pos // group) * group + pos % group
    gidx = np.full(max(ngroups * group, 1), -1, dtype=np.int32)
    gidx[slot] = bsr.indices
    blocks = np.zeros((max(ngroups, 1) * group, bm, bk), dtype=np.float32)
    blocks[slot] = bsr.blocks
    blocks = blocks.reshape(-1, group, bm, bk).transpose(0, 2, 1, 3).reshape(-1, bm, group * bk)
    return gptr.astype(np.int32), gidx, np.ascontiguousarray(blocks)


def prepare(A, dtype, device) -> dict:
    """BSR at the chosen block shape, grouped for the kernel and stored in launch order (block rows
    longest first with ORDER="length"), plus each launch slot's block row."""
    rt.check_params(META, PARAMS)
    dtype = rt.torch_dtype(dtype)
    bm, bk = _resolve_block_shape(A)
    bsr = BSR.from_matrix(A, block_shape=(bm, bk))
    lengths = np.diff(bsr.indptr.astype(np.int64))
    group = PARAMS["GROUP"]
    group = choose_group(lengths, bk) if group == "auto" else int(group)
    gptr, gidx, blocks = _group_blocks(bsr, group)
    if PARAMS["ORDER"] == "length":
        order = np.argsort(-lengths, kind="stable").astype(np.int32)
    else:
        order = np.arange(lengths.size, dtype=np.int32)
    # Re-store the groups slot by slot: slot s (block row order[s]) owns groups [sptr[s], sptr[s+1]).
    gptr64 = gptr.astype(np.int64)
    counts = np.diff(gptr64)[order]
    sptr = np.zeros(order.size + 1, dtype=np.int64)
    np.cumsum(counts, out=sptr[1:])
    src = np.repeat(gptr64[:-1][order] - sptr[:-1], counts) + np.arange(int(sptr[-1]), dtype=np.int64)
    if src.size:
        blocks = np.ascontiguousarray(blocks[src])
        gidx = np.ascontiguousarray(gidx.reshape(-1, group)[src].reshape(-1))
    return {
        "gptr": torch.from_numpy(sptr.astype(np.int32)).to(device),
        "gidx": torch.from_numpy(gidx).to(device),
        "blocks": torch.from_numpy(blocks).to(device=device, dtype=dtype),
        "order": torch.from_numpy(order if order.size else np.zeros(1, np.int32)).to(device),
        "shape": tuple(A.shape), "block_shape": (bm, bk), "group": group,
        "block_rows": int(lengths.size), "nblocks": bsr.nblocks,
        "max_row_groups": int(counts.max()) if counts.size else 0,
        "dtype": dtype, "scratch": {},
    }


def launch_config(packed: dict, N: int, sms: int = rt.DEFAULT_SMS,
                  smem_limit: int = rt.DEFAULT_SMEM_PER_BLOCK) -> dict:
    """Tile, split, warps and pipeline depth for N (the "auto" rules); pure Python."""
    bm, bk = packed["block_shape"]
    block_n = PARAMS["BLOCK_N"]
    if block_n == "auto":
        # H200, N = 2048, 10% of blocks kept: BLOCK_N 256 with 8 warps beat 128 with 4
        # (32x32 blocks 48.6 vs 51.3 us, 64x64 blocks 27.6 vs 28.5 us).
        block_n = 16 if N <= 16 else min(1 << (N - 1).bit_length(), 256 if bm <= 64 else 64)
    n_tiles = -(-N // block_n)
    tiles = packed["block_rows"] * n_tiles
    split = PARAMS["SPLIT"]
    if split == "auto":
        # Only when the tiles leave most SMs idle (fewer than half of them busy): ~2 programs per
        # SM, each split keeping >= 2 groups of a long row. The workspace round trip costs a few
        # dependent memory latencies (H200, 128 block rows of 32x32 at N = 16: SPLIT 1 9.2 us,
        # SPLIT 2 9.6 us, SPLIT 4 10.1 us).
        want = -(-2 * sms // max(tiles, 1)) if 2 * tiles <= sms else 1
        cap = max(1, min(8, want, packed["max_row_groups"] // 2))
        split = 1 << (cap.bit_length() - 1)
    warps = PARAMS["num_warps"]
    if warps == "auto":
        # Registers hold the fp32 accumulator and the A tile's addresses: big tiles need 8 warps.
        area, a_elems = bm * block_n, bm * packed["group"] * bk
        if area <= 512 and a_elems <= 1024:
            warps = 2
        elif area >= 128 * 64 or a_elems >= 128 * 128:
            warps = 8
        else:
            warps = 4
    stages = PARAMS["num_stages"]
    if stages == "auto":
        # The block-column load feeds B's address, so Triton prefetches A/B only
        # (num_stages - 1) // 2 steps ahead: small steps want deep pipelines, big ones fit 2-3.
        step_bytes = (bm * packed["group"] * bk + packed["group"] * bk * block_n) * packed["dtype"].itemsize
        stages = max(2, min(5, rt.stage_budget(_STAGE_SMEM_BUDGET, smem_limit) // step_bytes + 1))
    return {"BLOCK_N": int(block_n), "n_tiles": n_tiles, "tiles": tiles, "SPLIT": int(split),
            "num_warps": int(warps), "num_stages": int(stages)}


def _plan(packed: dict, B, out) -> dict:
    """Grid, constexprs, split-K workspace and argument list for one (N, B/C layout)."""
    M, K = packed["shape"]
    N = int(B.shape[1])
    bm, bk = packed["block_shape"]
    cfg = launch_config(packed, N, rt.sm_count(B.device), rt.smem_per_block(B.device))
    tiles, split, block_n = cfg["tiles"], cfg["SPLIT"], cfg["BLOCK_N"]
    if split > 1:
        ws = torch.empty(split * tiles * bm * block_n, dtype=torch.float32, device=B.device)
        cnt = torch.zeros(tiles, dtype=torch.int32, device=B.device)
    else:
        ws = torch.empty(1, dtype=torch.float32, device=B.device)
        cnt = torch.zeros(1, dtype=torch.int32, device=B.device)
    named = dict(
        gptr_ptr=packed["gptr"], gidx_ptr=packed["gidx"], blocks_ptr=packed["blocks"], order_ptr=packed["order"],
        b_ptr=None, out_ptr=None, ws_ptr=ws, cnt_ptr=cnt, M=M, N=N, K=K, N_TILES=cfg["n_tiles"], NUM_TILES=tiles,
        stride_bk=B.stride(0), stride_bn=B.stride(1), stride_om=out.stride(0), stride_on=out.stride(1),
        BM=bm, BK=bk, GROUP=packed["group"], BLOCK_N=block_n, SPLIT=split,
        EVEN_K=(K % bk == 0), EVEN_N=(N % block_n == 0), NUM_STAGES=cfg["num_stages"],
        UPCAST=(B.dtype == torch.bfloat16 and B.device.type != "cuda"),
        IN_PREC="ieee" if (B.dtype == torch.float32 and PARAMS["FP32_DOT"] == "ieee") else "tf32")
    return rt.make_plan(_bsr_tc_kernel, named, (tiles, split, 1),
                        {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]},
                        config=cfg, ws=ws, cnt=cnt)


def spmm(packed: dict, B, out) -> None:
    """out[M, N] = A @ B for B [K, N] (any strides); fp32 accumulation; out in B's dtype."""
    rt.run_plans(packed, B, out, _plan, META, PARAMS, same_dtype=True)
