"""Unstructured SpMM on tensor cores: a bitmap in fragment order, decoded in registers.

Why this template exists: for 30-90% unstructured sparsity at decode N, CSR's 4-byte column ids
cost more than the values they save, while a bitmap costs one bit per element: 50% sparse fp16
needs ~1.18 bytes per element instead of dense's 2. The kernel keeps A compressed all the way into
registers. Each warp streams its 16-row tile over the CTA's K slice, four blobs per bulk (TMA)
copy, into a byte ring in shared memory with up to four copies in flight on mbarriers; a lane finds its rank among the chunk's kept values with one popc,
turns each 4-element nibble into two mma.sync registers with four 16-bit loads and two PRMTs
driven by a 16-entry table, and the dense tensor cores do the arithmetic. Split-K runs over a
thread-block cluster with a deterministic reduction in distributed shared memory.
"""
META = {
    "name": "tc_bitmap",
    "backend": "cuda",
    "format": "tc_bitmap",
    "description": "bitmap + values in mma fragment order, TMA-pipelined, decoded in registers (popc rank, PRMT tables)",
    "params": {"WARPS": [4, 8], "SPLIT": ["auto", 1, 2, 4, 8], "RING_KB": [8, 12, 16]},
    "defaults": {"WARPS": 4, "SPLIT": "auto", "RING_KB": 8},
    # H200 sweep: defaults or SPLIT=8 best (90%: 16.7-31 us, 1.1x cuBLAS at N=1); WARPS=8 at N=64.
    "grid": [{}, {"SPLIT": 8}, {"WARPS": 8}],
    "patterns": ["unstructured", "power_law", "row_pruned", "column_pruned", "block", "nm", "banded"],
    "cuda_source": "tc_stream.cu",
    # tc_stream.cu uses thread-block clusters, bulk (TMA) copies and mbarrier transaction counts: sm_90 only
    # (nvcc for sm_80 / sm_89 stops at __cluster_dims__), so the planner leaves it out on older GPUs
    "min_compute_capability": [9, 0],
    "dtypes": ["float16", "bfloat16"],
}
PARAMS = dict(META["defaults"])

CUDA_SRC = r"""@SPARSEDITTO_INLINE tc_stream.cu@"""

from sparseditto.kernel_templates.tc_launch import launch, prepare_format
from sparseditto.tc_formats import TCBitmap


def prepare(A, dtype, device) -> dict:
    """The fragment-order blobs and their offsets on `device`, and the compiled kernels."""
    return prepare_format("bitmap", TCBitmap, A, dtype, device, PARAMS, CUDA_SRC)


def spmm(packed: dict, B, out) -> None:
    """out = A @ B: one launch (B [K, N] fp16/bf16 on the GPU)."""
    launch(packed, B, out)
