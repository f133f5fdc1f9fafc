"""tc_lanemask's planning knowledge: unstructured patterns dense enough for a bitmap (one bit per
element) to beat per-value indices, at decode widths where the tensor cores make N free.

Its time is set by the decode, not by its bytes. Measured on the H200 (2026-12-03, fp16, N = 8 and
16, CUDA-graph launch, read-flushed cold L2; `benchmarks/llm_layers.py --preset decode`): 4096x4096
and 11008x4096 at 50% take 20.5-22.4 and 35.2-36.8 us (PIPE 3), at 70% 19.4-21.0 and 33.0-34.2 us,
so ~0.5 ps per matrix element plus ~12 us fixed (the launch, the first blobs' latency, B's
staging, the cluster reduction; not added: estimates stay lower bounds): 0.7-0.88x cuBLAS. ncu
(11008x4096 50%, N = 16): 13.1 M warp instructions (~300 per 16x64 blob), issue active 43%, 13.3
warps per SM (shared memory allows 2 CTAs), stalls mostly short scoreboard (shared-memory gathers:
one 16-bit load per element and lane), DRAM 28%. The planner therefore ranks it behind dense
cuBLAS on these shapes; it is the fastest bitmap kernel at N = 16 (tc_bitmap: 57 us on 11008x4096).
"""
from __future__ import annotations

from sparseditto.kernel_templates.cost import (BITMAP_MIN_DENSITY, VALUE_BYTES, CostTerms, bitmap_applicable, h200_scaled,
                                               tc_bytes, tc_flops, tc_n_blocks, wide_n_floor)

ELEMENT_S = 0.5e-12          # decode floor per matrix element (H200 fit, below), N <= 16
# Each n8 tile past the second adds its mma and B fragment loads: H200, session 36 (`sparseditto bench --suite
# llm`, graph-launched), 11008x4096 50% at N = 64 in 85.5 us (1.90 ps per element), 4096x4096 50% / 4:8 in
# 45.2 / 45.3 us (2.7 ps): (1.90 - 0.5) / 6 more tiles, the lower of the two shapes (a floor).
NT_STEP_ELEMENT_S = 0.233e-12


def element_s(n: int) -> float:
    """The decode floor per matrix element at N columns (one launch block: N up to 64)."""
    return wide_n_floor(ELEMENT_S, NT_STEP_ELEMENT_S, n)


APPLICABILITY = (f"density >= {BITMAP_MIN_DENSITY} (one bit per element must cost less than the values it "
                 "indexes); fp16/bf16")
COST_MODEL = ("bytes = nnz*vb + tiles*chunks*136 + offsets + B + C per block of 64 columns of N; time = max(bytes / "
              "bandwidth, decode floor 0.5 ps per element per block of 64 columns at N <= 16, + 0.233 ps per further n8 tile) "
              "(H200 fit)")


def applicable(stats, template) -> tuple[bool, str]:
    return bitmap_applicable(stats, "1 bit per element of lane masks")


def grid(stats, n: int, target, template) -> list[dict]:
    return [{}, {"PIPE": 4}, {"SPLIT": 8}]


def cost(stats, n: int, dtype: str, target, params: dict) -> CostTerms:
    blocks = tc_n_blocks(n)
    return CostTerms(a_bytes=blocks * tc_bytes("tc_lanemask", stats.m, stats.k, stats.nnz, VALUE_BYTES[dtype]),
                     flops=tc_flops(stats.m, stats.k, n), unit="tensor",
                     decode_s=h200_scaled(blocks * stats.m * stats.k * element_s(n), target),
                     notes=["lane mask words + values in mma fragment order, decoded in registers"])
