"""Dense streaming GEMM for skinny N on mma.sync: the weight read at near copy bandwidth.

Why this template exists: at decode sizes (N <= 32) cuBLAS reads a pruned-but-dense-stored weight
at ~60% of the H200's copy bandwidth (11008x4096 fp16 in 34.6 us, 4096x4096 in 19 us), so a kernel
that only streams the padded dense weight, 16-byte loads straight into tensor-core fragments, can
beat it by up to ~1.6x without any sparsity. It is the candidate of choice when the pattern is too
dense for any sparse format to save bytes, and the floor the sparse tensor-core templates build on
(tc_sp24, tc_bitmap share its kernel skeleton in tc_stream.cu). Speedups stay reported against
cuBLAS. N above 64 runs as blocks of 64 columns; there cuBLAS's own tiling usually wins.
"""
META = {
    "name": "tc_dense",
    "backend": "cuda",
    "format": "tc_dense",
    "description": "dense weight streamed with 16-byte loads into mma.sync fragments, split-K over a CTA cluster (decode N)",
    "params": {"WARPS": [4, 8, 16], "R": [1, 2, 4], "SPLIT": ["auto", 1, 2, 4, 8], "PIPE": [2, 3, 4],
               "BRING": ["auto", 0, 2, 3, 4], "MINB": [0, 2, 3, 4]},
    "defaults": {"WARPS": 8, "R": 1, "SPLIT": "auto", "PIPE": 2, "BRING": "auto", "MINB": 0},
    # H200 (session 25, llm_layers --cases /dense, chained, N = 1-32): R=1 reads 11008x4096 in
    # 26.5-27.7 us at N = 1-16 (0.98-0.99x cuBLAS, 1.47x at N = 4), where R=2 (two row tiles per
    # warp, more registers, fewer resident warps) took 31-32 us; on 4096x11008 and 4096x4096 the two
    # are within 4%. At N = 32 PIPE=3 is 12% faster on 11008x4096.
    # Session 26 (N = 32-64, with the MINB=1 register cap of that call on every row): the B ring helped
    # 4096x11008 at N = 64 (71.0 -> 57.4 us) and hurt it at N = 32 (41.5 -> 48.1), both far below
    # cuBLAS (0.52-0.71x); "auto" follows tc_sp24's rule and was not re-measured for tc_dense.
    "grid": [{}, {"PIPE": 3}, {"R": 2}, {"SPLIT": 8}],
    "patterns": ["dense", "unstructured", "row_pruned", "column_pruned", "block", "nm", "banded"],
    "cuda_source": "tc_stream.cu",
    # tc_stream.cu uses thread-block clusters, bulk (TMA) copies and mbarrier transaction counts: sm_90 only
    # (nvcc for sm_80 / sm_89 stops at __cluster_dims__), so the planner leaves it out on older GPUs
    "min_compute_capability": [9, 0],
    "dtypes": ["float16", "bfloat16"],
}
PARAMS = dict(META["defaults"])

CUDA_SRC = r"""@SPARSEDITTO_INLINE tc_stream.cu@"""

from sparseditto.kernel_templates.tc_launch import launch, prepare_format
from sparseditto.tc_formats import TCDense


def prepare(A, dtype, device) -> dict:
    """The padded dense weight on `device` and the compiled kernels for every N tile count."""
    return prepare_format("dense", TCDense, A, dtype, device, PARAMS, CUDA_SRC)


def spmm(packed: dict, B, out) -> None:
    """out = A @ B: one launch (B [K, N] fp16/bf16 on the GPU)."""
    launch(packed, B, out)
