"""N:M compressed SpMM (2:4 and friends) on dense tensor cores: load compressed, expand cheaply, dot.

Why this template exists: an n:m-pruned weight (2:4 above all) needs only the kept values plus a
few bits of position per value (2:4: 2 bytes + 2 bits = 2.25 bytes per kept value, 56% of dense
bytes), so at small N, where SpMM is memory-bound, it can beat dense cuBLAS by up to ~1.78x, and
without the hardware sparse MMA. The catch (measured on an H200, fp16 4096x4096, N=16, cold L2):
a straightforward expand (a `where` per (slot, position), tl.join into one [BM, 4*BG] tile, one
dot) ran 26.8 us against cuBLAS's 17.3 us: the expand and its register shuffles, not the bytes,
were the cost. This template therefore splits the product by position inside the group,
    A @ B = sum_{p < m} D_p @ B[p::m, :],   D_p[r, g] = value of row r at column g*m + p (or 0),
so each D_p is an elementwise function of the compressed tiles in exactly their [BM, BG] shape
(no join, reshape or gather: Triton loads the tiles straight into the dot-operand registers),
and the m dots have the same total K as one dense dot. Expands (EXPAND):

  * "bits" (2:4, the "auto" choice there): the metadata nibble of a group is its occupancy mask
    b0..b3 (exactly two bits set; still 2 bits per kept value) and
        D0 = b0 ? v0 : 0,  D1 = b1 ? (b0 ? v1 : v0) : 0,  D2 = b2 ? (b3 ? v0 : v1) : 0,  D3 = b3 ? v1 : 0.
    On CUDA with 16-bit values (BITS_LOGIC="ptx") this runs as 16 PTX instructions per *pair*
    of groups on packed f16x2/bf16x2 registers (per-lane masks by shift + sign-replicating prmt,
    then and/lop3): 4 instructions per kept value, no unpacking. Elsewhere (interpreter, fp32,
    BITS_LOGIC="triton") the same formulas run as tl.where.
  * "planes" (any n <= 4, the "auto" choice for other n:m): positions stored as ceil(log2 m)-bit
    fields; slot s can only sit at positions s..s+m-n (positions strictly increase), so D_p costs
    one compare+select per feasible slot: m-n+1 per kept value.
  * "select": the simple reference expand: one dense [BM, BG*m] tile where column c takes the
    slot whose position is c % m (values and metadata loaded with a repeated index c // m), then
    one dot. Same HBM bytes, many more instructions.
docs/kernels.md gives the sm_90 instruction counts of each (from the compiled SASS).

Layout (repacked in prepare): per row, per K step of F*BG groups, the values are slot-planar
[n, F, BG] (every load is a contiguous, unmasked [BM, BG] tile) and the metadata is BG words of
8/16/32 bits; word h holds, for sub-tile j < F, group h's code at bits [j*cb, (j+1)*cb). For 2:4:
uint8 words, F = 2, exactly 2 bits per kept value, one metadata load feeds two sub-tiles. Rows
are padded to BLOCK_M and groups to whole steps with zeros, so A loads need no masks; B rows >= K
and C are masked only when K or N do not divide the tiles.

Groups that hold more than n entries keep their n largest (NMCompressed) and the rest go to a
residual CSR, which split 0 of each row tile adds with a short gather loop, so results stay
exact for any matrix. Split-K (SPLIT_K) fills 132 SMs when M/BLOCK_M is small: partial tiles go
to an fp32 workspace and the last split of a tile (acq_rel atomic counter) reduces them in a fixed
order in the same launch. Counters make concurrent launches of one prepared matrix on several
streams unsafe when SPLIT_K > 1. BLOCK_M="auto" is 64 for N <= 64 and 128 above (rows are padded
to 128 so one prepared matrix serves both); the pipeline depth (and an "auto" BLOCK_N) is lowered
until the shared-memory estimate fits the device (smem_estimate: at N = 2048, 3 stages of
128-column B tiles would need 233472 B > 227 KiB). The launch is planned once per (N, B/C
layout) and cached in packed["scratch"]; later calls launch Triton's compiled kernel directly.
"""
META = {
    "name": "nm_compressed",
    "backend": "triton",
    "format": "nm",
    "description": "N:M (2:4, 1:2, 4:8, ...) compressed SpMM: slot-planar values + packed positions, per-position plane expand, dense tl.dot, residual CSR for violations",
    "params": {
        "NM": ["2:4", "1:2", "1:4", "2:8", "4:8", "auto"],
        "EXPAND": ["auto", "bits", "planes", "select"],
        "BITS_LOGIC": ["ptx", "triton"],
        "BLOCK_M": ["auto", 16, 32, 64, 128],
        "BLOCK_G": [16, 32, 64],
        "BLOCK_N": ["auto", 16, 32, 64, 128],
        "SPLIT_K": ["auto", 1, 2, 4, 8, 16],
        "FP32_DOT": ["ieee", "tf32"],
        "num_warps": ["auto", 1, 2, 4, 8],
        "num_stages": ["auto", 1, 2, 3, 4],
    },
    "defaults": {
        "NM": "2:4",
        "EXPAND": "auto",
        "BITS_LOGIC": "ptx",
        "BLOCK_M": "auto",
        "BLOCK_G": 32,
        "BLOCK_N": "auto",
        "SPLIT_K": "auto",
        "FP32_DOT": "ieee",
        "num_warps": "auto",
        "num_stages": "auto",
    },
    "patterns": ["nm", "2:4", "n:m", "semi_structured"],
    # Tried first by the registry's bounded search (each entry overrides the defaults).
    "grid": [{}, {"BLOCK_M": 128, "num_warps": 8}, {"BLOCK_M": 32}, {"EXPAND": "planes"},
             {"BITS_LOGIC": "triton"}, {"SPLIT_K": 1}, {"EXPAND": "select"}],
}
PARAMS = dict(META["defaults"])

