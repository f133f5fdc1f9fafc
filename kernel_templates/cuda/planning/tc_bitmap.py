"""tc_bitmap's planning knowledge: any unstructured pattern with enough density for a bitmap to
beat per-value indices; its time is set by the register decode, not by its bytes (H200 fit)."""
from __future__ import annotations

from sparseditto.kernel_templates.cost import (BITMAP_MIN_DENSITY, VALUE_BYTES, CostTerms, bitmap_applicable, h200_scaled,
                                               tc_bytes, tc_flops, tc_n_blocks)

# Measured calibration: a fit to the H200 sweep of benchmarks/llm_layers.py (--preset core, fp16,
# N <= 16, CUDA-graph launch, cold L2, 2026-12-01) on 4096x4096 and 11008x4096; other GPUs get it
# scaled by their bandwidth (an assumption until measured there).
# The kernel is decode-bound, not byte-bound: ~0.37 ns per matrix element + 0.6 ns per kept value
# at N <= 8 (popc / table / PRMT decode and its shared-memory gathers), +0.35 ns per element per
# extra n8 tile of N, plus ~9 us fixed (not added: estimates stay lower bounds). It beats cuBLAS only
# near 90% sparsity at N = 1.
ELEMENT_S = 0.37e-12
VALUE_S = 0.6e-12
TILE_S = 0.35e-12


def decode_s(m: int, k: int, nnz: int, n: int, target) -> float:
    """The decode floor at N = n, scaled to `target`'s bandwidth."""
    n8 = min(8, -(-n // 8))
    blocks = tc_n_blocks(n)
    per_block = m * k * (ELEMENT_S + TILE_S * (n8 - 1)) + nnz * VALUE_S
    return h200_scaled(blocks * per_block, target)

APPLICABILITY = (f"density >= {BITMAP_MIN_DENSITY} (one bit per element must cost less than the values it "
                 "indexes); fp16/bf16")
COST_MODEL = ("bytes = nnz*vb + tiles*chunks*184 + offsets + B + C; time = max(bytes / bandwidth, decode floor "
              "0.37 ns/element + 0.6 ns/value (+0.35 ns/element per extra n8 tile)) (H200 fit)")


def applicable(stats, template) -> tuple[bool, str]:
    return bitmap_applicable(stats, "1.375 bits per element of bitmap and headers")


def grid(stats, n: int, target, template) -> list[dict]:
    return [{}, {"SPLIT": 8}, {"WARPS": 8}, {"RING_KB": 16}]


def cost(stats, n: int, dtype: str, target, params: dict) -> CostTerms:
    return CostTerms(a_bytes=tc_bytes("tc_bitmap", stats.m, stats.k, stats.nnz, VALUE_BYTES[dtype]),
                     flops=tc_flops(stats.m, stats.k, n), unit="tensor",
                     decode_s=decode_s(stats.m, stats.k, stats.nnz, n, target),
                     notes=["bitmap + values in mma fragment order, decoded in registers"])
