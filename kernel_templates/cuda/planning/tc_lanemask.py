"""tc_lanemask's planning knowledge: unstructured patterns dense enough for a bitmap (one bit per
element) to beat per-value indices, at decode widths where the tensor cores make N free.

Its decode floor is an estimate until measured: the compiled loop (nvcc 13.0, sm_90, NT = 2) issues
~200 warp instructions per 16x64 blob, about 0.2 per element, which at half of the H200's issue
rate (132 SMs x 4 per cycle x 1.98 GHz) is ~0.4 ps per element.
"""
from __future__ import annotations

from sparseditto.kernel_templates.cost import (BITMAP_MIN_DENSITY, VALUE_BYTES, CostTerms, bitmap_applicable, h200_scaled,
                                               round_up, tc_bytes)

ELEMENT_S = 0.4e-12          # decode floor per matrix element (estimate from the SASS count, above)

APPLICABILITY = (f"density >= {BITMAP_MIN_DENSITY} (one bit per element must cost less than the values it "
                 "indexes); fp16/bf16")
COST_MODEL = ("bytes = nnz*vb + tiles*chunks*136 + offsets + B + C per block of 64 columns of N; time = max(bytes / "
              "bandwidth, decode floor 0.4 ps per element per block of 64 columns) (estimate)")


def applicable(stats, template) -> tuple[bool, str]:
    return bitmap_applicable(stats, "1 bit per element of lane masks")


def grid(stats, n: int, target, template) -> list[dict]:
    return [{}, {"WARPS": 4}, {"PIPE": 6}, {"SPLIT": 8}]


def cost(stats, n: int, dtype: str, target, params: dict) -> CostTerms:
    blocks = -(-max(1, n) // 64)
    return CostTerms(a_bytes=blocks * tc_bytes("tc_lanemask", stats.m, stats.k, stats.nnz, VALUE_BYTES[dtype]),
                     flops=2.0 * round_up(stats.m, 16) * round_up(stats.k, 64) * round_up(n, 8), unit="tensor",
                     decode_s=h200_scaled(blocks * stats.m * stats.k * ELEMENT_S, target),
                     notes=["lane mask words + values in mma fragment order, decoded in registers"])