import math

import numpy as np
import torch
import triton
import triton.language as tl

from sparseditto.formats import NMCompressed
from sparseditto.kernel_templates import runtime as rt

_MAX_PLANE_SLOTS = 4        # "planes" keeps each slot in its own register tile: n <= 4
_AUTO_NM = ((1, 4), (2, 8), (1, 2), (2, 4), (4, 8))
_AUTO_PAD_M = 128           # BLOCK_M="auto": rows padded for the largest launch-time choice


def _bits24_ptx(j: int) -> str:
    """PTX for EXPAND="bits" (2:4), one call per pair of 16-bit values (pack=2).

    Operands: $0..$3 = planes D0..D3 (two 16-bit lanes each), $4/$5 = metadata words of the two
    lanes, $6/$7 = slot-0 / slot-1 value pairs. Bits 4j..4j+3 of a metadata word are the group's
    occupancy b0..b3 (exactly two set). Lane masks come from one shift + one sign-replicating
    byte permute per bit (bit -> bit 7 of byte 0 / byte 2 -> 0xFFFF per lane), then
        D0 = b0 ? v0 : 0            D3 = b3 ? v1 : 0
        D1 = b1 ? (b0 ? v1 : v0) : 0   D2 = b2 ? (b3 ? v0 : v1) : 0
    as and/lop3 on both lanes at once: 16 instructions per two groups, no unpacking.
    """
    lines = ["{", ".reg .b32 c, t, z, m0, m1, m2, m3, x, y;", "mov.b32 z, 0;",
             "prmt.b32 c, $4, $5, 0x5410;"]          # lane 0 metadata in bits 0..15, lane 1 in 16..31
    for i in range(4):
        shift = 7 - 4 * j - i
        if shift > 0:
            lines += [f"shl.b32 t, c, {shift};", f"prmt.b32 m{i}, t, z, 0xAA88;"]
        else:
            lines += [f"prmt.b32 m{i}, c, z, 0xAA88;"]
    lines += ["and.b32 $0, $6, m0;", "and.b32 $3, $7, m3;", "xor.b32 x, $6, $7;",
              "lop3.b32 y, $6, x, m0, 0x78;",        # v0 ^ (x & m0): v1 where b0, else v0
              "and.b32 $1, y, m1;",
              "lop3.b32 y, $7, x, m3, 0x78;",        # v1 ^ (x & m3): v0 where b3, else v1
              "and.b32 $2, y, m2;", "}"]
    return " ".join(lines)


