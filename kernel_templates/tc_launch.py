"""Host side of the tensor-core streaming templates (tc_dense, tc_sp24, tc_words, tc_bitmap, tc_lanemask, tc_scatter): NVRTC compile
through CuPy, launch geometry, the shared-memory budget and the cached one-launch spmm.

Why one module: the three templates differ only in the arrays they pass and the kernel they name;
the geometry (16-row tiles, 64-column chunks, n8 tiles per launch, the split-K cluster), the
shared-memory arithmetic (which must match SmemPlan / tc_bitmap in tc_stream.cu) and the launch
path (CuPy on torch's current stream, plans cached per N and B/C layout) are the same. Candidates
import it like `sparseditto.formats`: it is trusted code on the static check's allow-list.
"""
from __future__ import annotations

import hashlib
import math

import numpy as np
import torch

from sparseditto.kernel_templates import runtime, tensor_map
from sparseditto.kernel_templates.cost import (BULK_UNIT_BLOBS, TC_WG_CC, TC_WG_FROM_N, round_up,  # noqa: F401 - tc_words
                                               words_auto_params)
from sparseditto.tc_formats import largest_run

try:  # CuPy needs a CUDA runtime; planning and packing work without it.
    import cupy as cp
except ImportError:  # pragma: no cover - machines without CuPy
    cp = None

TILE_M = 16
CHUNK_K = 64
UNIT_CHUNKS = BULK_UNIT_BLOBS   # SD_UNIT: blobs per bulk copy (blob_stream_bulk: tc_bitmap, tc_words LOAD="bulk")
SMEM_LIMIT = 227 * 1024
LUT_BYTES = 16 * 8
SCATTER_REGION_BYTES = 4 * 512   # tc_scatter: a warp's four step fragment regions (ScatterDecoder::REGION)
BLOB_RING_KINDS = ("lanemask", "scatter", "words")   # blob_stream kernels: ring slots of SLOT_BYTES, one row tile per warp
STREAM_KINDS = ("scatter", "words")   # kernels with a stream-K schedule (SCHED="stream": blob_stream_sk in tc_stream.cu)
SCHED_CHOICES = ("cluster", "stream")
SCATTER_LOAD_CHOICES = ("ring", "reg")   # tc_scatter's LOAD: the cp.async blob ring, or registers (tc_scatter_rg)
STAGE_CHUNKS_CHOICES = (1, 2, 4)   # tc_words_grp's CH: chunks per stage (one bulk copy, one barrier round trip)
B_PARTS_CHOICES = (1, 2, 4)        # tc_words_grp's BP: parts of B's slice its consumer warps stage and wait for one by one
GROUP_ROWS_CHOICES = (1, 2)        # tc_words_grp's R: row tiles per consumer warp (the pack's group is WARPS x R)
TILE_WARPS_CHOICES = (1, 2)        # tc_words_grp's TW: consumer warps per row tile (the pack's group is WARPS / TW,
                                   # its stages TW chunks, one per warp of a tile)
EPILOGUE_CHOICES = ("auto", "pull", "push")   # tc_words_grp's split-K reduction: DSMEM reads after a cluster barrier, or st.async pushes
PUSH_AUTO_MAX_NT = 2               # EPILOGUE="auto" pushes up to this many n8 tiles (N <= 16: measured there, H200 session 37)
PUSH_BARRIER_BYTES = 16            # PushReduce: the receive mbarrier, padded so the slots stay 16-byte aligned
WORDS_LOAD_CHOICES = ("ring", "bulk", "group")   # tc_words' LOAD: the cp.async blob ring, the bulk ring
                                                # (tc_words_bulk), or the CTA stream (tc_words_grp)
STREAM_ASSUMED_REGS = 64      # registers per thread a stream-K plan assumes before the kernel is compiled
STREAM_FLAG_BYTES = 16        # blob_stream_sk's "this CTA sums the group" flag, after the rings
BITMAP_SLOTS = 4             # SD_SLOTS: bulk copies in flight per warp (blob_stream_bulk)
NT_CHOICES = (1, 2, 4, 8)
WG_NT_CHOICES = (1, 2, 4, 8, 16)   # the wgmma kernel also runs 128 columns per block (A read once)
SPLIT_CHOICES = (1, 2, 4, 8)  # cluster sizes (8 is the portable maximum)
CLUSTER_MAX = 8               # CTAs per cluster without the non-portable opt-in
STREAM_MIN_WARPS = 16         # blob-ring kernels: warps per SM an auto split keeps streaming (_auto_split)
CTAS_PER_SM_TARGET = 2        # auto split without a register count: total CTAs closest to this many per SM
REGISTER_KINDS = ("dense", "sp24")   # stream_registers kernels: partials alias the B slice
# An SM's resources (sm_90; the same on sm_80/86/89 except shared memory): what decides how many
# CTAs of a kernel are resident at once, so how many waves a grid takes.
SM_REGISTERS = 65536
SM_THREADS = 2048
SM_CTAS = 32
SM_SMEM = 228 * 1024
CTA_SMEM_RESERVED = 1024      # the driver's per-CTA shared memory
# BRING "auto": a ring of AUTO_B_RING_SLOTS chunks where staging the CTA's whole K slice of B would
# take more than AUTO_B_RING_ABOVE bytes. Measured on the H200 (session 26, 2:4, chained): the ring
# costs a CTA barrier per chunk, so where the slice is small it loses (11008x4096 N = 32, 64 KiB
# slice: 20.9 -> 23.6 us; N = 16: 17.9 -> 20.2), and it wins where the slice is large (4096x11008,
# K = 11008: N = 32, 88 KiB, 33.8 -> 29.6 us, 0.87x -> 0.99x cuBLAS; N = 64, 176 KiB, 61.6 -> 57.1 us).
AUTO_B_RING_SLOTS = 4
AUTO_B_RING_ABOVE = 64 * 1024
WIDE_BLOCKS = 64              # n blocks of 64 columns prepare compiles for (N up to 4096)
# tc_sp24's warpgroup kernel (tc_sp24wg: wgmma.mma_async.sp, sm_90a): MMA "auto" takes it on a
# compute-capability 9.0 GPU from N = AUTO_WGMMA_FROM_N columns, where the mma.sync loop runs out of
# warps (session 26's ncu: latency-bound at N >= 32). It prefetches both operands WPIPE - 1 chunks
# ahead, so its B ring needs WPIPE + 1 slots at least; A goes through WPIPE shared-memory slots of
# WG_A_SLOT bytes per warp; its B region starts on a 1024-byte boundary (the 128-byte swizzle).
WGMMA_ARCH = "sm_90a"
WGMMA_CC = TC_WG_CC               # the planner's estimate (cost.tc_sp24_uses_wgmma) reads the same two
AUTO_WGMMA_FROM_N = TC_WG_FROM_N
WG_ALIGN_PAD = 1024
WG_A_SLOT = 1152
# MINB 0 on the wgmma kernel caps registers so that a CTA of WARPS warps leaves room for this many
# warps per SM (24: 85 registers at NT <= 8; 16: 128 at NT = 16). Measured on the H200: uncapped, the
# NT = 8 kernel took 86 registers after an unrelated change, two CTAs per SM instead of three, and
# 11008x4096 2:4 at N = 64 went from 23.0 to 30.8 us on the same grid.
WG_WARPS_PER_SM = {8: 24, 16: 16}
WG_LONG_SLICE_CHUNKS = 16        # the wgmma kernel's auto split at NT >= 8 (_auto_split)
MMA_CHOICES = ("auto", "sync", "wgmma")
# How the wgmma kernel is fed (WLOAD): "cp" = tc_sp24wg (every thread stages B and its A with
# cp.async, a CTA barrier per chunk), "tma" = tc_sp24tma (one producer warp drives the copy engine:
# a tensor map for B, 1-D bulk copies for A, WSTAGES chunks in flight, mbarriers instead of CTA
# barriers). "auto" takes tma wherever it applies: one row tile per warp, 32, 64 or 128 columns per
# block (NT 4, 8, 16: 64- and 128-byte swizzled rows) and a B the tensor map can describe
# (tensor_map.tma_ready; checked per launch, so an unaligned B falls back to cp for that call).
WLOAD_CHOICES = ("auto", "cp", "tma")
TMA_NT = (4, 8, 16)
# tc_sp24tma's consumer warps per CTA ("auto" TWARPS): one warpgroup, so 64-row CTAs. Measured on the
# H200 (session 28, 2:4, N = 64, chained): 8 warps (128 rows, two CTAs per SM by registers, 172 CTAs
# on 11008x4096) 25.0 us; 4 warps 21.5 us (and 13.5 vs 15.3 on 4096x4096), whatever B traffic the
# smaller row blocks add.
TMA_WARPS = 4
# and its stages ("auto" WSTAGES), H200 session 28, chained: at N = 64 4 stages (11008x4096 21.6 us,
# 3: 23.7, 6: 30.9: deeper stages cost CTAs per SM); at N = 128 3 stages (28.8 us against 34.9 at 4)
TMA_STAGES = 4
TMA_STAGES_WIDE = 3
# MCAST: how many neighbouring 64-row blocks share each B chunk through the copy engine's cluster
# multicast (1 = every CTA copies its own B from L2).
MCAST_CHOICES = (1, 2, 4)
TMA_BARRIER_BYTES = 8             # per mbarrier: B's full and empty and each consumer warp's A full, per stage
DTYPE_FLAGS = {torch.float16: 0, torch.bfloat16: 1}
_PLACEHOLDER = "@SPARSEDITTO_INLINE"


