"""2:4 structured SpMM on the sparse tensor cores (mma.sp), for N from 1 up.

Why this template exists: a 2:4-pruned weight stores 2 values and 4 bits of positions per group of
4 (2.25 bytes per kept value), and the sparse tensor cores decode that layout in hardware, so the
kernel spends no instructions on expansion: the kept values are loaded with 16-byte loads straight
into the mma.sp A fragment and the positions go to the instruction as its metadata operand. At
decode N the time is the compressed bytes over bandwidth (1.78x fewer than the dense weight, and
cuBLAS reaches only ~60% of bandwidth at these sizes); at large N the sparse tensor cores double
the math rate. Exact for any matrix whose every group of 4 consecutive columns keeps at most 2
values (2:4, 1:2, 1:4 and any pattern contained in them); prepare() refuses anything else.
"""
META = {
    "name": "tc_sp24",
    "backend": "cuda",
    "format": "tc_sp24",
    "description": "2:4 values + hardware metadata on mma.sp.m16n8k32, split-K over a CTA cluster",
    "params": {"WARPS": [4, 8], "R": [1, 2], "SPLIT": ["auto", 1, 2, 4, 8], "PIPE": [2, 3, 4]},
    "defaults": {"WARPS": 8, "R": 1, "SPLIT": "auto", "PIPE": 4},
    # H200 sweep (benchmarks/llm_layers.py --preset core): R=1/PIPE=4 fastest at N <= 16 on both
    # 11008x4096 (22.1 us, 1.56x cuBLAS) and 4096x4096 (13.3 us, 1.45x); SPLIT=4 second.
    "grid": [{"R": 1, "PIPE": 4}, {"R": 1, "PIPE": 4, "SPLIT": 4}, {"R": 2, "PIPE": 2}],
    "patterns": ["nm"],
    "cuda_source": "tc_stream.cu",
    "dtypes": ["float16", "bfloat16"],
    "cost": {"unit": "sparse_tensor"},
}
PARAMS = dict(META["defaults"])

CUDA_SRC = r"""@SPARSEDITTO_INLINE tc_stream.cu@"""

from sparseditto.kernel_templates.tc_launch import launch, prepare_format
from sparseditto.tc_formats import TCSparse24


def prepare(A, dtype, device) -> dict:
    """2:4 values and mma.sp metadata on `device`; ValueError when A is not 2:4 structured."""
    return prepare_format("sp24", TCSparse24, A, dtype, device, PARAMS, CUDA_SRC)


def spmm(packed: dict, B, out) -> None:
    """out = A @ B: one launch (B [K, N] fp16/bf16 on the GPU)."""
    launch(packed, B, out)