_BITS24_PTX_J0 = tl.constexpr(_bits24_ptx(0))
_BITS24_PTX_J1 = tl.constexpr(_bits24_ptx(1))


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
def _plane(p: tl.constexpr, pos0, v0, pos1, v1, pos2, v2, pos3, v3,
           NS: tl.constexpr, MM: tl.constexpr):
    """D_p: the value at position p of every group (0 if none). Slot s can only hold positions
    s..s+MM-NS (positions strictly increase within a group), so infeasible slots cost nothing."""
    d = tl.zeros_like(v0)
    if p <= MM - NS:
        d = tl.where(pos0 == p, v0, d)
    if NS > 1:
        if p >= 1:
            if p <= MM - NS + 1:
                d = tl.where(pos1 == p, v1, d)
    if NS > 2:
        if p >= 2:
            if p <= MM - NS + 2:
                d = tl.where(pos2 == p, v2, d)
    if NS > 3:
        if p >= 3:
            if p <= MM - NS + 3:
                d = tl.where(pos3 == p, v3, d)
    return d


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
def _plane_dot(d, groups, p, b_ptr, cols, n_mask, K, stride_bk, stride_bn, acc,
               UPCAST: tl.constexpr, IN_PREC: tl.constexpr, MM: tl.constexpr,
               EVEN_K: tl.constexpr, EVEN_N: tl.constexpr):
    """acc += D_p @ B[groups * MM + p, cols]: plane p meets the B rows at offset p of each group."""
    krow = groups * MM + p
    b = _load_b(b_ptr + krow.to(tl.int64)[:, None] * stride_bk + cols[None, :] * stride_bn,
                krow, K, n_mask, EVEN_K, EVEN_N)
    return _dot_acc(d, b, acc, UPCAST, IN_PREC)


