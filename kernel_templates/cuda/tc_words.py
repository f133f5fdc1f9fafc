"""Unstructured SpMM at decode widths that keeps or drops whole tensor-core fragment words.

Why this template exists: the bitmap and scatter kernels (tc_lanemask, tc_scatter) expand kept
values into mma fragments value by value in shared memory and spend 300-450 warp instructions per
16x64 block doing it, so on the H200 they stay below cuBLAS at 50-70% sparsity (0.64-0.98x at N =
8-16) however few bytes they read. A lane's A fragment is 16 32-bit words (tc_dense's registers),
each two neighbouring values of one row; at 70% unstructured sparsity half of those words are all
zero. This format stores only the nonzero units (UNIT 1: one word; UNIT 2: two, four values),
unit-major (unit u of every lane that keeps it, lanes in order) behind a header of per-unit lane
masks and bases, so a lane fills unit u with one predicated shared load at base_u + popc(mask_u &
lanes below): ~8 instructions per register whatever the sparsity (138 per block at UNIT 1, 52 at
UNIT 2, nvcc sm_90), no scatter, no zeroing, no read-back. Bytes at UNIT 1: 4 per kept word + a
96-byte header per block, 1.28 / 1.84 / 4.5x fewer than dense at 50 / 70 / 90% random sparsity
(cost.kept_words); per-row magnitude pruning keeps words as random placement does.

Layout (sparseditto.tc_formats.TCWords) and the kernel (tc_words in tc_stream.cu): tc_lanemask's and
tc_scatter's blob ring (blob_stream: a warp per 16-row tile and K slice, its blobs copied into a
per-warp cp.async ring PIPE - 1 ahead, B's K slice staged in shared memory, split-K over a
thread-block cluster with the deterministic DSMEM reduction), the decoder above, then tc_dense's mma.
A first version loaded the kept words straight from global memory into registers (stream_registers,
a per-lane mask and a ballot per register): correct on the H200, but one chunk in flight per warp
made it latency-bound at ~40 us on 11008x4096 whatever the sparsity (0.6x cuBLAS; docs/kernels.md).
"""
META = {
    "name": "tc_words",
    "backend": "cuda",
    "format": "tc_words",
    "description": "kept 32-bit fragment words through a cp.async ring into mma.sync registers (popc addressing), "
                   "split-K over a CTA cluster",
    # UNIT: fragment registers kept or dropped together (1: two values of a row, 4 bytes; 2: four, 8 bytes)
    # SCHED: "cluster" = a K split over a thread-block cluster; "stream" = tc_scatter's stream-K grid
    # (tc_words_sk; H200 session 35: 0.58-1.10x cuBLAS where "cluster" ran 0.91-1.44x, slower on all 12 rows)
    # PF: blobs lane 0 asks the copy engine to pull into L2 beyond the ring's last copy (LOAD="ring")
    # LOAD: "ring" = blob_stream's cp.async ring of PIPE blobs per warp; "bulk" = blob_stream_bulk: four blobs
    # per bulk (TMA) copy into a RING_KB byte ring per warp, up to four copies in flight (tc_words_bulk;
    # "auto" RING_KB holds three mean copies, raised to the pack's largest: cost.words_ring_kb). H200
    # session 35: "bulk" 0.37-1.12x cuBLAS over 64 rows (WARPS 2-8, SPLIT 1-8, RING_KB 9-20), slower than
    # "ring" on every one: its rings cost the CTAs per SM (7.6 warps per SM where "ring" keeps 21.6);
    # "group" = tc_words_grp: the pack stores each CTA's WARPS tiles chunk by chunk, a producer warp moves
    # one chunk run of the CTA per bulk copy, PIPE stages deep, on full / empty mbarriers; "auto": "group"
    # from 512 row tiles with one-register units (11008x4096, H200 session 35: 7-11% faster than "ring" at
    # 50%, 1-4% at 70%; 2-3% slower at 90% with two-register units), and with 4 warps of one tile each from 128
    # row tiles when K is at most 64 chunks (4096x4096, session 38: 1-7% faster than "ring" at 50-90%, N = 8 /
    # 16; 4-5% slower on 4096x11008), else "ring"
    # STAGE_CHUNKS (LOAD="group"): chunks per stage, one bulk copy and one barrier round trip each (the pack's
    # stage size follows it). H200 session 35, 11008x4096 50 / 70%, N = 8 / 16: 2 ran 28.3 / 31.6 and 22.9 /
    # 25.4 us, 4 ran 32.5 / 52.0 and 28.9 / 33.7, against 26.3 / 26.0 and 22.7 / 23.1 at 1: bigger stages cost
    # CTAs per SM (68-120 KB) and the auto split went to 8; 1 stays the default
    # B_PARTS (LOAD="group"): the consumer warps stage B's K slice in this many cp.async groups and start on the
    # first part's chunks while the rest lands (1: every thread stages all of B and the CTA waits for it). Why: the
    # H200 stage probe (benchmarks/words_stage_probe.py, session 36) put 1.6-1.7 us of 11008x4096's 23-26 us on
    # staging B before the first chunk. Measured (session 36, 11008x4096 50 / 70%, N = 8 / 16): 2 and 4 parts
    # 0.1-1.9 us slower on all 8 rows (the staging's L2 traffic stays, the producer warp leaves it, a barrier
    # per part is added); 1 stays the default
    # R (LOAD="group"): row tiles per consumer warp, 1 or 2 (the pack groups WARPS x R tiles): with 2 a warp
    # decodes two blobs per chunk before one mma pass that reads B's fragments once for both. Why: the stage
    # probe (session 36) put the consumers' decode + mma (~17.5 us on 11008x4096) above the 70% pack's load time
    # (15.0 us) with ~14% fewer instructions running slower, i.e. bound by each warp's dependency chain: two
    # independent chains per warp, same warps per SM. H200 (session 37, 11008x4096, N = 8 / 16): 4-7% faster at
    # 70% (21.1 / 22.3 us against 22.6 / 23.3), level / 6% slower at 50%; "auto": 2 at <= 35% density on the CTA
    # stream (cost.words_auto_params)
    # EPILOGUE (LOAD="group", SPLIT > 1): "pull" = partials over the stages, a cluster barrier, each CTA reads
    # its rows' partials from its peers (DSMEM), a second barrier; "push" = each warp sends its partial rows to
    # their owner CTA with st.async onto the owner's mbarrier (a receive region beside the stages), no barrier
    # at the end (tc_stream.cu PushReduce). Why: the stage probe (session 37) put ~2 us on the pull epilogue, its
    # barriers 0.3-0.7 of them. H200 (session 37, 11008x4096, N = 8 / 16): push 0.2-0.6 us faster than pull at 50
    # and 70%; "auto" pushes up to two n8 tiles (N <= 16; the receive region grows with N) and pulls wider
    # TILE_WARPS (LOAD="group", R 1, STAGE_CHUNKS 1): consumer warps per row tile; 2 packs WARPS / 2 tiles per CTA
    # with stages of two chunks, one for each warp of a tile, and adds the pair's partials in shared memory
    # before the epilogue. Why: on 4096x4096 (256 row tiles) the CTA stream gives each warp 8 chunks at ~19
    # warps per SM, and the stage probe (session 38, H200) put its consumers 3.3 us above the loads at 70%
    # (ncu: issue active 54%): a warp's chain of decode steps, it seemed, set the time. Measured (session 38, H200,
    # N = 8 / 16, chained): slower on every row: 4096x4096 at 50 / 70 / 90% 13.6-14.5 / 12.5-13.5 / 10.8-12.6 us
    # with 8 warps (16: 15.3-16.4 / 13.9-15.1 / 11.9-13.2) against 12.6-13.4 / 11.5-12.4 / 9.7-10.9 for 4 warps of
    # one tile; 11008x4096 26.5-31.5 against 21.7-25.1 (the default); on 4096x11008 32.7 / 31.4 at 50 / 70% (8 /
    # 16 warps) against the ring's 36.5 / 34.0, all below cuBLAS (28.6-28.8). Correct (GPU tests), not a default
    "params": {"WARPS": ["auto", 2, 4, 8, 16], "SPLIT": ["auto", 1, 2, 4, 8], "PIPE": [2, 3, 4, 6], "UNIT": ["auto", 1, 2],
               "SCHED": ["cluster", "stream"], "LOAD": ["auto", "ring", "bulk", "group"], "RING_KB": ["auto", 8, 12, 16, 24, 32],
               "PF": [0, 2, 4, 8], "STAGE_CHUNKS": [1, 2, 4], "B_PARTS": [1, 2, 4], "R": ["auto", 1, 2],
               "EPILOGUE": ["auto", "pull", "push"], "TILE_WARPS": [1, 2]},
    # H200 (session 34, magnitude 50-90%, N = 1-16): PIPE 4 / 6 0-20% slower than 3, PIPE 2 3.4% faster
    # than 3 (geomean of 20 rows, 15 faster, -4% to +18%: benchmarks/results/tc_words_h200_2026-12-04);
    # "auto" UNIT, WARPS and LOAD follow cost.words_auto_params (UNIT 2 at <= 15% density, 8 warps and the
    # CTA stream from 512 row tiles)
    "defaults": {"WARPS": "auto", "SPLIT": "auto", "PIPE": 2, "UNIT": "auto", "SCHED": "cluster", "LOAD": "auto",
                 "RING_KB": "auto", "PF": 0, "STAGE_CHUNKS": 1, "B_PARTS": 1, "R": "auto", "EPILOGUE": "auto",
                 "TILE_WARPS": 1},
    "grid": [{}, {"WARPS": 8}, {"WARPS": 4}, {"UNIT": 2}, {"PIPE": 3}, {"LOAD": "ring"}, {"LOAD": "group"}],
    "patterns": ["unstructured", "nm", "block", "row_pruned", "column_pruned", "banded"],
    "cuda_source": "tc_stream.cu",
    # tc_stream.cu uses thread-block clusters, bulk (TMA) copies and mbarrier transaction counts: sm_90 only
    # (nvcc for sm_80 / sm_89 stops at __cluster_dims__), so the planner leaves it out on older GPUs
    "min_compute_capability": [9, 0],
    "dtypes": ["float16", "bfloat16"],
}
PARAMS = dict(META["defaults"])

