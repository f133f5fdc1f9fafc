"""tc_words's planning knowledge: any pattern with zero fragment words, at decode widths; its bytes
are 4 per kept word (two neighbouring values of a row; UNIT 2: 8 per kept pair of words) + a 96 (48)
byte header per block, its work ~8 instructions per unit whatever the sparsity.

Not yet measured on a GPU in this form (the blob ring): the decode floor below is tc_dense's measured
stream floor (the same registers and mma per block) and the estimate is otherwise the byte roofline,
as for every template; the measured time decides.
"""
from __future__ import annotations

from sparseditto.kernel_templates.cost import (CostTerms, kept_words, tc_flops, tc_n_blocks, tc_stream_floor_s,
                                               words_bytes)

APPLICABILITY = "any pattern with some all-zero pairs of neighbouring values; fp16/bf16"
COST_MODEL = ("bytes = 4*UNIT*kept units + tiles*chunks*(header + 8) + offsets + B + C per block of 64 columns of N "
              "(kept units = Mp*Kp/(2 UNIT)*(1-(1-d)^(2 UNIT)) at random placement); floor = tc_dense's stream floor")


def applicable(stats, template) -> tuple[bool, str]:
    if stats.nnz == 0:
        return False, "no kept values"
    words = kept_words(stats.m, stats.k, stats.nnz)
    total = max(1.0, -(-stats.m // 16) * 16 * -(-stats.k // 64) * 64 / 2.0)
    return True, f"~{words / total:.0%} of the fragment words hold a kept value (4 bytes each)"


def grid(stats, n: int, target, template) -> list[dict]:
    return [{}, {"WARPS": 8}, {"PIPE": 4}]


def cost(stats, n: int, dtype: str, target, params: dict) -> CostTerms:
    unit = int(params.get("UNIT", 1))
    return CostTerms(a_bytes=tc_n_blocks(n) * words_bytes(stats.m, stats.k, stats.nnz, unit),
                     flops=tc_flops(stats.m, stats.k, n), unit="tensor",
                     decode_s=tc_stream_floor_s(stats.m, stats.k, n, target),
                     notes=["kept fragment words, register-major, behind 16 lane masks per block; popc addressing"])
