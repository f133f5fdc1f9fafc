"""Bitmap-tile SpMM on tensor cores for 50-95% unstructured sparsity at small N (decode).

Why this template exists: unstructured pruning leaves no blocks and no n:m shape, and at small N
the SpMM is memory-bound, so the index bytes decide: int32 CSR costs 4 bytes per nonzero (break
even with dense near 67% sparsity at fp16), a bitmap costs 1 bit per *element* (1/8 byte), so
A costs 2 bytes per nonzero + 1/8 byte per element and beats dense bytes from ~6% sparsity on.
"Load as sparse, compute as dense": each program expands the packed values of its rows into a
dense register tile and runs a tensor-core dot, so no CUDA-core FMA loop over nonzeros is needed.

Layout (repacked in prepare from sparseditto.formats.BitmapTiles, tile_k = 32): one int32 mask
per (row, 32-column tile), stored tile-major [T, M] so the BLOCK_M masks of one tile are one
coalesced load; values in CSR order; the offset of each (row, tile) in the values, tile-major.
Per program (BLOCK_M rows x BLOCK_N columns x a 1/SPLIT_K slice of K), per tile:
    count[r]      = popcount(mask[r])
    prefix[r, j]  = popcount(mask[r] & ((1 << j) - 1))
    a[r, j]       = values[offset[r] + prefix[r, j]] if bit j of mask[r] else 0
    acc          += a @ B[32 tile rows, BLOCK_N]               tl.dot, fp32 accumulate
GATHER="window" (default) loads each row's `count` values of the tile as one contiguous window
(threads run along the row, so a warp's load touches one or two 32-byte sectors) and places
them with a warp-local register gather (tl.gather -> shuffles); GATHER="direct" loads each
element from values[offset + prefix] with a predicated gather: fewer instructions, but Triton
lays that load out with the 32 lanes of a warp on 32 different rows, i.e. 32 cache lines per
load instruction. KW tiles are handled per loop step (KW*32 columns).
OFFSETS="running" reads the offset only at the first tile of the program's K slice and advances
it by count per tile (metadata = the masks alone: 1/8 byte per element); "stored" reads the
per-tile offsets (+1/8 byte per element) but keeps every tile's loads independent of the
previous tile. POPC="auto" uses the hardware popc instruction on CUDA and a SWAR popcount
elsewhere (the Triton interpreter runs no inline assembly).
Split-K as in the other tensor-core templates: fp32 partials in a workspace, the last split of a
tile reduces them in a fixed order in the same launch (so concurrent launches of one prepared
matrix on several streams are unsafe when SPLIT_K > 1). BLOCK_M="auto": 64 at N <= 16, 32 above
(measured on an H200, docs/kernels.md); num_stages is lowered until the shared memory fits. The
launch is planned once per (N, B/C layout) and cached in packed["scratch"].
"""
META = {
    "name": "bitmap_tiles",
    "backend": "triton",
    "format": "bitmap",
    "description": "Bitmap tiles (32-bit mask per 32 columns + packed values): popcount gather into a dense register tile, tl.dot, fp32 accumulate, split-K",
    "params": {
        "BLOCK_M": ["auto", 16, 32, 64, 128],
        "KW": [1, 2, 4],
        "BLOCK_N": ["auto", 16, 32, 64, 128],
        "SPLIT_K": ["auto", 1, 2, 4, 8, 16],
        "OFFSETS": ["running", "stored"],
        "GATHER": ["window", "direct"],
        "POPC": ["auto", "swar"],
        "FP32_DOT": ["ieee", "tf32"],
        "num_warps": ["auto", 1, 2, 4, 8],
        "num_stages": ["auto", 1, 2, 3, 4],
    },
    "defaults": {
        "BLOCK_M": "auto",
        "KW": 2,
        "BLOCK_N": "auto",
        "SPLIT_K": "auto",
        "OFFSETS": "running",
        "GATHER": "window",
        "POPC": "auto",
        "FP32_DOT": "ieee",
        "num_warps": "auto",
        "num_stages": "auto",
    },
    "patterns": ["unstructured", "random", "moderate_sparsity"],
    # Tried first by the registry's bounded search (each entry overrides the defaults).
    "grid": [{}, {"OFFSETS": "stored"}, {"BLOCK_M": 32}, {"KW": 4}, {"BLOCK_M": 128, "num_warps": 8},
             {"SPLIT_K": 1}],
}
PARAMS = dict(META["defaults"])