@triton.jit
def _nm_kernel(
    vals_ptr, meta_ptr, b_ptr, out_ptr, ws_ptr, cnt_ptr, rptr_ptr, rind_ptr, rval_ptr,
    M, N, K, N_TILES, NUM_TILES, NSTEPS,
    stride_bk, stride_bn, stride_om, stride_on,
    NS: tl.constexpr, MM: tl.constexpr, PB: tl.constexpr, CB: tl.constexpr, F: tl.constexpr,
    H: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
    EXPAND: tl.constexpr, HAS_RESIDUAL: tl.constexpr, NUM_STAGES: tl.constexpr,
    UPCAST: tl.constexpr, IN_PREC: tl.constexpr, USE_PTX: tl.constexpr,
    EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
):
    pid = tl.program_id(0)          # row tile * N_TILES + N tile
    pid_k = tl.program_id(1)        # split index
    pid_m = pid // N_TILES
    pid_n = pid % N_TILES
    PMASK: tl.constexpr = (1 << PB) - 1
    VSTEP: tl.constexpr = NS * F * H   # values of one row in one K step

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)          # < padded M: no mask on A
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = cols < N
    steps_per = tl.cdiv(NSTEPS, SPLIT)
    s_lo = pid_k * steps_per
    s_hi = tl.minimum(s_lo + steps_per, NSTEPS)
    v_row = vals_ptr + rows.to(tl.int64)[:, None] * (NSTEPS * VSTEP)
    m_row = meta_ptr + rows.to(tl.int64)[:, None] * (NSTEPS * H)
    hh = tl.arange(0, H)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)

    if EXPAND == "bits":
        # 2:4 only (NS == 2, MM == 4, F == 2): metadata nibble = occupancy bits of the group.
        for step in tl.range(s_lo, s_hi, num_stages=NUM_STAGES):
            w = tl.load(m_row + step * H + hh[None, :]).to(tl.int32)
            vbase = v_row + step * VSTEP + hh[None, :]
            for j in tl.static_range(F):
                v0 = tl.load(vbase + j * H)
                v1 = tl.load(vbase + (F + j) * H)
                if USE_PTX:
                    if j == 0:
                        d0, d1, d2, d3 = tl.inline_asm_elementwise(
                            _BITS24_PTX_J0, "=r,=r,=r,=r,r,r,r,r", [w, v0, v1],
                            dtype=(v0.dtype, v0.dtype, v0.dtype, v0.dtype), is_pure=True, pack=2)
                    else:
                        d0, d1, d2, d3 = tl.inline_asm_elementwise(
                            _BITS24_PTX_J1, "=r,=r,=r,=r,r,r,r,r", [w, v0, v1],
                            dtype=(v0.dtype, v0.dtype, v0.dtype, v0.dtype), is_pure=True, pack=2)
                else:
                    nib = w >> (4 * j)
                    b0 = (nib & 1) != 0
                    b1 = (nib & 2) != 0
                    b2 = (nib & 4) != 0
                    b3 = (nib & 8) != 0
                    z = tl.zeros_like(v0)
                    d0 = tl.where(b0, v0, z)
                    d1 = tl.where(b1, tl.where(b0, v1, v0), z)
                    d2 = tl.where(b2, tl.where(b3, v0, v1), z)
                    d3 = tl.where(b3, v1, z)
                groups = (step * F + j) * H + hh
                acc = _plane_dot(d0, groups, 0, b_ptr, cols, n_mask, K, stride_bk, stride_bn, acc, UPCAST, IN_PREC, MM, EVEN_K, EVEN_N)
                acc = _plane_dot(d1, groups, 1, b_ptr, cols, n_mask, K, stride_bk, stride_bn, acc, UPCAST, IN_PREC, MM, EVEN_K, EVEN_N)
                acc = _plane_dot(d2, groups, 2, b_ptr, cols, n_mask, K, stride_bk, stride_bn, acc, UPCAST, IN_PREC, MM, EVEN_K, EVEN_N)
                acc = _plane_dot(d3, groups, 3, b_ptr, cols, n_mask, K, stride_bk, stride_bn, acc, UPCAST, IN_PREC, MM, EVEN_K, EVEN_N)
    elif EXPAND == "planes":
        for step in tl.range(s_lo, s_hi, num_stages=NUM_STAGES):
            w = tl.load(m_row + step * H + hh[None, :]).to(tl.int32)
            vbase = v_row + step * VSTEP + hh[None, :]
            for j in tl.static_range(F):
                code = w >> (j * CB)
                pos0 = code & PMASK
                v0 = tl.load(vbase + j * H)
                pos1 = pos0
                v1 = v0
                pos2 = pos0
                v2 = v0
                pos3 = pos0
                v3 = v0
                if NS > 1:
                    pos1 = (code >> PB) & PMASK
                    v1 = tl.load(vbase + (F + j) * H)
                if NS > 2:
                    pos2 = (code >> (2 * PB)) & PMASK
                    v2 = tl.load(vbase + (2 * F + j) * H)
                if NS > 3:
                    pos3 = (code >> (3 * PB)) & PMASK
                    v3 = tl.load(vbase + (3 * F + j) * H)
                groups = (step * F + j) * H + hh
                for p in tl.static_range(MM):
                    d = _plane(p, pos0, v0, pos1, v1, pos2, v2, pos3, v3, NS, MM)
                    acc = _plane_dot(d, groups, p, b_ptr, cols, n_mask, K, stride_bk, stride_bn, acc,
                                     UPCAST, IN_PREC, MM, EVEN_K, EVEN_N)
    else:
        cc = tl.arange(0, H * MM)       # dense column inside a sub-tile
        gi = cc // MM                   # its group
        pc = cc % MM                    # its position inside the group
        for step in tl.range(s_lo, s_hi, num_stages=NUM_STAGES):
            w = tl.load(m_row + step * H + gi[None, :]).to(tl.int32)
            vbase = v_row + step * VSTEP + gi[None, :]
            for j in tl.static_range(F):
                code = w >> (j * CB)
                dense = tl.zeros((BLOCK_M, H * MM), dtype=vals_ptr.dtype.element_ty)
                for s in tl.static_range(NS):
                    pos = (code >> (s * PB)) & PMASK
                    v = tl.load(vbase + (s * F + j) * H)
                    dense = tl.where(pos == pc[None, :], v, dense)
                krow = (step * F + j) * (H * MM) + cc
                b = _load_b(b_ptr + krow.to(tl.int64)[:, None] * stride_bk + cols[None, :] * stride_bn,
                            krow, K, n_mask, EVEN_K, EVEN_N)
                acc = _dot_acc(dense, b, acc, UPCAST, IN_PREC)

    if HAS_RESIDUAL:
        if pid_k == 0:
            # Entries of groups that held more than n: a short CSR gather loop (rarely long).
            live_row = rows < M
            r_lo = tl.load(rptr_ptr + rows, mask=live_row, other=0)
            r_len = tl.load(rptr_ptr + rows + 1, mask=live_row, other=0) - r_lo
            longest = tl.max(r_len, axis=0)
            for i in range(0, longest):
                live = i < r_len
                col = tl.load(rind_ptr + r_lo + i, mask=live, other=0)
                val = tl.load(rval_ptr + r_lo + i, mask=live, other=0.0)
                brow = tl.load(b_ptr + col.to(tl.int64)[:, None] * stride_bk + cols[None, :] * stride_bn,
                               mask=live[:, None] & n_mask[None, :], other=0.0)
                acc += val.to(tl.float32)[:, None] * brow.to(tl.float32)

    _write_tile(acc, out_ptr, ws_ptr, cnt_ptr, pid, pid_k, rows, cols, M, N,
                stride_om, stride_on, NUM_TILES, BLOCK_M, BLOCK_N, SPLIT)


