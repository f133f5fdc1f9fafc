"""bitmap_tiles's planning knowledge: it needs enough density that values outweigh one bit per element."""
from __future__ import annotations

from sparseditto.kernel_templates.cost import (BITMAP_MIN_DENSITY, TENSOR_TILE_N, VALUE_BYTES, CostTerms,
                                               bitmap_applicable, bitmap_bytes, h200_scaled, mma_unit, param,
                                               round_up)

APPLICABILITY = f"density >= {BITMAP_MIN_DENSITY} (below, one bit per element costs more than the values)"
COST_MODEL = ("bytes = nnz*vb + M*ceil(K/tile_k)*(tile_k/8 + 4) + (M+1)*4 + B + C; flops 2*M*K*N16 on "
              "tensor cores; a measured decode floor of 2.2 ps per element of M x K (H200 fit at N = 1-16)")
# Measured on the H200 (fp16, CUDA-graph launch, read-flushed cold L2; run_graph's benchmarks of
# session 21): N = 1 11008x4096 50% 101.4 us, 4096x4096 70% 38.4 us, 4096x4096 4:8 38.3 us, i.e.
# 2.25-2.29 ps per element whatever the sparsity (the expand of every element, not the bytes, sets
# it); at N = 16, 37-43 us on 4096x4096 50-90% (session 14): 2.2-2.6. Without it the byte roofline
# ranked it second at decode N (14 us estimated for the 101 us measured). Wider N decodes every
# tile once per block of N columns, so the floor stays a lower bound there (not measured). Other
# GPUs: scaled by their bandwidth (an assumption, as for delta_spmv).
ELEMENT_S = 2.2e-12


def applicable(stats, template) -> tuple[bool, str]:
    return bitmap_applicable(stats, "a bitmap costs 1/8 byte per element")


def grid(stats, n: int, target, template) -> list[dict]:
    return [{}, {"KW": 4}, {"KW": 1}, {"OFFSETS": "stored"}, {"BLOCK_M": 128}, {"BLOCK_M": 32},
            {"num_stages": 4}]


def cost(stats, n: int, dtype: str, target, params: dict) -> CostTerms:
    vb = VALUE_BYTES[dtype]
    tile_k = int(param(params, "TILE_K", "tile_k", default=32))
    offsets = params.get("OFFSETS", "stored") != "running"
    floor = h200_scaled(ELEMENT_S * stats.m * stats.k, target)
    return CostTerms(a_bytes=bitmap_bytes(stats.m, stats.k, stats.nnz, vb, tile_k, tile_offsets=offsets),
                     flops=2.0 * stats.m * round_up(stats.k, tile_k) * round_up(n, TENSOR_TILE_N),
                     unit=mma_unit(dtype, params),
                     notes=[f"{tile_k}-bit masks" + (" + int32 tile offsets" if offsets else " (running offsets)")],
                     decode_s=floor)