CUDA_SRC = r"""@SPARSEDITTO_INLINE tc_stream.cu@"""

from sparseditto.kernel_templates.tc_launch import launch, prepare_format, words_auto_params
from sparseditto.tc_formats import TCWords


def prepare(A, dtype, device) -> dict:
    """The packed blobs (lane masks, bases, kept units) and their offsets on `device`, and the compiled
    kernels; "auto" UNIT / WARPS / LOAD / RING_KB resolved for this matrix (packed['params'] holds the numbers)."""
    params = words_auto_params(PARAMS, A.shape[0], A.shape[1], A.nnz)
    stream = params.get("LOAD") == "group"
    rows = int(params["R"]) if stream else 1
    pair = int(params.get("TILE_WARPS", 1)) if stream else 1   # warps per tile: stages of one chunk per warp
    group = max(1, int(params["WARPS"]) * rows // pair) if stream else 1   # the CTA stream's pack order: WARPS x R / TILE_WARPS tiles
    stage_chunks = int(params["STAGE_CHUNKS"]) * pair
    return prepare_format("words", TCWords, A, dtype, device, params, CUDA_SRC, (int(params["UNIT"]), group),
                          stage_chunks=stage_chunks if group > 1 else 0, group_rows=rows, tile_warps=pair)


def spmm(packed: dict, B, out) -> None:
    """out = A @ B: one launch (B [K, N] fp16/bf16 on the GPU)."""
    launch(packed, B, out)
