"""tc_words's planning knowledge: any pattern with zero fragment words, at decode widths; its bytes
are 4 per kept word (two neighbouring values of a row; UNIT 2: 8 per kept pair of words) + a 96 (48)
byte header per block, its work ~8 instructions per unit whatever the sparsity.

Measured on the H200 (session 34, fp16, magnitude-pruned, N = 1 / 8 / 16, chained launches, read-flushed
cold L2; `benchmarks/llm_layers.py --preset decode --variants '{"tc_words": [...]}'`), best of the auto
choices: 4096x4096 14.0-14.8 / 12.3-13.1 / 10.1-11.0 us at 50 / 70 / 90%, 11008x4096 28.8-30.2 /
23.0-24.7 / 17.5-21.0 us (0.85-1.19x cuBLAS at 50-70%, 1.26-1.39x at 90%). At 90% it runs ~0.40 ns per
16x64 block whatever its bytes (ncu at 11008x4096: the blob ring's per-block issue and the split-K
cluster barrier lead the stall samples), which is the decode floor below (a lower bound, as every
template's; the byte roofline is the other). At 50-70% it reads its bytes at 52-71% of a pure read.
Session 35: on 11008x4096 the CTA stream (LOAD "auto" -> "group" from 512 row tiles with one-register
units) runs 50% in 24.9-26.4 us (0.97-1.02x cuBLAS, 70-74% of a pure read) and 70% in 21.6-23.2 us
(1.11-1.17x), fp16 and bf16; the grid tries the other load. Session 38: on 4096x4096 the CTA stream with 4
warps of one tile (now "auto" there: 128-511 row tiles, K <= 64 chunks) runs 50 / 70 / 90% in 12.6-13.4 /
11.4-12.4 / 9.7-10.9 us chained at N = 8 / 16 (1.07-1.16 / 1.14-1.27 / 1.32-1.49x cuBLAS chained).
"""
from __future__ import annotations

from sparseditto.kernel_templates.cost import (CostTerms, h200_scaled, kept_words, round_up, tc_flops, tc_n_blocks,
                                               wide_n_floor, words_auto_params, words_bytes)

BLOCK_S = 0.40e-9   # per 16x64 block and block of 64 columns of N (H200 fit at 90%, above), N <= 16
# Each n8 tile past the second adds its mma and B fragment loads to every block. H200, session 36
# (`sparseditto bench --suite llm`, graph-launched): 11008x4096 50% at N = 64 ran 52.8-53.1 us, 1.20 ns per
# block against 0.61 at N = 16 (27 us, the same bytes): (1.20 - 0.40) / 6 more tiles. 4096x4096 at N = 64
# ran 28.5-38.3 us at 50-90% (1.7-2.3 ns per block, fewer CTAs): the floor stays a lower bound.
NT_STEP_S = 0.133e-9


def block_s(n: int) -> float:
    """The decode floor per 16x64 block at N columns (one launch block: N up to 64)."""
    return wide_n_floor(BLOCK_S, NT_STEP_S, n)


APPLICABILITY = "any pattern with some all-zero pairs of neighbouring values; fp16/bf16"
COST_MODEL = ("bytes = 4*UNIT*kept units + tiles*chunks*(header + 8) + offsets + B + C per block of 64 columns of N "
              "(kept units = Mp*Kp/(2 UNIT)*(1-(1-d)^(2 UNIT)) at random placement); decode floor 0.40 ns per 16x64 block "
              "at N <= 16, + 0.133 ns per further n8 tile (1.20 ns at N = 64)")


def applicable(stats, template) -> tuple[bool, str]:
    if stats.nnz == 0:
        return False, "no kept values"
    words = kept_words(stats.m, stats.k, stats.nnz)
    total = max(1.0, round_up(stats.m, 16) * round_up(stats.k, 64) / 2.0)
    return True, f"~{words / total:.0%} of the fragment words hold a kept value (4 bytes each)"


def grid(stats, n: int, target, template) -> list[dict]:
    """The auto choice, then the other warp count, the other unit size, the deeper ring (or stream),
    the other way of loading the blobs (the CTA stream or the per-warp ring)."""
    auto = words_auto_params({}, stats.m, stats.k, stats.nnz)
    other = "ring" if auto["LOAD"] == "group" else "group"
    return [{}, {"WARPS": 12 - auto["WARPS"]}, {"UNIT": 3 - auto["UNIT"]}, {"PIPE": 3}, {"LOAD": other}]


def cost(stats, n: int, dtype: str, target, params: dict) -> CostTerms:
    unit = int(words_auto_params(params, stats.m, stats.k, stats.nnz)["UNIT"])
    return CostTerms(a_bytes=tc_n_blocks(n) * words_bytes(stats.m, stats.k, stats.nnz, unit),
                     flops=tc_flops(stats.m, stats.k, n), unit="tensor",
                     decode_s=h200_scaled(tc_n_blocks(n) * -(-stats.m // 16) * -(-stats.k // 64) * block_s(n), target),
                     notes=[f"kept fragment units of {unit} register(s), unit-major behind per-unit lane masks and "
                            "bases; popc addressing"])