def torch_dtype(dtype) -> torch.dtype:
    """runtime.torch_dtype restricted to the tensor cores' 16-bit operands."""
    try:
        found = runtime.torch_dtype(dtype)
    except ValueError:
        found = None
    if found not in DTYPE_FLAGS:
        raise ValueError(f"The tensor-core templates run float16 or bfloat16 values, got {dtype!r}.")
    return found


def dtype_name(dtype: torch.dtype) -> str:
    return "float16" if dtype == torch.float16 else "bfloat16"


def b_ring_for(kind: str, nt: int, value="auto", chunks_per_cta: int = 0, mma: str = "sync", pipe: int = 0) -> int:
    """Chunk slots of B's shared-memory ring (0: the CTA's whole K slice staged up front), for
    tc_dense / tc_sp24 (the other kinds have their own staging). "auto": a ring only where the whole
    slice of `chunks_per_cta` chunks at `nt` n8 tiles would exceed AUTO_B_RING_ABOVE bytes. The
    wgmma kernel's ring has `pipe` + 1 slots at least (a smaller ring is raised to that)."""
    if kind not in REGISTER_KINDS:
        return 0
    floor = pipe + 1 if mma == "wgmma" else 2
    if value == "auto":
        whole = chunks_per_cta * CHUNK_K * b_row_bytes(nt)
        return max(AUTO_B_RING_SLOTS, floor) if whole > AUTO_B_RING_ABOVE else 0
    try:
        depth = int(value)
    except (TypeError, ValueError):
        depth = -1
    if depth < 0 or depth == 1:
        raise ValueError(f"BRING must be 'auto', 0 (stage the whole K slice) or a ring of >= 2 chunk slots, "
                         f"got {value!r}.")
    return max(depth, floor) if depth else 0


def mma_for(kind: str, params: dict, n: int, cc: tuple | None) -> str:
    """Which tc_sp24 kernel runs N = n columns: "wgmma" (tc_sp24wg, sm_90a) or "sync" (mma.sync).

    MMA "auto" picks wgmma on a compute-capability 9.0 device from AUTO_WGMMA_FROM_N columns (with
    R <= 2, all the wgmma kernel takes); an explicit "wgmma" is planned anywhere (so CPU planning can
    show it) but compile_kernels refuses it on another GPU. Only sp24 has a wgmma kernel; every other
    kind is "sync"."""
    choice = params.get("MMA", "auto")
    if choice not in MMA_CHOICES:
        raise ValueError(f"MMA must be one of {MMA_CHOICES}, got {choice!r}.")
    if kind != "sp24" or choice == "sync":
        return "sync"
    if choice == "wgmma":
        return "wgmma"
    fits = int(params.get("R", 1)) <= 2
    return "wgmma" if fits and cc is not None and tuple(cc) == WGMMA_CC and n >= AUTO_WGMMA_FROM_N else "sync"


def load_for(params: dict, mma: str, nt: int, rows: int, b_tma: bool) -> str:
    """How the wgmma kernel gets its operands at `nt` n8 tiles: "tma" (tc_sp24tma) or "cp"
    (tc_sp24wg; also the answer for mma.sync). An explicit "tma" that does not apply (R = 2, a B the
    tensor map cannot describe) runs "cp", since B's alignment is a property of each call."""
    choice = params.get("WLOAD", "auto")
    if choice not in WLOAD_CHOICES:
        raise ValueError(f"WLOAD must be one of {WLOAD_CHOICES}, got {choice!r}.")
    if mma != "wgmma" or choice == "cp":
        return "cp"
    return "tma" if rows == 1 and nt in TMA_NT and b_tma else "cp"


def tma_warps(params: dict) -> int:
    """tc_sp24tma's consumer warps: TWARPS, "auto" = TMA_WARPS (the other kernels take WARPS)."""
    value = params.get("TWARPS", "auto")
    warps = TMA_WARPS if value == "auto" else int(value)
    if warps % 4 or warps <= 0:
        raise ValueError(f"tc_sp24tma runs whole warpgroups: TWARPS must be 'auto' or a multiple of 4, got {value!r}.")
    return warps


def tma_stages(params: dict, nt: int) -> int:
    """tc_sp24tma's pipeline depth: WSTAGES, "auto" = TMA_STAGES_WIDE at 128-column blocks (their
    25 KiB stages: 3 fit three CTAs per SM where 4 fit two), TMA_STAGES below."""
    value = params.get("WSTAGES", "auto")
    if value == "auto":
        return TMA_STAGES_WIDE if nt >= 16 else TMA_STAGES
    return int(value)


def tma_multicast(params: dict) -> int:
    """tc_sp24tma's multicast width MCAST: row blocks of one cluster row that share each B chunk."""
    value = params.get("MCAST", 1)
    if str(value) not in {str(c) for c in MCAST_CHOICES}:
        raise ValueError(f"MCAST must be one of {MCAST_CHOICES} (row blocks sharing one B chunk), got {value!r}.")
    return int(value)


