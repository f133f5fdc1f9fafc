"""bitmap_tiles's planning knowledge: it needs enough density that values outweigh one bit per element."""
from __future__ import annotations

from sparseditto.kernel_templates.cost import (BITMAP_MIN_DENSITY, TENSOR_TILE_N, VALUE_BYTES, CostTerms,
                                               bitmap_applicable, bitmap_bytes, mma_unit, param, round_up)

APPLICABILITY = f"density >= {BITMAP_MIN_DENSITY} (below, one bit per element costs more than the values)"
COST_MODEL = ("bytes = nnz*vb + M*ceil(K/tile_k)*(tile_k/8 + 4) + (M+1)*4 + B + C; flops 2*M*K*N16 on "
              "tensor cores")


def applicable(stats, template) -> tuple[bool, str]:
    return bitmap_applicable(stats, "a bitmap costs 1/8 byte per element")


def grid(stats, n: int, target, template) -> list[dict]:
    return [{}, {"KW": 4}, {"KW": 1}, {"OFFSETS": "stored"}, {"BLOCK_M": 128}, {"BLOCK_M": 32},
            {"num_stages": 4}]


def cost(stats, n: int, dtype: str, target, params: dict) -> CostTerms:
    vb = VALUE_BYTES[dtype]
    tile_k = int(param(params, "TILE_K", "tile_k", default=32))
    offsets = params.get("OFFSETS", "stored") != "running"
    return CostTerms(a_bytes=bitmap_bytes(stats.m, stats.k, stats.nnz, vb, tile_k, tile_offsets=offsets),
                     flops=2.0 * stats.m * round_up(stats.k, tile_k) * round_up(n, TENSOR_TILE_N),
                     unit=mma_unit(dtype, params),
                     notes=[f"{tile_k}-bit masks" + (" + int32 tile offsets" if offsets else " (running offsets)")])
