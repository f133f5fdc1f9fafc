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
    "description": "2:4 values + hardware metadata on mma.sp.m16n8k32 (wgmma.sp on sm_90a from N = 32, "
                   "fed by the TMA copy engine), split-K over a CTA cluster",
    "params": {"WARPS": [4, 8, 16], "R": [1, 2, 4], "SPLIT": ["auto", 1, 2, 3, 4, 6, 8], "PIPE": [2, 3, 4],
               "BRING": ["auto", 0, 2, 3, 4], "MINB": [0, 2, 3, 4],
               "MMA": ["auto", "sync", "wgmma"], "WPIPE": [2, 3, 4, 6], "WLOAD": ["auto", "cp", "tma"],
               "WSTAGES": ["auto", 2, 3, 4, 6, 8], "TWARPS": ["auto", 4, 8, 16],
               "ASTAGES": [0, 4, 6, 8, 12], "MCAST": [1, 2, 4]},
    "defaults": {"WARPS": 8, "R": 1, "SPLIT": "auto", "PIPE": 2, "BRING": "auto", "MINB": 0, "MMA": "auto",
                 "WPIPE": 3, "WLOAD": "auto", "WSTAGES": "auto",
                 "TWARPS": "auto", "ASTAGES": 0, "MCAST": 1},
    # H200 (session 25, llm_layers --cases nm24 --n 8 16, chained): PIPE=4 needs 87 registers at
    # N = 9-16 (two n8 tiles), so only 2 CTAs fit an SM and 11008x4096 ran 1.3 waves: 26.1 us, 0.97x
    # cuBLAS. PIPE=2 keeps more warps resident instead of more chunks in flight per warp: 17.9 us
    # (1.41x) there, 9.6 us (1.49x) on 4096x4096, and it is also the faster one at N = 8.
    # Session 26 (H200, N = 16-128): BRING "auto" rings B where the whole K slice would exceed 64 KiB
    # (4096x11008 N = 64: 68.6 -> 44.4 us); MINB 0, because an explicit launch-bounds minimum of 1
    # raised registers (80 -> 94 at N = 64, 12% slower); R=2 shares B fragments but its 128-149
    # registers cost more than the halved ldmatrix reads save (docs/kernels.md, "Session 26").
    # Session 27: MMA "auto" runs N >= 32 on an sm_90 GPU through tc_sp24wg (wgmma.mma_async.sp,
    # B read by the tensor cores from shared memory for 64 rows at once, A staged through shared
    # memory WPIPE - 1 chunks ahead; R 1 or 2 there), the same packed format; "sync" keeps the
    # mma.sync kernel everywhere (H200: 2:4 N = 64 0.74 -> 1.11x cuBLAS on 11008x4096).
    # Session 28: WLOAD "auto" feeds that kernel through the copy engine (tc_sp24tma: B by tensor map,
    # A by per-warp bulk copies, mbarrier stages, TWARPS / WSTAGES auto) wherever B allows it;
    # "cp" keeps tc_sp24wg. H200, chained: N = 64 1.18 / 1.12 / 0.96x cuBLAS on 11008x4096 /
    # 4096x11008 / 4096x4096 (from 1.12 / 1.05 / 0.69x), N = 128 0.94 / 0.90 / 0.75x. ASTAGES > 0
    # gives each warp's A a ring of its own that deep (0: one A slot per B stage, the measured
    # default); written at the end of session 28, not yet measured. Session 29: MCAST 2/4 makes
    # that many neighbouring 64-row blocks one cluster row that shares each B chunk through the
    # copy engine's multicast (B's L2 traffic was 1.7x A's bytes at N = 64); SPLIT 3 and 6 (uneven
    # split-K shares) fill one wave of 4 CTAs per SM on 11008x4096.
    "grid": [{}, {"PIPE": 3}, {"PIPE": 4}, {"SPLIT": 8}],
    "patterns": ["nm"],
    "cuda_source": "tc_stream.cu",
    # tc_stream.cu uses thread-block clusters, bulk (TMA) copies and mbarrier transaction counts: sm_90 only
    # (nvcc for sm_80 / sm_89 stops at __cluster_dims__), so the planner leaves it out on older GPUs
    "min_compute_capability": [9, 0],
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