def wg_minb(params: dict, nt: int, warps: int, rows: int = 1) -> int:
    """The wgmma kernel's launch-bounds minimum: MINB when set, else WG_WARPS_PER_SM's share for one
    row tile per warp. Two row tiles (R = 2) get no cap: at NT = 8 they need ~145 registers, and under
    128 ptxas serialises the wgmma pipeline for lack of registers (warning C7512, nvcc 13.0)."""
    explicit = int(params.get("MINB", 0))
    if explicit:
        return explicit
    if rows > 1:
        return 1
    return max(1, WG_WARPS_PER_SM[8 if nt <= 8 else 16] // warps)


def regs_key(nt: int, mma: str, load: str = "cp"):
    """Key of regs_by_nt for a kernel family: the n8-tile count (mma.sync), (nt, "wgmma") or
    (nt, "tma")."""
    if mma == "sync":
        return nt
    return (nt, "tma") if load == "tma" else (nt, mma)


def n_tiles_for(n: int, mma: str = "sync") -> int:
    """n8 tiles per launch block: the smallest of 1, 2, 4, 8 (and 16 for the wgmma kernel) covering
    N; wider N loops over blocks in grid.z, each reading A again."""
    choices = WG_NT_CHOICES if mma == "wgmma" else NT_CHOICES
    for nt in choices:
        if n <= 8 * nt:
            return nt
    return choices[-1]


def b_row_bytes(nt: int) -> int:
    """Row stride of the staged B slice: NT 16-byte units, XOR-swizzled (BStride in tc_stream.cu)."""
    return 16 * nt


def blob_offsets_stride(chunks_per_cta: int) -> int:
    """u32 blob offsets staged per warp by the blob ring kernels (chunks + 1, rounded up to 16 bytes)."""
    return (chunks_per_cta + 4) & ~3


def blob_decoder_bytes(kind: str, warps: int) -> int:
    """A blob-ring kernel's decoder bytes (Decoder::EXTRA): tc_lanemask's quad table, tc_scatter's
    step fragment regions per warp, tc_bitmap's table (blob_stream_bulk), none for tc_words."""
    return {"lanemask": LUT_BYTES, "bitmap": LUT_BYTES, "scatter": warps * SCATTER_REGION_BYTES}.get(kind, 0)


def l2_prefetch(kind: str, params: dict, load: str) -> int:
    """tc_words' PF on its cp.async ring: blobs a warp asks the copy engine to pull into L2 ahead of the
    ring (0: none; the bulk ring and the other kinds take no PF)."""
    pf = int(params.get("PF", 0)) if kind == "words" and load == "cp" else 0
    if pf < 0:
        raise ValueError(f"PF (blobs prefetched into L2 ahead of the ring) must be >= 0, got {pf}.")
    return pf


def kernel_unit(kind: str, params: dict) -> int:
    """The UNIT a kernel is instantiated with: tc_words' fragment registers per unit (1 elsewhere)."""
    return int(params.get("UNIT", 1)) if kind == "words" else 1


def stream_smem_bytes(kind: str, nt: int, warps: int, span: int, nchunks: int, pipe: int, slot_bytes: int) -> int:
    """Dynamic shared memory of a stream-K CTA (blob_stream_sk): the B chunks of its item range (at
    most nchunks), the decoder's bytes, each warp's blob offsets (start and end per item), each
    warp's ring, the flag."""
    return (min(span, nchunks) * CHUNK_K * b_row_bytes(nt) + blob_decoder_bytes(kind, warps)
            + warps * 2 * blob_offsets_stride(span) * 4
            + warps * pipe * slot_bytes + STREAM_FLAG_BYTES)


def stream_kmax(span: int, nchunks: int) -> int:
    """Row-tile groups one stream-K range of `span` items can touch (its partial slots in the workspace)."""
    return -(-span // nchunks) + 1


def stream_schedule(groups: int, nchunks: int, ctas: int) -> np.ndarray:
    """blob_stream_sk's int32 schedule: CTA i owns items [s_i, s_{i+1}) with s_i = i T // P (T = groups
    x nchunks items, P = ctas), then each CTA's first group, then per group the first and last CTA
    holding part of it (a CTA owns item x when s_i <= x < s_{i+1}, i.e. i = ((x + 1) P - 1) // T)."""
    total = groups * nchunks
    if not 0 < ctas <= total:
        raise ValueError(f"A stream-K grid needs 1..{total} CTAs (one item each at least), got {ctas}.")
    if total >= 2 ** 31:
        raise ValueError(f"{total} stream-K items do not fit the kernel's int32 schedule; use SCHED='cluster'.")
    starts = np.arange(ctas + 1, dtype=np.int64) * total // ctas
    first_item = np.arange(groups, dtype=np.int64) * nchunks

    def owner(x):
        return ((x + 1) * ctas - 1) // total
    owners = np.stack([owner(first_item), owner(first_item + nchunks - 1)], axis=1).ravel()
    return np.concatenate([starts, starts[:-1] // nchunks, owners]).astype(np.int32)


def _stream_geometry(kind: str, tiles: int, nchunks: int, n: int, params: dict, sm_count: int,
                     regs_by_nt: dict | None) -> dict:
    """One wave of CTAs, as many per SM as registers and shared memory allow (each CTA's B slice
    shrinks as the grid grows, so the count is searched from the most down), the items cut evenly."""
    if kind not in STREAM_KINDS:
        raise ValueError(f"SCHED='stream' is implemented for {', '.join(STREAM_KINDS)}, not {kind}.")
    warps, pipe, slot = int(params["WARPS"]), int(params.get("PIPE", 0)), int(params.get("SLOT_BYTES", 0))
    groups = -(-tiles // warps)
    items = groups * nchunks
    nt = n_tiles_for(n)
    while True:
        regs = (regs_by_nt or {}).get(regs_key(nt, "sync", "cp")) or STREAM_ASSUMED_REGS
        for per_sm in range(SM_THREADS // (warps * 32), 0, -1):
            ctas = min(items, per_sm * sm_count)
            span = -(-items // ctas)
            smem = stream_smem_bytes(kind, nt, warps, span, nchunks, pipe, slot)
            if smem <= SMEM_LIMIT and resident_ctas(warps, smem, regs) * sm_count >= ctas:
                gz = -(-n // (8 * nt))
                return {"nt": nt, "split": 1, "chunks_per_cta": span, "smem": smem, "grid": (ctas, 1, gz),
                        "block": (warps * 32, 1, 1), "warps": warps, "rows": 1, "ring_kb": 0, "pipe": pipe,
                        "bring": 0, "minb": 0, "slot_bytes": slot, "mma": "sync", "load": "cp", "a_stages": 0,
                        "mcast": 1, "sched": "stream", "groups": groups, "kmax": stream_kmax(span, nchunks),
                        "unit": kernel_unit(kind, params)}
        if nt == 1:
            raise ValueError(f"{kind}: no stream-K grid fits {SMEM_LIMIT} bytes of shared memory at N = {n} "
                             f"(WARPS={warps}, PIPE={pipe}, ring slots of {slot} bytes): use fewer warps or PIPE.")
        nt //= 2


def tma_stage_bytes(nt: int, warps: int) -> int:
    """One stage of tc_sp24tma with A inside its stages (TmaLayout, ASTAGES 0): B's chunk and every
    warp's A slot, rounded up to 1024."""
    return round_up(CHUNK_K * b_row_bytes(nt) + warps * WG_A_SLOT, WG_ALIGN_PAD)


def tma_region_bytes(nt: int, warps: int, stages: int, a_stages: int = 0) -> int:
    """tc_sp24tma's stages from the aligned base (TmaLayout): interleaved (a_stages 0) or the B
    chunks back to back, then each warp's ring of a_stages A slots."""
    if not a_stages:
        return stages * tma_stage_bytes(nt, warps)
    return stages * CHUNK_K * b_row_bytes(nt) + warps * a_stages * WG_A_SLOT


def smem_bytes(kind: str, nt: int, warps: int, rows_per_warp: int, split: int, chunks_per_cta: int,
               ring_kb: int = 0, pipe: int = 0, slot_bytes: int = 0, b_ring: int = 0, mma: str = "sync",
               load: str = "cp", a_stages: int = 0, push: bool = False, tile_warps: int = 1) -> int:
    """Dynamic shared memory of one CTA, laid out as the kernels carve it (SmemPlan, tc_bitmap,
    tc_lanemask, tc_sp24wg, tc_sp24tma). `b_ring` (tc_dense / tc_sp24: BR) > 0 holds that many 64-row
    chunks of B instead of the CTA's whole K slice; the wgmma kernel aligns B to 1024 bytes
    (WG_ALIGN_PAD), keeps all BR ring slots (its A slots follow them) and `pipe` A slots per warp;
    tc_sp24tma (load "tma") has `pipe` B stages and, per warp, `a_stages` A slots (0: one in each
    B stage) after their mbarriers (B full and empty, each warp's A full), its partials over them.
    `push` (tc_words_grp, EPILOGUE="push"): a receive region after the stages (PushReduce: its barrier and
    `split` slots of the largest row share) instead of the partials over them. `tile_warps` 2 (tc_words_grp's
    TW): the CTA holds WARPS / 2 row tiles, and the second warps' partial tiles go over the stages (the
    region is at least their size)."""
    tiles_per_cta = warps * rows_per_warp // tile_warps
    tile_sums = tiles_per_cta * TILE_M * nt * 8 * 4                    # the CTA's row tiles as fp32 partials
    partials = tile_sums if split > 1 else 0                            # split-K fp32 tiles
    if load == "group":   # tc_words_grp: B, full and empty barriers, the group's offsets, the stages (partials over them)
        head = (chunks_per_cta * CHUNK_K * b_row_bytes(nt) + 2 * pipe * TMA_BARRIER_BYTES
                + round_up((chunks_per_cta * tiles_per_cta + 1) * 4, 16))
        stages = pipe * slot_bytes if tile_warps == 1 else max(pipe * slot_bytes, tile_sums)
        if push and split > 1:
            share = -(-tiles_per_cta * TILE_M // split)
            return head + stages + PUSH_BARRIER_BYTES + split * share * nt * 8 * 4
        return head + max(stages, partials)
    if load == "tma":
        stages = max(tma_region_bytes(nt, warps, pipe, a_stages), partials)
        return TMA_BARRIER_BYTES * (2 * pipe + warps * (a_stages or pipe)) + WG_ALIGN_PAD + stages
    if mma == "wgmma":
        slots = b_ring or chunks_per_cta
        total = slots * CHUNK_K * b_row_bytes(nt) + WG_ALIGN_PAD + warps * pipe * rows_per_warp * WG_A_SLOT
    else:
        total = (min(b_ring, chunks_per_cta) if b_ring else chunks_per_cta) * CHUNK_K * b_row_bytes(nt)
    if split > 1:
        # tc_dense / tc_sp24 write their split-K partials over the staged B slice once every warp is
        # done with it (stream_registers); the bitmap kernels keep them beside their other regions
        total = max(total, partials) if kind in REGISTER_KINDS else total + partials
    if load == "bulk" or kind == "bitmap":   # blob_stream_bulk: the decoder's bytes, each warp's barriers, positions, ring, offsets
        total += (blob_decoder_bytes(kind, warps) + warps * BITMAP_SLOTS * (8 + 4) + warps * ring_kb * 1024
                  + warps * (chunks_per_cta + 1) * 4)
    elif kind in BLOB_RING_KINDS:   # blob_stream: the decoder's bytes, then each warp's offsets and ring
        total += blob_decoder_bytes(kind, warps) + warps * blob_offsets_stride(chunks_per_cta) * 4 + warps * pipe * slot_bytes
    return total


def resident_ctas(warps: int, smem: int, regs_per_thread: int) -> int:
    """CTAs of one kernel an SM holds at once, from its registers, threads and shared memory (the
    occupancy calculator's arithmetic: registers are allocated per warp in 256-register units of
    8-register-rounded thread counts)."""
    per_warp = -(-(-(-regs_per_thread // 8) * 8 * 32) // 256) * 256
    by_regs = (SM_REGISTERS // per_warp) // warps
    by_threads = SM_THREADS // (warps * 32)
    by_smem = SM_SMEM // (smem + CTA_SMEM_RESERVED)
    return max(0, min(by_regs, by_threads, by_smem, SM_CTAS))


def _auto_split(feasible: list, gx: int, gz: int, sm_count: int, warps: int, regs: int | None,
                long_slices: int = 0, min_warps: int = 0) -> tuple:
    """The K split of an "auto" geometry: enough CTAs to keep every SM streaming, without a wave tail.

    Without a register count (planning on the CPU): total CTAs closest in ratio to
    CTAS_PER_SM_TARGET per SM. With the compiled kernel's registers, the CTAs an SM holds at once
    (resident_ctas, which also depends on each split's shared memory) are counted: among the splits
    whose grid runs in one wave, total CTAs closest to min(target, resident) per SM, the larger grid
    on a tie; when none fits one wave, the split that fills its last wave best. Measured on the
    H200 (tc_sp24, 11008x4096, N = 16, PIPE=4): 87 registers leave 2 CTAs per SM, and the blind
    rule's split of 4 (344 CTAs, 1.3 waves) ran 26.1 us where split 2 (172 CTAs, one wave) took
    24.2 us. `long_slices` (the wgmma kernel at NT >= 8): among the one-wave splits whose K slices
    have that many chunks, the most CTAs; each CTA fills a pipeline of cp.async groups before its
    first wgmma, which short slices pay too often (H200, session 27, 4096x4096 2:4: split 8 (8 chunks)
    18.9 us at N = 64 and 26.3 at N = 128, split 4 (16 chunks) 16.3 and 22.0).
    `min_warps` (the blob-ring kernels, STREAM_MIN_WARPS): with a register count, only the splits
    that keep at least that many warps per SM streaming (or as many as any split does) are
    considered. Why: their per-warp work is a chain of dependent shared-memory steps, so too few
    warps leave the SM idle, and the one-wave rule alone chose split 1 for tc_scatter at
    11008x4096, N = 16 (86 CTAs of 8 warps, one per SM by shared memory: 5.2 warps per SM, 66-79
    us chained, where split 8 ran 35-48 us; H200, session 32).
    """
    useful = [f for f in feasible if f[0] == 1 or f[1] >= 2] or feasible   # no near-empty K slices
    if not regs:
        want = CTAS_PER_SM_TARGET * sm_count
        return min(useful, key=lambda f: (abs(math.log(gx * f[0] * gz / want)), f[0]))
    resident = {f[0]: max(1, resident_ctas(warps, f[2], regs)) for f in useful}
    total = {f[0]: gx * f[0] * gz for f in useful}
    if min_warps:
        streaming = {f[0]: min(total[f[0]], resident[f[0]] * sm_count) * warps / sm_count for f in useful}
        floor = min(min_warps, max(streaming.values()))
        useful = [f for f in useful if streaming[f[0]] >= floor]
    one_wave = [f for f in useful if total[f[0]] <= resident[f[0]] * sm_count]
    long = [f for f in one_wave if long_slices and f[1] >= long_slices]
    if long:
        return max(long, key=lambda f: total[f[0]])
    if one_wave:
        return min(one_wave, key=lambda f: (abs(math.log(total[f[0]] / (min(CTAS_PER_SM_TARGET, resident[f[0]]) * sm_count))),
                                            -total[f[0]]))

    def fill(f):
        slots = resident[f[0]] * sm_count
        return total[f[0]] / (-(-total[f[0]] // slots) * slots)
    return max(useful, key=lambda f: (round(fill(f), 3), total[f[0]]))


def plan_geometry(kind: str, tiles: int, nchunks: int, n: int, params: dict, sm_count: int,
                  regs_by_nt: dict | None = None, cc: tuple | None = None, b_tma: bool = True) -> dict:
    """Grid, block, split and shared memory for N = n; pure Python, so it is tested on the CPU.

    `regs_by_nt` (registers per thread of the compiled kernels, keyed by `regs_key`, when known)
    lets the auto split count resident CTAs instead of assuming CTAS_PER_SM_TARGET of them; `cc`
    (the device's compute capability) decides whether tc_sp24 may take its wgmma kernel, `b_tma`
    (tensor_map.tma_ready of this call's B) whether that kernel may be tc_sp24tma (load_for)."""
    sched = params.get("SCHED", "cluster")
    if sched not in SCHED_CHOICES:
        raise ValueError(f"SCHED must be one of {SCHED_CHOICES}, got {sched!r}.")
    blob_load = params.get("LOAD", "ring") if kind in ("scatter", "words") else "ring"
    choices = WORDS_LOAD_CHOICES if kind == "words" else SCATTER_LOAD_CHOICES
    if blob_load not in choices:
        raise ValueError(f"LOAD must be one of {choices}, got {blob_load!r}.")
    if sched == "stream":
        if blob_load != "ring":
            raise ValueError(f"LOAD={blob_load!r} runs with SCHED='cluster' only (the stream-K schedule has the "
                             "cp.async ring alone).")
        return _stream_geometry(kind, tiles, nchunks, n, params, sm_count, regs_by_nt)
    warps = int(params["WARPS"])
    mma = mma_for(kind, params, n, cc)
    if mma == "wgmma" and warps % 4:
        raise ValueError(f"The wgmma kernel runs whole warpgroups: WARPS must be a multiple of 4, got {warps}.")
    rows = 1 if kind in ("bitmap", *BLOB_RING_KINDS) else int(params.get("R", 1))
    tile_warps = int(params.get("TILE_WARPS", 1)) if kind == "words" else 1
    if tile_warps not in TILE_WARPS_CHOICES:
        raise ValueError(f"TILE_WARPS (consumer warps per row tile) must be one of {TILE_WARPS_CHOICES}, got "
                         f"{params.get('TILE_WARPS')!r}.")
    if tile_warps > 1:
        if blob_load != "group":
            raise ValueError(f"TILE_WARPS={tile_warps} runs with LOAD='group' only, got LOAD={blob_load!r}.")
        if int(params.get("R", 1)) != 1 or int(params.get("B_PARTS", 1)) != 1:
            raise ValueError(f"TILE_WARPS={tile_warps} takes one row tile per warp and B staged whole: it needs R=1 "
                             f"and B_PARTS=1, got R={params.get('R', 1)}, B_PARTS={params.get('B_PARTS', 1)}.")
        if int(params.get("STAGE_CHUNKS", 1)) != tile_warps:
            raise ValueError(f"TILE_WARPS={tile_warps} streams a pack whose stages hold one chunk per warp of a tile "
                             f"(STAGE_CHUNKS={tile_warps}), got STAGE_CHUNKS={params.get('STAGE_CHUNKS', 1)}: prepare "
                             "with the same TILE_WARPS and STAGE_CHUNKS=1.")
        if int(params["WARPS"]) % tile_warps or int(params["WARPS"]) < 2 * tile_warps:
            raise ValueError(f"TILE_WARPS={tile_warps} shares each row tile among {tile_warps} consumer warps and streams "
                             f"two tiles per CTA at least: WARPS must be a multiple of {tile_warps} and at least "
                             f"{2 * tile_warps}, got {params['WARPS']}.")
    if kind == "words" and blob_load != "group" and int(params.get("R", 1)) != 1:
        raise ValueError(f"R={params.get('R')} (row tiles per warp) runs with LOAD='group' only, got LOAD={blob_load!r}.")
    if kind == "words" and blob_load == "group":   # tc_words_grp decodes R row tiles per warp
        rows = int(params.get("R", 1))
        if rows not in GROUP_ROWS_CHOICES:
            raise ValueError(f"R (row tiles per warp of LOAD='group') must be one of {GROUP_ROWS_CHOICES}, got {rows}.")
        if rows > 1 and int(params.get("STAGE_CHUNKS", 1)) != 1:
            raise ValueError(f"R={rows} decodes one chunk per stage: it needs STAGE_CHUNKS=1, got "
                             f"{params.get('STAGE_CHUNKS')}.")
    epilogue = params.get("EPILOGUE", "pull") if kind == "words" else "pull"
    if epilogue not in EPILOGUE_CHOICES:
        raise ValueError(f"EPILOGUE must be one of {EPILOGUE_CHOICES}, got {epilogue!r}.")
    if blob_load != "group" and epilogue == "push":
        raise ValueError(f"EPILOGUE='push' runs with LOAD='group' only, got LOAD={blob_load!r}.")
    if mma == "wgmma" and rows > 2:
        raise ValueError(f"The wgmma kernel takes one or two row tiles per warp (R), got {rows}.")
    ring_kb = int(params.get("RING_KB", 0))
    slot_bytes = int(params.get("SLOT_BYTES", 0))
    split = params.get("SPLIT", "auto")
    candidates = SPLIT_CHOICES if split == "auto" else (int(split),)
    nt = n_tiles_for(n, mma)
    while True:   # wide N with long K: fewer n8 tiles per launch (more n blocks) until B fits
        load = load_for(params, mma, nt, rows, b_tma)
        warps = tma_warps(params) if load == "tma" else int(params["WARPS"])
        pipe = (tma_stages(params, nt) if load == "tma" else
                int(params.get("WPIPE", 3) if mma == "wgmma" else params.get("PIPE", 0)))
        if blob_load == "reg":   # no ring: blobs go from global memory to registers
            load, pipe = "reg", 0
        if kind == "bitmap" or blob_load == "bulk":   # blob_stream_bulk: RING_KB per warp, no PIPE
            load, pipe = "bulk", 0
        if blob_load == "group":   # tc_words_grp: PIPE stages of the CTA's chunk runs
            load = "group"
            if int(params.get("GROUP", 0)) != warps * rows // tile_warps:
                raise ValueError(f"LOAD='group' streams a pack grouped by WARPS x R / TILE_WARPS row tiles: this pack "
                                 f"has GROUP={params.get('GROUP', 1)}, the launch WARPS={warps}, R={rows}, TILE_WARPS="
                                 f"{tile_warps}; prepare with LOAD='group' and the same WARPS, R and TILE_WARPS.")
            if pipe < 2:
                raise ValueError(f"LOAD='group' keeps PIPE >= 2 stages (one in flight while one is decoded), got {pipe}.")
            if int(params.get("STAGE_CHUNKS", 1)) not in STAGE_CHUNKS_CHOICES:
                raise ValueError(f"STAGE_CHUNKS must be one of {STAGE_CHUNKS_CHOICES}, got {params.get('STAGE_CHUNKS')!r}.")
            if int(params.get("B_PARTS", 1)) not in B_PARTS_CHOICES:
                raise ValueError(f"B_PARTS must be one of {B_PARTS_CHOICES}, got {params.get('B_PARTS')!r}.")
            if int(params.get("B_PARTS", 1)) > 1 and int(params.get("STAGE_CHUNKS", 1)) != 1:
                raise ValueError(f"B_PARTS={params.get('B_PARTS')} waits for B's parts chunk by chunk: it needs "
                                 f"STAGE_CHUNKS=1, got {params.get('STAGE_CHUNKS')}.")
        a_stages = int(params.get("ASTAGES", 0)) if load == "tma" else 0
        push = load == "group" and (epilogue == "push" or (epilogue == "auto" and nt <= PUSH_AUTO_MAX_NT))
        mcast = tma_multicast(params) if load == "tma" else 1
        if split != "auto" and int(split) * mcast > CLUSTER_MAX:
            raise ValueError(f"SPLIT={split} x MCAST={mcast} CTAs would form one cluster; a cluster holds at most "
                             f"{CLUSTER_MAX}: lower SPLIT or MCAST.")
        feasible = []
        for s in candidates:
            if s * mcast > CLUSTER_MAX:   # one cluster holds the K split of MCAST row blocks
                continue
            cpc = -(-nchunks // s)
            bring = 0 if load == "tma" else b_ring_for(kind, nt, params.get("BRING", 0), cpc, mma, pipe)
            smem = smem_bytes(kind, nt, warps, rows, s, cpc, ring_kb, pipe, slot_bytes, bring, mma, load, a_stages,
                              push, tile_warps)
            if smem <= SMEM_LIMIT:
                feasible.append((s, cpc, smem, bring))
        if feasible or nt == 1:
            break
        nt //= 2
    gx = -(-tiles // (warps * rows // tile_warps) // mcast) * mcast   # whole cluster rows (a block past M computes zeros)
    gz = -(-n // (8 * nt))
    if not feasible:
        raise ValueError(f"{kind}: no split of K = {nchunks * CHUNK_K} fits {SMEM_LIMIT} bytes of shared memory "
                         f"at N = {n} (WARPS={warps}, SPLIT={split}); use more splits, fewer warps or a smaller ring.")
    cta_warps = warps + 1 if load in ("tma", "group") else warps    # tc_sp24tma's / tc_words_grp's producer warp
    if split == "auto":   # tc_sp24tma keeps the closest-to-two-CTAs-per-SM rule (no long-slice preference)
        s, cpc, smem, bring = _auto_split(feasible, gx, gz, sm_count, cta_warps,
                                          (regs_by_nt or {}).get(regs_key(nt, mma, load)),
                                          WG_LONG_SLICE_CHUNKS if load == "cp" and mma == "wgmma" and nt >= 8 else 0,
                                          STREAM_MIN_WARPS if kind in BLOB_RING_KINDS else 0)
    else:
        s, cpc, smem, bring = feasible[0]
    if load == "tma":   # no cap by default: a cap that forces 3 CTAs per SM spills (72 registers, nvcc 13.0)
        minb = int(params.get("MINB", 0))
    else:
        minb = wg_minb(params, nt, warps, rows) if mma == "wgmma" else int(params.get("MINB", 0))
    return {"nt": nt, "split": s, "chunks_per_cta": cpc, "smem": smem, "grid": (gx, s, gz),
            "block": (cta_warps * 32, 1, 1), "warps": warps, "rows": rows, "ring_kb": ring_kb, "pipe": pipe,
            "bring": bring, "minb": minb, "slot_bytes": slot_bytes, "mma": mma, "load": load, "a_stages": a_stages,
            "mcast": mcast, "unit": kernel_unit(kind, params), "prefetch": l2_prefetch(kind, params, load),
            "stage_chunks": int(params.get("STAGE_CHUNKS", 1)) if load == "group" else 1,
            "b_parts": int(params.get("B_PARTS", 1)) if load == "group" else 1, "push": int(push and s > 1),
            "tile_warps": tile_warps}


def kernel_name(kind: str, bf16: int, geom: dict) -> str:
    if kind == "words" and geom.get("load") == "group":
        tile_warps = int(geom.get("tile_warps", 1))   # the kernel's last template argument defaults to 1
        return (f"tc_words_grp<{bf16}, {geom['nt']}, {geom['warps']}, {geom['split']}, {geom['pipe']}, {geom['unit']}, "
                f"{geom.get('stage_chunks', 1)}, {geom.get('b_parts', 1)}, {geom.get('rows', 1)}, "
                f"{geom.get('push', 0)}{f', {tile_warps}' if tile_warps > 1 else ''}>")
    if kind == "words" and geom.get("load") == "bulk":
        return f"tc_words_bulk<{bf16}, {geom['nt']}, {geom['warps']}, {geom['split']}, {geom['ring_kb']}, {geom['unit']}>"
    if kind == "bitmap":
        return f"tc_bitmap<{bf16}, {geom['nt']}, {geom['warps']}, {geom['split']}, {geom['ring_kb']}>"
    if geom.get("sched") == "stream":
        tail = f", {geom['unit']}" if kind == "words" else ""
        return f"tc_{kind}_sk<{bf16}, {geom['nt']}, {geom['warps']}, {geom['pipe']}{tail}>"
    if geom.get("load") == "reg":
        return f"tc_{kind}_rg<{bf16}, {geom['nt']}, {geom['warps']}, {geom['split']}>"
    if kind == "words":
        return (f"tc_words<{bf16}, {geom['nt']}, {geom['warps']}, {geom['split']}, {geom['pipe']}, {geom['unit']}, "
                f"{geom.get('prefetch', 0)}>")
    if kind in BLOB_RING_KINDS:
        return f"tc_{kind}<{bf16}, {geom['nt']}, {geom['warps']}, {geom['split']}, {geom['pipe']}>"
    if geom.get("load") == "tma":
        return (f"tc_sp24tma<{bf16}, {geom['nt']}, {geom['warps']}, {geom['split']}, {geom['pipe']}, {geom['minb']}, "
                f"{geom.get('a_stages', 0)}, {geom.get('mcast', 1)}>")
    if geom.get("mma") == "wgmma":
        return (f"tc_sp24wg<{bf16}, {geom['nt']}, {geom['rows']}, {geom['warps']}, {geom['split']}, {geom['pipe']}, "
                f"{geom['bring']}, {geom.get('minb', 0)}>")
    return (f"tc_{kind}<{bf16}, {geom['nt']}, {geom['rows']}, {geom['warps']}, {geom['split']}, {geom['pipe']}, "
            f"{geom.get('bring', 0)}, {geom.get('minb', 0)}>")


def reachable_geometries(kind: str, tiles: int, nchunks: int, params: dict, sm_count: int,
                         regs_by_nt: dict | None = None, cc: tuple | None = None, b_tma: bool = True) -> list:
    """Every geometry spmm can launch for this matrix, for any N (so prepare compiles them all).

    N picks the n8-tile count, and past 8 * NT_CHOICES[-1] columns the number of n blocks (grid.z),
    which moves the auto split: wider N means more CTAs and so fewer K splits. The split only falls
    as grid.z grows and stops once grid.x * grid.z alone reaches the CTA target, so the walk below
    is finite. (On the H200 a 4096x4096 matrix reached a split at N = 129 that N = 64 had not.)
    With register counts the split follows the wave fill, which is not monotonic in grid.z, so the
    walk covers every n-block count up to WIDE_BLOCKS (N = 4096); wider N compiles on first use.
    `b_tma` as plan_geometry's (a B that does not allow the tensor map compiles on first use too).
    """
    seen: dict[tuple, dict] = {}

    def add(n: int) -> dict | None:
        try:
            geom = plan_geometry(kind, tiles, nchunks, n, params, sm_count, regs_by_nt, cc, b_tma)
        except ValueError:
            return None   # that N class does not fit these params; spmm raises the clear error if asked
        seen.setdefault((geom["nt"], geom["split"], geom["smem"], geom["mma"], geom["load"], geom.get("sched")), geom)
        return geom

    for nt in NT_CHOICES:
        add(8 * nt)
    for n in (AUTO_WGMMA_FROM_N - 1, AUTO_WGMMA_FROM_N):   # MMA "auto" switches kernels there, maybe inside one
        add(n)                                            # n8-tile count
    wide = add(8 * NT_CHOICES[-1] + 1)
    if wide is not None and wide["nt"] > NT_CHOICES[-1]:   # the wgmma kernel's 128-column blocks
        wide = add(8 * wide["nt"] + 1) or wide
    if wide is not None:
        gx = wide["grid"][0]
        last = WIDE_BLOCKS if regs_by_nt else -(-CTAS_PER_SM_TARGET * sm_count // gx) + 1
        for gz in range(1, last + 1):
            add(8 * wide["nt"] * gz)
    return sorted(seen.values(), key=lambda g: (g["nt"], g["split"], g["mma"], g["load"]))


def bulk_ring_floor_kb(offsets: np.ndarray) -> int:
    """The smallest RING_KB that holds every bulk copy blob_stream_bulk (tc_bitmap, tc_words LOAD="bulk")
    can issue for these blob offsets.

    A copy is UNIT_CHUNKS consecutive blobs of one tile (or fewer at the end of a K slice), and the
    ring must hold the largest one: near-dense tiles make 4 blobs of up to 4 * 2224 bytes, more than
    the default 8 KiB (on the H200 a 90%-dense 4096x4096 matrix overran the ring and the launch
    failed). Any window of UNIT_CHUNKS blobs bounds every slice start the split can choose.
    """
    offs = np.asarray(offsets, dtype=np.int64)
    if offs.ndim != 2 or offs.shape[1] < 2:
        raise ValueError(f"Expected blob offsets of shape [tiles, chunks + 1], got {offs.shape}.")
    largest = largest_run(offs, UNIT_CHUNKS) * 16
    return max(1, -(-largest // 1024))


#: A pack's own properties (prepare_format reads them off the packed format; packed dicts carry them
#: under these keys, 0 where a format has none): the bulk rings' RING_KB floor, the ring slot or
#: stage size, tc_words' UNIT, its CTA-stream GROUP, the STAGE_CHUNKS its stage size holds, the row
#: tiles per warp (R) and the warps per row tile (TILE_WARPS) its GROUP was made for.
PACK_KEYS = ("ring_floor_kb", "slot_bytes", "unit", "group", "stage_chunks", "group_rows", "tile_warps")


def pack_properties(source: dict | None) -> dict:
    """PACK_KEYS read off `source` (a packed dict, or any dict with some of them) as ints, 0 where absent."""
    return {key: int((source or {}).get(key, 0)) for key in PACK_KEYS}


def launch_params(params: dict, pack: dict | None = None) -> dict:
    """The template's PARAMS with the pack's properties (`pack`: a packed dict, or any dict with some of
    PACK_KEYS) applied: RING_KB raised to the floor its blobs need (the bulk rings), SLOT_BYTES, UNIT,
    and for a tc_words pack in group order (group > 1) its GROUP, with WARPS (GROUP x TILE_WARPS / R), R,
    TILE_WARPS and LOAD set to stream it, and STAGE_CHUNKS. They are properties of the packed matrix, not launch choices, so a
    launch with other params (a sweep) still reads the bytes as they are."""
    pack = pack_properties(pack)
    out = dict(params)
    if pack["ring_floor_kb"] and int(out.get("RING_KB", 0)) < pack["ring_floor_kb"]:
        out["RING_KB"] = pack["ring_floor_kb"]
    for key, param in (("slot_bytes", "SLOT_BYTES"), ("unit", "UNIT"), ("group", "GROUP"), ("stage_chunks", "STAGE_CHUNKS")):
        if pack[key]:
            out[param] = pack[key]
    if pack["group"] > 1:
        rows, tile_warps = pack["group_rows"] or 1, pack["tile_warps"] or 1
        out["WARPS"], out["R"], out["LOAD"] = pack["group"] * tile_warps // rows, rows, "group"
        out["TILE_WARPS"] = tile_warps
    return out


#: Compiled kernels of this process, by (source digest, instantiation, device): a launch that needs
#: an instantiation prepare did not compile (launch parameters changed after prepare, as a sweep
#: does) compiles it here once, and the packed dict stays as prepare made it (the verifier
#: rejects a spmm that changes its packed state between calls).
_COMPILED: dict[tuple[str, str, int], object] = {}


def kernel_arch(name: str) -> str | None:
    """The NVRTC target a kernel needs beyond the device's own (wgmma: sm_90a), or None."""
    return WGMMA_ARCH if name.startswith(("tc_sp24wg<", "tc_sp24tma<")) else None


def compile_kernels(cuda_src: str, names: list, device: torch.device) -> dict:
    """NVRTC-compile the named instantiations on `device` (once per process); {name: CuPy function}.

    Kernels that need sm_90a (kernel_arch) compile in a module of their own with -arch=sm_90a (CuPy
    appends the device's plain -arch after it; NVRTC 13.0 keeps the arch-specific target), and only
    on a compute-capability 9.0 device: elsewhere that is a clear error, not a launch failure."""
    if cp is None:
        raise RuntimeError("The tensor-core templates need CuPy (pip install cupy-cuda13x) and a CUDA GPU.")
    if cuda_src.startswith(_PLACEHOLDER):
        raise RuntimeError("CUDA_SRC is still the placeholder: instantiate the template through "
                           "sparseditto.kernel_templates.registry, which inlines tc_stream.cu.")
    index = device.index if device.index is not None else 0
    digest = hashlib.sha256(cuda_src.encode()).hexdigest()
    missing = sorted({name for name in names if (digest, name, index) not in _COMPILED})
    groups: dict = {}
    for name in missing:
        groups.setdefault(kernel_arch(name), []).append(name)
    for arch, group in groups.items():
        options = ("-std=c++17",)
        if arch is not None:
            cc = torch.cuda.get_device_capability(index)
            if tuple(cc) != WGMMA_CC:
                raise ValueError(f"{group[0]} needs an {arch} GPU (compute capability 9.0), this device is "
                                 f"{cc[0]}.{cc[1]}: use MMA='sync'.")
            options += (f"-arch={arch}",)
        with cp.cuda.Device(index):
            module = cp.RawModule(code=cuda_src, options=options, name_expressions=group)
            for name in group:
                _COMPILED[(digest, name, index)] = module.get_function(name)
    return {name: _COMPILED[(digest, name, index)] for name in names}


def prepare_launch(kind: str, arrays: dict, shape, tiles: int, nchunks: int, dtype: torch.dtype,
                   device: torch.device, params: dict, cuda_src: str, pack: dict | None = None) -> dict:
    """The packed dict every tc template returns: arrays on `device`, geometry inputs, kernels, and the
    pack's properties (`pack`, PACK_KEYS), which every launch applies over its params (launch_params):
    `ring_floor_kb` (tc_bitmap, tc_words: `bulk_ring_floor_kb` of the offsets) so no params choice can
    make a bulk copy overrun its warp's ring; `slot_bytes` (the blob-ring kernels' `slot_bytes()`) the
    ring slots or stages; `unit` / `group` / `stage_chunks` (tc_words: `TCWords.unit`, `.group`, the
    chunks its stages hold) the kernel's UNIT, GROUP (above 1: WARPS and LOAD="group"), STAGE_CHUNKS."""
    pack = pack_properties(pack)
    sms = runtime.sm_count(device)
    cc = tuple(torch.cuda.get_device_capability(device)) if device.type == "cuda" else None
    bf16 = DTYPE_FLAGS[dtype]
    lparams = launch_params(params, pack)
    b_tma = tensor_map.k_fits(int(shape[1]))      # an aligned B of these K rows can take the tensor map
    geoms = reachable_geometries(kind, tiles, nchunks, lparams, sms, cc=cc, b_tma=b_tma)
    names = [kernel_name(kind, bf16, g) for g in geoms]
    kernels, regs_by_nt = {}, {}
    if device.type == "cuda":
        # The auto split counts resident CTAs, which takes the compiled kernels' register counts:
        # compile the register-blind plan's kernels, read their registers per n8-tile count, plan
        # again with them and compile what that adds.
        kernels = compile_kernels(cuda_src, names, device)
        regs_by_nt = {regs_key(g["nt"], g["mma"], g["load"]): kernel_registers(kernels[kernel_name(kind, bf16, g)])
                      for g in geoms}
        regs_by_nt = {key: r for key, r in regs_by_nt.items() if r}
        more = [kernel_name(kind, bf16, g)
                for g in reachable_geometries(kind, tiles, nchunks, lparams, sms, regs_by_nt, cc, b_tma)]
        kernels.update(compile_kernels(cuda_src, [x for x in more if x not in kernels], device))
    tensors = {k: torch.from_numpy(np.ascontiguousarray(v)).to(device) for k, v in arrays.items()}
    return {**tensors, "arrays": tuple(arrays), "kind": kind, "shape": tuple(int(x) for x in shape),
            "tiles": tiles, "nchunks": nchunks, "dtype": dtype, "bf16": bf16, "params": dict(params), **pack,
            "sm_count": sms, "cc": cc,
            "kernels": kernels,
            "regs_by_nt": regs_by_nt,
            "cuda_src": cuda_src, "scratch": {}}


def prepare_format(kind: str, fmt_cls, A, dtype, device, params: dict, cuda_src: str, pack_args: tuple = (),
                   stage_chunks: int = 0, group_rows: int = 1, tile_warps: int = 1) -> dict:
    """A tc template's whole prepare: pack A with `fmt_cls` (a sparseditto.tc_formats class; `pack_args`
    after the dtype, e.g. tc_words' unit) in the dtype's bits, move its kernel arrays to `device` and
    compile what the launches can reach."""
    dt = torch_dtype(dtype)
    fmt = fmt_cls.from_matrix(A, dtype_name(dt), *pack_args)
    tiles, chunks, arrays = fmt.kernel_arrays()
    group = int(getattr(fmt, "group", 0))
    pack = {"ring_floor_kb": bulk_ring_floor_kb(fmt.offsets) if kind == "bitmap" or (kind == "words" and group == 1) else 0,
            "slot_bytes": (fmt.slot_bytes(stage_chunks) if stage_chunks else fmt.slot_bytes()) if kind in BLOB_RING_KINDS else 0,
            "unit": getattr(fmt, "unit", 0), "group": group, "stage_chunks": stage_chunks,
            "group_rows": group_rows if group > 1 else 0, "tile_warps": tile_warps if group > 1 else 0}
    return prepare_launch(kind, arrays, A.shape, tiles, chunks, dt, torch.device(device), params, cuda_src, pack)


def kernel_registers(fn) -> int:
    """Registers per thread of a compiled kernel (0 when the driver does not say)."""
    regs = getattr(fn, "num_regs", None)
    if regs is None:
        try:
            drv = cp.cuda.driver
            regs = drv.funcGetAttribute(drv.CU_FUNC_ATTRIBUTE_NUM_REGS, fn.ptr)
        except Exception:   # noqa: BLE001 - an older CuPy without the attribute: plan without it
            regs = 0
    return int(regs or 0)


def _set_dynamic_smem(fn, nbytes: int) -> None:
    """Allow more than 48 KiB of dynamic shared memory (cudaFuncSetAttribute)."""
    try:
        fn.max_dynamic_shared_size_bytes = nbytes
    except AttributeError:
        drv = cp.cuda.driver
        drv.funcSetAttribute(fn.ptr, drv.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes)


def _plan(packed: dict, n: int, b: torch.Tensor, out: torch.Tensor) -> dict:
    kind = packed["kind"]
    params = launch_params(packed["params"], packed)
    m, k = packed["shape"]
    b_tma = tensor_map.tma_ready(k, b.stride(0), b.data_ptr(), b.stride(1) if n > 1 else 1)

    def geometry(tma_ok: bool) -> dict:
        return plan_geometry(kind, packed["tiles"], packed["nchunks"], n, params, packed["sm_count"],
                             packed.get("regs_by_nt") or None, packed.get("cc"), tma_ok)

    geom, maps, fallback, b_map = geometry(b_tma), {}, None, None
    if geom["load"] == "tma":
        b_map = (n, k, int(b.stride(0)), 32 if geom["nt"] == 4 else 64)
        try:   # the driver decides what a tensor map may describe: if it refuses, the cp kernel runs
            maps[b.data_ptr()] = tensor_map.encode(b.data_ptr(), *b_map)
        except (RuntimeError, OSError, AttributeError) as exc:
            geom, fallback = geometry(False), f"tensor map refused, tc_sp24wg runs instead: {exc}"
    name = kernel_name(kind, packed["bf16"], geom)
    fn = packed["kernels"].get(name)
    if fn is None:   # params changed after prepare (a sweep): compile on first use, outside packed
        fn = compile_kernels(packed["cuda_src"], [name], b.device)[name]
    _set_dynamic_smem(fn, geom["smem"])
    head = tuple(np.uint64(packed[a].data_ptr()) for a in packed["arrays"])
    bvec = int(b.stride(0) % 8 == 0 and b.data_ptr() % 16 == 0)
    tail = (np.int32(m), np.int32(n), np.int32(k), np.int32(packed["nchunks"] * CHUNK_K), np.int64(b.stride(0)),
            np.int64(out.stride(0)), np.int32(geom["chunks_per_cta"]), np.int32(packed["tiles"]), np.int32(bvec))
    if kind in BLOB_RING_KINDS and geom["load"] != "bulk":   # blob_stream's ring slots
        tail += (np.int32(geom["slot_bytes"]),)
    keep = {}
    if geom.get("sched") == "stream":
        keep = _stream_buffers(geom, packed["nchunks"], b.device)
        tail += tuple(np.uint64(keep[key].data_ptr()) for key in ("workspace", "counts", "schedule"))
    # tc_sp24tma takes B's tensor map first (made per B buffer in launch)
    return {"fn": fn, "grid": geom["grid"], "block": geom["block"], "smem": geom["smem"], "head": head,
            "tail": tail, "geom": geom, "b_map": b_map if fallback is None else None, "maps": maps,
            "tma_fallback": fallback, **keep}


def _stream_buffers(geom: dict, nchunks: int, device: torch.device) -> dict:
    """A stream-K plan's device buffers, kept in the plan (packed['scratch'], which the verifier resets
    before every call): the fp32 partial tiles (per n block, CTA and touched group), the per-group
    arrival counters (zero; the kernel leaves them zero) and the schedule."""
    ctas, _, gz = geom["grid"]
    part = geom["warps"] * TILE_M * geom["nt"] * 8
    return {"workspace": torch.empty(gz * ctas * geom["kmax"] * part, dtype=torch.float32, device=device),
            "counts": torch.zeros(gz * geom["groups"], dtype=torch.int32, device=device),
            "schedule": torch.from_numpy(stream_schedule(geom["groups"], nchunks, ctas)).to(device)}


B_MAPS_KEPT = 8    # tensor maps kept per plan (one per B buffer seen; a decode loop reuses a few)


def _b_map(plan: dict, b_ptr: int) -> np.ndarray:
    """B's tensor map for this plan's layout at `b_ptr`, encoded once per buffer."""
    maps = plan["maps"]
    found = maps.get(b_ptr)
    if found is None:
        if len(maps) >= B_MAPS_KEPT:
            maps.pop(next(iter(maps)))
        n, k, ldb, box_cols = plan["b_map"]
        found = maps[b_ptr] = tensor_map.encode(b_ptr, n, k, ldb, box_cols)
    return found


def launch(packed: dict, B: torch.Tensor, out: torch.Tensor) -> None:
    """out[M, N] = A @ B with one kernel launch on torch's current stream (plans cached)."""
    n, b, target = runtime.cuda_operands(packed, B, out, packed["dtype"], "A tensor-core template")
    if n == 0:
        return
    scratch = packed["scratch"]
    key = (n, b.device.index, b.stride(0), target.stride(0), b.data_ptr() % 16 == 0)
    plan = scratch.get(key)
    if plan is None:
        plan = _plan(packed, n, b, target)
        scratch[key] = plan
    direct = plan.get("direct")
    stream_handle = runtime.raw_stream(b.device) if direct else None
    if stream_handle is not None:
        direct(stream_handle, b.data_ptr(), target.data_ptr())
    else:
        device, stream = runtime.cupy_stream(scratch, b.device)
        args = plan["head"] + (np.uint64(b.data_ptr()), np.uint64(target.data_ptr())) + plan["tail"]
        if plan["b_map"] is not None:
            args = (_b_map(plan, b.data_ptr()),) + args
        with device, stream:
            plan["fn"](plan["grid"], plan["block"], args, shared_mem=plan["smem"])
            if direct is None and runtime.direct_launch_enabled():
                plan["direct"] = _direct(plan)
    if target is not out:
        out.copy_(target)


def _direct(plan: dict):
    """The plan as a runtime.DirectLaunch (B and C pointer slots), or False: tc_sp24tma's tensor map
    argument (per B buffer) stays with CuPy."""
    if plan["b_map"] is not None:
        return False
    return runtime.direct_launch(plan["fn"], plan["grid"], plan["block"], plan["smem"], plan["head"], plan["tail"])