# ---- host side ----------------------------------------------------------------------------------

def choose_nm(A) -> tuple[int, int]:
    """NM="auto": the n:m (of 1:4, 2:8, 1:2, 2:4, 4:8) with the fewest bytes, counting each entry
    that spills to the residual CSR at 6 bytes (fp16 value + int32 column)."""
    M, K = A.shape
    rows, cols = A.row_ids(), A.indices.astype(np.int64)
    best = None
    for n, m in _AUTO_NM:
        G = -(-K // m)
        counts = np.bincount(rows * G + cols // m, minlength=M * G)
        spill = int(np.maximum(counts - n, 0).sum())
        bits = n * max(1, math.ceil(math.log2(m)))
        cost = M * G * n * 2 + M * G * bits / 8 + spill * 6
        if best is None or cost < best[0]:
            best = (cost, n, m)
    return best[1], best[2]


def _layout(n: int, m: int, expand: str) -> dict:
    """Metadata packing: bits per position (PB), bits per group (CB), word width (WB) and
    sub-tiles per word (F). "bits" stores the group's occupancy mask (m bits) instead of positions."""
    pb = max(1, math.ceil(math.log2(m)))
    cb = m if expand == "bits" else n * pb
    if cb > 32:
        raise ValueError(f"{n}:{m} needs {cb} metadata bits per group; nm_compressed packs at most 32.")
    wb = 8 if cb <= 8 else (16 if cb <= 16 else 32)
    return {"PB": pb, "CB": cb, "WB": wb, "F": wb // cb}


def _resolve_expand(n: int, m: int) -> str:
    expand = PARAMS["EXPAND"]
    if expand == "auto":
        expand = "bits" if (n, m) == (2, 4) else "planes"
    if expand == "bits" and (n, m) != (2, 4):
        raise ValueError(f"EXPAND='bits' is specialized for 2:4, got {n}:{m}; use EXPAND='planes' or 'select'.")
    if expand == "planes" and n > _MAX_PLANE_SLOTS:
        raise ValueError(f"EXPAND='planes' supports n <= {_MAX_PLANE_SLOTS} kept values per group, got {n}:{m}; "
                         "use EXPAND='select'.")
    if expand == "select" and m & (m - 1):
        raise ValueError(f"EXPAND='select' needs a power-of-two group size m, got {n}:{m}; use EXPAND='planes'.")
    return expand


def _slot_tables(n: int, m: int):
    """Lookup tables over all m-bit occupancy masks u (m <= 16): `full[u]` = u plus its lowest
    n - popcount(u) free positions (NMCompressed's canonical padding: a group with fewer than n
    entries is padded with zeros at the lowest free positions), `pos[u, s]` = position of slot s
    (the s-th set bit of full[u]) and `popc[u]`."""
    u = np.arange(1 << m, dtype=np.int64)
    bits = (u[:, None] >> np.arange(m)) & 1                       # [2^m, m]
    popc = bits.sum(axis=1)
    free_rank = np.cumsum(1 - bits, axis=1)                       # 1-based rank among free positions
    pad = (bits == 0) & (free_rank <= (n - popc)[:, None])
    full_bits = bits | pad
    full = (full_bits << np.arange(m)).sum(axis=1)
    slot = np.cumsum(full_bits, axis=1) - 1                       # slot index of each set position
    pos = np.zeros((1 << m, n), dtype=np.uint8)
    rows_, cols_ = np.nonzero(full_bits & (slot < n))
    pos[rows_, slot[rows_, cols_]] = cols_
    return full, pos, popc


def nm_arrays(A, n: int, m: int) -> dict:
    """Kept values [M, G*n] (float32), positions [M, G*n] (uint8) and the residual CSR (or None),
    exactly as sparseditto.formats.NMCompressed builds them. Matrices where no group holds more
    than n entries (every n:m-pruned weight) take an O(nnz) path: a group's entries are contiguous
    in CSR order, so its occupancy mask is one bitwise-or reduction, and lookup tables over the
    2^m masks give the padded slots. Otherwise NMCompressed picks the n largest per group and
    builds the residual."""
    M, K = A.shape
    G = -(-K // m)
    idx = np.int32 if M * G * n < 2**31 else np.int64
    lengths = np.diff(A.indptr)
    rows = np.repeat(np.arange(M, dtype=idx), lengths)
    cols = A.indices.astype(idx, copy=False)
    if m & (m - 1) == 0:  # shifts and masks: numpy's integer division is slow
        shift = m.bit_length() - 1
        key = rows * idx(G) + (cols >> idx(shift))
        p = cols & idx(m - 1)
    else:
        key = rows * idx(G) + cols // idx(m)
        p = cols % idx(m)
    starts = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1]))) if key.size else np.zeros(0, np.int64)
    most = int(np.diff(np.append(starts, key.size)).max()) if key.size else 0
    if m > 16 or most > n:
        fmt = NMCompressed.from_matrix(A, n=n, m=m)
        return {"values": fmt.values.astype(np.float32, copy=False).reshape(M, G * n),
                "positions": fmt.positions.reshape(M, G * n), "n": n, "m": m, "M": M, "G": G,
                "residual": fmt.residual}
    full, pos_table, popc = _slot_tables(n, m)
    bit = np.left_shift(idx(1), p)
    occ = np.zeros(M * G, dtype=idx)
    if key.size:
        occ[key[starts]] = np.bitwise_or.reduceat(bit, starts)
    sel = full[occ]                                               # [M*G] selected positions mask
    positions = pos_table[sel]                                    # [M*G, n]
    slot = popc[sel[key] & (bit - 1)]                             # selected positions under each entry
    values = np.zeros(M * G * n, dtype=np.float32)
    values[key * n + slot] = A.data
    return {"values": values.reshape(M, G * n), "positions": positions.reshape(M, G * n), "n": n, "m": m,
            "M": M, "G": G, "residual": None}


