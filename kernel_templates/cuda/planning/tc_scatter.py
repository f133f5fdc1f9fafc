"""tc_scatter's planning knowledge: unstructured weights at decode widths, where its bytes (3 per kept
value) and its work (a few instructions per kept value) both fall with the sparsity.

Not yet measured on a GPU when written (session 31): the decode floor below is a guess from the
instruction count (~6 warp instructions per 32 kept values, plus ~40 per 1024 elements for the
read-back, B fragments and mma), at the issue rate tc_lanemask reached (ncu: ~1.5 warp instructions
per SM cycle). docs/kernels.md "Session 31" has what the H200 then said.
"""
from __future__ import annotations

from sparseditto.kernel_templates.cost import (VALUE_BYTES, CostTerms, h200_scaled, tc_bytes, tc_flops,
                                               tc_n_blocks)

NNZ_S = 0.16e-12            # decode floor per kept value per block of 64 columns (H200 guess, above)
ELEMENT_S = 0.03e-12        # ... and per matrix element (read-back, B fragments, mma, loop)

APPLICABILITY = "any unstructured pattern; fp16/bf16 (3 bytes per kept value: cheaper than a bitmap above ~60% sparsity)"
COST_MODEL = ("bytes = 3*nnz + tiles*chunks*16 + offsets + B + C per block of 64 columns of N; time = max(bytes / "
              "bandwidth, decode floor 0.16 ps per kept value + 0.03 ps per element per block of 64 columns)")


def applicable(stats, template) -> tuple[bool, str]:
    if stats.nnz == 0:
        return False, "no kept values"
    return True, f"density {stats.density:.3f}: 3 bytes per kept value"


def grid(stats, n: int, target, template) -> list[dict]:
    return [{}, {"PIPE": 4}, {"SPLIT": 8}]


def cost(stats, n: int, dtype: str, target, params: dict) -> CostTerms:
    blocks = tc_n_blocks(n)
    floor = blocks * (stats.nnz * NNZ_S + stats.m * stats.k * ELEMENT_S)
    return CostTerms(a_bytes=blocks * tc_bytes("tc_scatter", stats.m, stats.k, stats.nnz, VALUE_BYTES[dtype]),
                     flops=tc_flops(stats.m, stats.k, n), unit="tensor", decode_s=h200_scaled(floor, target),
                     notes=["value + position byte per kept value, scattered into mma fragments"])
