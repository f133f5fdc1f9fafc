"""tc_words's planning knowledge: any pattern with zero fragment words, at decode widths; its bytes
are 4 per kept word (two neighbouring values of a row) + 64 per block, its work ~9 instructions per
fragment register whatever the sparsity.

Not yet measured on a GPU in this form (the blob ring): the decode floor below is tc_dense's measured
stream floor (the same registers and mma per block) and the estimate is otherwise the byte roofline,
as for every template; the measured time decides.
"""
from __future__ import annotations

from sparseditto.kernel_templates.cost import (VALUE_BYTES, CostTerms, kept_words, tc_bytes, tc_flops,
                                               tc_n_blocks, tc_stream_floor_s)

APPLICABILITY = "any pattern with some all-zero pairs of neighbouring values; fp16/bf16"
COST_MODEL = ("bytes = 4*kept words + tiles*chunks*72 + offsets + B + C per block of 64 columns of N "
              "(kept words = Mp*Kp/2*(1-(1-d)^2) at random placement); floor = tc_dense's stream floor")


def applicable(stats, template) -> tuple[bool, str]:
    if stats.nnz == 0:
        return False, "no kept values"
    words = kept_words(stats.m, stats.k, stats.nnz)
    total = max(1.0, -(-stats.m // 16) * 16 * -(-stats.k // 64) * 64 / 2.0)
    return True, f"~{words / total:.0%} of the fragment words hold a kept value (4 bytes each)"


def grid(stats, n: int, target, template) -> list[dict]:
    return [{}, {"WARPS": 8}, {"PIPE": 4}]


def cost(stats, n: int, dtype: str, target, params: dict) -> CostTerms:
    return CostTerms(a_bytes=tc_n_blocks(n) * tc_bytes("tc_words", stats.m, stats.k, stats.nnz, VALUE_BYTES[dtype]),
                     flops=tc_flops(stats.m, stats.k, n), unit="tensor",
                     decode_s=tc_stream_floor_s(stats.m, stats.k, n, target),
                     notes=["kept fragment words, register-major, behind 16 lane masks per block; popc addressing"])