def _pack(nm: dict, block_m: int, h: int, lay: dict, expand: str):
    """Slot-planar values [Mp, steps, n, F, H] and metadata words [Mp, steps, H] (see module doc)."""
    n, F = nm["n"], lay["F"]
    M, G = nm["M"], nm["G"]
    steps = max(1, -(-G // (F * h)))
    Gp, Mp = steps * F * h, -(-M // block_m) * block_m
    vals = np.zeros((Mp, Gp, n), dtype=np.float32)
    vals[:M, :G] = nm["values"].reshape(M, G, n)
    pos = np.broadcast_to(np.arange(n, dtype=np.uint32), (Mp, Gp, n)).copy()  # canonical padding
    pos[:M, :G] = nm["positions"].reshape(M, G, n)
    planar = vals.reshape(Mp, steps, F, h, n).transpose(0, 1, 4, 2, 3)
    if expand == "bits":   # occupancy: bit p set when some slot sits at position p
        code = np.bitwise_or.reduce(np.left_shift(np.uint32(1), pos), axis=2)
    else:                  # slot s's position at bits [s*PB, (s+1)*PB)
        code = (pos << (np.arange(n, dtype=np.uint32) * np.uint32(lay["PB"]))).sum(axis=2, dtype=np.uint32)
    code = code.reshape(Mp, steps, F, h)
    words = (code << (np.arange(F, dtype=np.uint32) * np.uint32(lay["CB"]))[None, None, :, None]).sum(
        axis=2, dtype=np.uint32)
    if lay["WB"] == 8:
        words = words.astype(np.uint8)
    elif lay["WB"] == 16:
        words = words.astype(np.uint16).view(np.int16)
    else:
        words = words.view(np.int32)
    return np.ascontiguousarray(planar), np.ascontiguousarray(words), steps, Mp


def prepare(A, dtype, device) -> dict:
    """n:m kept values, positions and residual CSR, repacked slot-planar for the kernel."""
    rt.check_params(META, PARAMS)
    dtype = rt.torch_dtype(dtype)
    if PARAMS["NM"] == "auto":
        n, m = choose_nm(A)
    else:
        n, m = (int(x) for x in PARAMS["NM"].split(":"))
    expand = _resolve_expand(n, m)
    lay = _layout(n, m, expand)
    nm = nm_arrays(A, n, m)
    # "auto" picks BLOCK_M per N at launch (64 or 128): pad rows for the largest.
    h = int(PARAMS["BLOCK_G"])
    block_m = _AUTO_PAD_M if PARAMS["BLOCK_M"] == "auto" else int(PARAMS["BLOCK_M"])
    planar, words, steps, Mp = _pack(nm, block_m, h, lay, expand)
    residual = nm["residual"]
    packed = {
        "values": torch.from_numpy(planar.reshape(-1)).to(device=device, dtype=dtype),
        "meta": torch.from_numpy(words.reshape(-1)).to(device),
        "shape": tuple(A.shape), "n": n, "m": m, "steps": steps, "padded_rows": Mp,
        "layout": lay, "expand": expand, "BLOCK_G": h, "pad_m": block_m, "dtype": dtype, "scratch": {},
        "residual_nnz": 0 if residual is None else residual.nnz,
    }
    if residual is not None:
        r = residual.to_torch(device=device, dtype=dtype)
        packed.update(r_indptr=r["indptr"], r_indices=r["indices"], r_values=r["values"])
    return packed


_SMEM_LIMIT = rt.DEFAULT_SMEM_PER_BLOCK   # off the GPU; a launch passes its device's (rt.smem_per_block)
_SMEM_MARGIN = rt.SMEM_HEADROOM   # headroom for what the estimate leaves out (barriers, epilogue)


def smem_estimate(packed: dict, block_m: int, block_n: int, stages: int) -> int:
    """Shared memory Triton allocates for the pipelined main loop, in bytes: (stages - 1) buffers
    of one K step (values + metadata + the B rows of every plane) plus one more B step (the dot
    operand staging). Matches sm_90 compiles: 2:4, BLOCK_M 64, BLOCK_G 32, BLOCK_N 16 / 3 stages
    -> 61440 B; BLOCK_N 128 / 3 stages -> 233472 B (over the 232448 B limit: the failure at
    N = 2048 this function exists to avoid) and / 2 stages -> 149504 B."""
    lay, vb = packed["layout"], packed["dtype"].itemsize
    bm, h, n, m, F = block_m, packed["BLOCK_G"], packed["n"], packed["m"], lay["F"]
    b_step = F * h * m * block_n * vb
    step = bm * h * F * n * vb + bm * h * lay["WB"] // 8 + b_step
    return max(1, stages - 1) * step + b_step


def launch_config(packed: dict, N: int, sms: int = rt.DEFAULT_SMS, smem_limit: int = _SMEM_LIMIT) -> dict:
    """Tiles, split, warps and pipeline depth for N; pure Python. The depth (num_stages, "auto" =
    3) and, when "auto", BLOCK_N are lowered until the shared-memory estimate fits the device's
    ``smem_limit`` (bytes a block may opt into)."""
    block_m = PARAMS["BLOCK_M"]
    if block_m == "auto":
        # H200, 2:4 4096 x 4096: BLOCK_M 64 (4 warps, split-K 4) 17.9 us at N = 16 (32: 20.4 us,
        # 16: 27.9 us); at N = 2048 BLOCK_M 128 with 8 warps 224 us against 311 us for 64.
        block_m = 64 if N <= 64 else 128
    block_m = int(block_m)
    if packed["pad_m"] % block_m:
        raise ValueError(f"nm_compressed: BLOCK_M={block_m} does not divide the prepared row padding "
                         f"{packed['pad_m']}; prepare with the same PARAMS.")
    block_n = PARAMS["BLOCK_N"]
    auto_n = block_n == "auto"
    if auto_n:
        block_n = 16 if N <= 16 else min(1 << (N - 1).bit_length(), 128)
    stages = 3 if PARAMS["num_stages"] == "auto" else int(PARAMS["num_stages"])
    budget = smem_limit - _SMEM_MARGIN
    while smem_estimate(packed, block_m, block_n, stages) > budget:
        if stages > 2:
            stages -= 1
        elif auto_n and block_n > 16:
            block_n //= 2
        elif stages > 1:
            stages -= 1
        else:
            break
    n_tiles = -(-N // block_n)
    tiles = (packed["padded_rows"] // block_m) * n_tiles
    split = PARAMS["SPLIT_K"]
    if split == "auto":
        # ~2 waves of programs, each split keeping >= 2 K steps so its loads can pipeline.
        want = -(-2 * sms // tiles)
        cap = max(1, min(16, want, packed["steps"] // 2))
        split = 1 << (cap.bit_length() - 1)
    warps = PARAMS["num_warps"]
    if warps == "auto":
        warps = 8 if block_m * block_n >= 128 * 128 else 4
    return {"BLOCK_N": int(block_n), "n_tiles": n_tiles, "tiles": tiles, "SPLIT": int(split),
            "num_warps": int(warps), "num_stages": int(stages),
            "smem_estimate": smem_estimate(packed, block_m, block_n, stages), "BLOCK_M": block_m}


def _plan(packed: dict, B, out) -> dict:
    """Grid, constexprs, split-K workspace and argument list for one (N, B/C layout)."""
    M, K = packed["shape"]
    N = int(B.shape[1])
    cfg = launch_config(packed, N, rt.sm_count(B.device), rt.smem_per_block(B.device))
    block_m, lay = cfg["BLOCK_M"], packed["layout"]
    tiles, split, block_n = cfg["tiles"], cfg["SPLIT"], cfg["BLOCK_N"]
    if split > 1:
        ws = torch.empty(split * tiles * block_m * block_n, dtype=torch.float32, device=B.device)
        cnt = torch.zeros(tiles, dtype=torch.int32, device=B.device)
    else:
        ws = torch.empty(1, dtype=torch.float32, device=B.device)
        cnt = torch.zeros(1, dtype=torch.int32, device=B.device)
    has_res = "r_indptr" in packed
    named = dict(
        vals_ptr=packed["values"], meta_ptr=packed["meta"], b_ptr=None, out_ptr=None, ws_ptr=ws, cnt_ptr=cnt,
        rptr_ptr=packed["r_indptr"] if has_res else cnt, rind_ptr=packed["r_indices"] if has_res else cnt,
        rval_ptr=packed["r_values"] if has_res else ws,
        M=M, N=N, K=K, N_TILES=cfg["n_tiles"], NUM_TILES=tiles, NSTEPS=packed["steps"],
        stride_bk=B.stride(0), stride_bn=B.stride(1), stride_om=out.stride(0), stride_on=out.stride(1),
        NS=packed["n"], MM=packed["m"], PB=lay["PB"], CB=lay["CB"], F=lay["F"],
        H=packed["BLOCK_G"], BLOCK_M=block_m, BLOCK_N=block_n, SPLIT=split,
        EXPAND=packed["expand"], HAS_RESIDUAL=has_res, NUM_STAGES=cfg["num_stages"],
        UPCAST=(B.dtype == torch.bfloat16 and B.device.type != "cuda"),
        IN_PREC="ieee" if (B.dtype == torch.float32 and PARAMS["FP32_DOT"] == "ieee") else "tf32",
        USE_PTX=(B.device.type == "cuda" and PARAMS["BITS_LOGIC"] == "ptx"
                 and packed["values"].element_size() == 2 and B.element_size() == 2),
        EVEN_K=(K % (lay["F"] * packed["BLOCK_G"] * packed["m"]) == 0), EVEN_N=(N % block_n == 0))
    return rt.make_plan(_nm_kernel, named, (tiles, split, 1),
                        {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]},
                        config=cfg, ws=ws, cnt=cnt)


def spmm(packed: dict, B, out) -> None:
    """out[M, N] = A @ B for B [K, N] (any strides); fp32 accumulation; out in B's dtype."""
    rt.run_plans(packed, B, out, _plan, META, PARAMS, same_dtype=True)
