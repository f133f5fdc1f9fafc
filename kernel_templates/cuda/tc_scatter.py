"""Unstructured SpMM on tensor cores for decode widths: (value, position byte) pairs scattered into
mma fragments in shared memory ("load as sparse, compute as dense").

Why this template exists: at N = 8-16 the bitmap kernel (tc_lanemask) spends ~300 warp instructions
per 1024 matrix elements on its decode whatever the sparsity, and stays below cuBLAS on the H200 at
50-90% (0.74-0.90x); the per-nonzero CUDA-core kernels pay N multiply-adds and a B row per kept value.
Here each kept value costs ~3 bytes and a few instructions (a lane loads 8 values and their 8
position bytes with two shared loads, then 8 16-bit stores), every element's share of the fragment
read-back is one 16-byte load per 8 elements, and the tensor cores make N up to 32 cost about the
same as N = 1. Measured (H200, session 32): below cuBLAS at 50-70% (0.64-0.98x chained), 0.96-1.15x
at 90%; planning/tc_scatter.py has the figures and why.

Layout (sparseditto.tc_formats.TCScatter): per (16-row tile, 64-column chunk) a blob of 4 step counts
(each padded to a whole group of 8 values), the values and their position bytes (which half of which
lane's fragment register), ordered so that each store instruction spreads over the shared-memory
banks. A warp streams its tile's blobs through tc_lanemask's cp.async ring (blob_stream in
tc_stream.cu), scatters each blob into its four 512-byte step regions, reads its own fragment back
with one 16-byte load per step, zeroes it, and runs the step's mma.sync. Split-K over a thread-block
cluster with the deterministic reduction in distributed shared memory.
"""
META = {
    "name": "tc_scatter",
    "backend": "cuda",
    "format": "tc_scatter",
    "description": "value + position byte per kept value, scattered into mma.sync fragments in shared memory",
    # SCHED: "cluster" = a K split over a thread-block cluster, partials summed in distributed shared
    # memory; "stream" = one wave of CTAs over evenly cut (row-tile group, chunk) ranges, partials
    # summed by the last CTA to finish a group (blob_stream_sk in tc_stream.cu; SPLIT is unused)
    # LOAD: "ring" = blobs through a per-warp cp.async ring in shared memory (PIPE slots); "reg" = each
    # lane loads its groups straight into registers one blob ahead (tc_scatter_rg; PIPE unused; H200
    # session 34: within a few % of the ring at N = 8, up to 1.6x slower at N = 16; not the default)
    "params": {"WARPS": [4, 8, 16], "SPLIT": ["auto", 1, 2, 4, 8], "PIPE": [2, 3, 4, 6], "SCHED": ["cluster", "stream"],
               "LOAD": ["ring", "reg"]},
    # WARPS=4: 6-12% faster than 8 on 4096x4096 (256 row tiles: twice the CTAs), within 7% of it on
    # 11008x4096 (H200, session 32; planning/tc_scatter.py has the figures)
    "defaults": {"WARPS": 4, "SPLIT": "auto", "PIPE": 3, "SCHED": "cluster", "LOAD": "ring"},
    "grid": [{}, {"WARPS": 8}],
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
from sparseditto.tc_formats import TCScatter


def prepare(A, dtype, device) -> dict:
    """The scatter blobs and their offsets on `device`, and the compiled kernels."""
    return prepare_format("scatter", TCScatter, A, dtype, device, PARAMS, CUDA_SRC)


def spmm(packed: dict, B, out) -> None:
    """out = A @ B: one launch (B [K, N] fp16/bf16 on the GPU)."""
    launch(packed, B, out)