import numpy as np
import torch
import triton
import triton.language as tl

from sparseditto.formats import BitmapTiles
from sparseditto.kernel_templates import runtime as rt

_TILE_K = 32
_AUTO_PAD_M = 64            # BLOCK_M="auto": rows padded for the largest launch-time choice


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
def _popcount(x, USE_POPC: tl.constexpr):
    """Population count of int32 lanes: the popc instruction on CUDA, SWAR arithmetic otherwise."""
    if USE_POPC:
        c = tl.inline_asm_elementwise("popc.b32 $0, $1;", "=r,r", [x], dtype=tl.int32,
                                      is_pure=True, pack=1)
    else:
        # Arithmetic shifts are safe: every mask below drops the sign-extended bits.
        y = x - ((x >> 1) & 0x55555555)
        y = (y & 0x33333333) + ((y >> 2) & 0x33333333)
        y = (y + (y >> 4)) & 0x0F0F0F0F
        y = y + (y >> 8)
        y = y + (y >> 16)
        c = y & 0x3F
    return c


@triton.jit
def _load_b(ptrs, krow, K, n_mask, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr):
    """Load a [rows, BLOCK_N] tile of B, masking only what can actually fall outside B."""
    if EVEN_K and EVEN_N:
        b = tl.load(ptrs)
    elif EVEN_K:
        b = tl.load(ptrs, mask=n_mask[None, :], other=0.0)
    else:
        b = tl.load(ptrs, mask=(krow < K)[:, None] & n_mask[None, :], other=0.0)
    return b


@triton.jit
def _bitmap_kernel(
    masks_ptr, offs_ptr, vals_ptr, b_ptr, out_ptr, ws_ptr, cnt_ptr,
    M, N, K, MP, N_TILES, NUM_TILES, NSTEPS,
    stride_bk, stride_bn, stride_om, stride_on,
    KW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
    RUNNING: tl.constexpr, WINDOW: tl.constexpr, USE_POPC: tl.constexpr, NUM_STAGES: tl.constexpr,
    UPCAST: tl.constexpr, IN_PREC: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
):
    pid = tl.program_id(0)          # row tile * N_TILES + N tile
    pid_k = tl.program_id(1)        # split index
    pid_m = pid // N_TILES
    pid_n = pid % N_TILES
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)          # < padded M: no mask on A metadata
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = cols < N
    steps_per = tl.cdiv(NSTEPS, SPLIT)
    s_lo = pid_k * steps_per
    s_hi = tl.minimum(s_lo + steps_per, NSTEPS)
    jj = tl.arange(0, 32)
    bit = (1 << jj)[None, :]
    below = ((1 << jj) - 1)[None, :]                         # bits under column j (wraps at 31)
    if RUNNING:
        off = tl.load(offs_ptr + (s_lo * KW).to(tl.int64) * MP + rows)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in tl.range(s_lo, s_hi, num_stages=NUM_STAGES):
        for w in tl.static_range(KW):
            t = step * KW + w
            mask = tl.load(masks_ptr + t.to(tl.int64) * MP + rows)
            if RUNNING:
                base = off
            else:
                base = tl.load(offs_ptr + t.to(tl.int64) * MP + rows)
            count = _popcount(mask, USE_POPC)                       # per row, not per element
            prefix = _popcount(mask[:, None] & below, USE_POPC)
            present = (mask[:, None] & bit) != 0
            if WINDOW:
                # The row's values for this tile are contiguous: load them as a window (threads
                # along j, so one warp reads one row's sectors), then place each one with a
                # warp-local register gather.
                win = tl.load(vals_ptr + (base[:, None] + jj[None, :]), mask=jj[None, :] < count[:, None],
                              other=0.0)
                a = tl.where(present, tl.gather(win, prefix, axis=1), tl.zeros_like(win))
            else:
                a = tl.load(vals_ptr + (base[:, None] + prefix), mask=present, other=0.0)
            krow = t * 32 + jj
            b = _load_b(b_ptr + krow.to(tl.int64)[:, None] * stride_bk + cols[None, :] * stride_bn,
                        krow, K, n_mask, EVEN_K, EVEN_N)
            acc = _dot_acc(a, b, acc, UPCAST, IN_PREC)
            if RUNNING:
                off = base + count

    _write_tile(acc, out_ptr, ws_ptr, cnt_ptr, pid, pid_k, rows, cols, M, N,
                stride_om, stride_on, NUM_TILES, BLOCK_M, BLOCK_N, SPLIT)


