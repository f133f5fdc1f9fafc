"""Unstructured SpMM on tensor cores for decode widths (N = 4..32): one mask word per lane, cp.async.

Why this template exists: at N = 8-16 a 50-70% pruned weight has no kernel ahead of cuBLAS here:
delta_spmv's per-nonzero work grows with N (0.3-0.9x cuBLAS at N = 8), and tc_bitmap's decode
measured latency-bound on the H200 (ncu: 21% issue active, ~8 warps per SM, a chain of dependent
shared loads per step). The tensor cores make N up to 32 cost the same as N = 1, so the kernel is
the bytes of A (2 per kept value + 1 bit per element) plus a decode that must keep up with them.

Layout (sparseditto.tc_formats.TCLaneMask): per (16-row tile, 64-column chunk) a blob of 32 lane
words (lane (g, t)'s 32 elements: rows g and g+8, columns 16t..16t+15 of the chunk) and the kept
values lane by lane. Each warp streams its tile over the CTA's K slice, blob by blob through a ring
of PIPE slots in shared memory filled by 16-byte cp.async (PIPE-1 blobs in flight); a lane's rank is
a warp scan of popcounts, and every quad's start a SWAR nibble prefix of its word, so a chunk's 32
gathers per lane are independent; a 16-entry table and PRMT build the mma.sync fragments. Split-K
runs over a thread-block cluster with tc_stream's deterministic reduction in distributed shared
memory.
"""
META = {
    "name": "tc_lanemask",
    "backend": "cuda",
    "format": "tc_lanemask",
    "description": "lane mask words + values per (16x64) blob, cp.async ring per warp, decoded into mma.sync fragments",
    "params": {"WARPS": [4, 8, 16], "SPLIT": ["auto", 1, 2, 4, 8], "PIPE": [2, 3, 4, 6]},
    # H200 (2026-12-03, N = 8 / 16, 4096x4096 and 11008x4096 at 50-70%): PIPE 3 within 2% of 4 or
    # faster (11008x4096 50% N = 16: 36.8 vs 41.2 us: a third CTA per SM fits); WARPS 16 slower; WARPS 4
    # (split 8, PIPE 4; session 32) 4-9% faster on 4096x4096 but up to 15% slower on 11008x4096: kept at 8
    "defaults": {"WARPS": 8, "SPLIT": "auto", "PIPE": 3},
    "grid": [{}, {"PIPE": 4}, {"SPLIT": 8}],
    # a natural candidate only where no structure gives a cheaper index (measured 0.56-0.90x cuBLAS at
    # N = 8-16 on 50-70% unstructured weights: the planner reaches it by cost, not by preference)
    "patterns": ["unstructured"],
    "cuda_source": "tc_stream.cu",
    # tc_stream.cu uses thread-block clusters, bulk (TMA) copies and mbarrier transaction counts: sm_90 only
    # (nvcc for sm_80 / sm_89 stops at __cluster_dims__), so the planner leaves it out on older GPUs
    "min_compute_capability": [9, 0],
    "dtypes": ["float16", "bfloat16"],
}
PARAMS = dict(META["defaults"])

CUDA_SRC = r"""@SPARSEDITTO_INLINE tc_stream.cu@"""

from sparseditto.kernel_templates.tc_launch import launch, prepare_format
from sparseditto.tc_formats import TCLaneMask


def prepare(A, dtype, device) -> dict:
    """The lane-mask blobs and their offsets on `device`, and the compiled kernels."""
    return prepare_format("lanemask", TCLaneMask, A, dtype, device, PARAMS, CUDA_SRC)


def spmm(packed: dict, B, out) -> None:
    """out = A @ B: one launch (B [K, N] fp16/bf16 on the GPU)."""
    launch(packed, B, out)