# ---- host side ----------------------------------------------------------------------------------

def prepare(A, dtype, device) -> dict:
    """BitmapTiles (tile_k = 32) repacked tile-major for coalesced mask/offset loads."""
    rt.check_params(META, PARAMS)
    dtype = rt.torch_dtype(dtype)
    fmt = BitmapTiles.from_matrix(A, tile_k=_TILE_K)
    M, K = A.shape
    T = fmt.masks.shape[1]
    # "auto" picks BLOCK_M per N at launch (64 or 32): pad rows for the largest.
    kw = int(PARAMS["KW"])
    block_m = _AUTO_PAD_M if PARAMS["BLOCK_M"] == "auto" else int(PARAMS["BLOCK_M"])
    steps = max(1, -(-T // kw))
    Tp, Mp = steps * kw, -(-M // block_m) * block_m
    masks = np.zeros((Tp, Mp), dtype=np.int32)
    masks[:T, :M] = fmt.masks.T
    # Offsets [Tp + 1, Mp]: row t = first value of tile t; tiles past the end = the row's end, so a
    # split starting at any step (even an empty one) reads a valid offset.
    offs = np.zeros((Tp + 1, Mp), dtype=np.int32)
    offs[:, :M] = fmt.row_offsets[1:][None, :]
    offs[:T, :M] = fmt.tile_offsets.T
    values = fmt.values if fmt.nnz else np.zeros(1, dtype=np.float32)
    return {
        "masks": torch.from_numpy(np.ascontiguousarray(masks)).to(device),
        "offsets": torch.from_numpy(np.ascontiguousarray(offs)).to(device),
        "values": torch.from_numpy(np.ascontiguousarray(values)).to(device=device, dtype=dtype),
        "shape": (M, K), "steps": steps, "padded_rows": Mp, "KW": kw, "pad_m": block_m,
        "nnz": fmt.nnz, "dtype": dtype, "scratch": {},
    }


_SMEM_LIMIT = rt.DEFAULT_SMEM_PER_BLOCK   # off the GPU; a launch passes its device's (rt.smem_per_block)
_SMEM_MARGIN = rt.SMEM_HEADROOM   # headroom for what the estimate leaves out (barriers, epilogue)


def smem_estimate(packed: dict, block_m: int, block_n: int, stages: int) -> int:
    """Shared memory of the pipelined main loop, in bytes: (stages - 1) buffers of one K step (the
    masks, the stored offsets, the B rows) plus one more B step (dot operand staging)."""
    bm, kw, vb = block_m, packed["KW"], packed["dtype"].itemsize
    b_step = kw * _TILE_K * block_n * vb
    step = bm * 4 * kw * (1 if PARAMS["OFFSETS"] == "running" else 2) + b_step
    return max(1, stages - 1) * step + b_step


def launch_config(packed: dict, N: int, sms: int = rt.DEFAULT_SMS, smem_limit: int = _SMEM_LIMIT) -> dict:
    """Tiles, split, warps and pipeline depth for N; pure Python. num_stages (3 when "auto") is
    lowered until the shared-memory estimate fits the device's ``smem_limit``."""
    block_m = PARAMS["BLOCK_M"]
    if block_m == "auto":
        # H200: BLOCK_M 64 at N = 16 (unstructured 90%: 37.1 us; 32: 40.6 us, 16: 51.3 us);
        # 32 at larger N (DLMC at N = 256: the fastest template on 6 of 8 matrices).
        block_m = 64 if N <= 16 else 32
    block_m = int(block_m)
    if packed["pad_m"] % block_m:
        raise ValueError(f"bitmap_tiles: BLOCK_M={block_m} does not divide the prepared row padding "
                         f"{packed['pad_m']}; prepare with the same PARAMS.")
    block_n = PARAMS["BLOCK_N"]
    if block_n == "auto":
        block_n = 16 if N <= 16 else min(1 << (N - 1).bit_length(), 128)
    stages = 3 if PARAMS["num_stages"] == "auto" else int(PARAMS["num_stages"])
    while stages > 1 and smem_estimate(packed, block_m, block_n, stages) > smem_limit - _SMEM_MARGIN:
        stages -= 1
    n_tiles = -(-N // block_n)
    tiles = (packed["padded_rows"] // block_m) * n_tiles
    split = PARAMS["SPLIT_K"]
    if split == "auto":
        # ~4 programs per SM: the value gathers depend on the masks loaded in the same step, so
        # latency is hidden by programs, not by the pipeline; each split keeps >= 2 K steps.
        want = -(-4 * sms // tiles)
        cap = max(1, min(16, want, packed["steps"] // 2))
        split = 1 << (cap.bit_length() - 1)
    warps = PARAMS["num_warps"]
    if warps == "auto":
        warps = 8 if block_m * block_n >= 128 * 128 else 4
    return {"BLOCK_M": block_m, "BLOCK_N": int(block_n), "n_tiles": n_tiles, "tiles": tiles, "SPLIT": int(split),
            "num_warps": int(warps), "num_stages": int(stages)}


def _plan(packed: dict, B, out) -> dict:
    """Grid, constexprs, split-K workspace and argument list for one (N, B/C layout)."""
    M, K = packed["shape"]
    N = int(B.shape[1])
    cfg = launch_config(packed, N, rt.sm_count(B.device), rt.smem_per_block(B.device))
    block_m = cfg["BLOCK_M"]
    tiles, split, block_n = cfg["tiles"], cfg["SPLIT"], cfg["BLOCK_N"]
    if split > 1:
        ws = torch.empty(split * tiles * block_m * block_n, dtype=torch.float32, device=B.device)
        cnt = torch.zeros(tiles, dtype=torch.int32, device=B.device)
    else:
        ws = torch.empty(1, dtype=torch.float32, device=B.device)
        cnt = torch.zeros(1, dtype=torch.int32, device=B.device)
    named = dict(
        masks_ptr=packed["masks"], offs_ptr=packed["offsets"], vals_ptr=packed["values"], b_ptr=None,
        out_ptr=None, ws_ptr=ws, cnt_ptr=cnt,
        M=M, N=N, K=K, MP=packed["padded_rows"], N_TILES=cfg["n_tiles"], NUM_TILES=tiles, NSTEPS=packed["steps"],
        stride_bk=B.stride(0), stride_bn=B.stride(1), stride_om=out.stride(0), stride_on=out.stride(1),
        KW=packed["KW"], BLOCK_M=block_m, BLOCK_N=block_n, SPLIT=split,
        RUNNING=PARAMS["OFFSETS"] == "running", WINDOW=PARAMS["GATHER"] == "window",
        USE_POPC=(B.device.type == "cuda" and PARAMS["POPC"] == "auto"),
        NUM_STAGES=cfg["num_stages"],
        UPCAST=(B.dtype == torch.bfloat16 and B.device.type != "cuda"),
        IN_PREC="ieee" if (B.dtype == torch.float32 and PARAMS["FP32_DOT"] == "ieee") else "tf32",
        EVEN_K=(K % (_TILE_K * packed["KW"]) == 0), EVEN_N=(N % block_n == 0))
    return rt.make_plan(_bitmap_kernel, named, (tiles, split, 1),
                        {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]},
                        config=cfg, ws=ws, cnt=cnt)


def spmm(packed: dict, B, out) -> None:
    """out[M, N] = A @ B for B [K, N] (any strides); fp32 accumulation; out in B's dtype."""
    rt.run_plans(packed, B, out, _plan, META, PARAMS, same_dtype=True)
