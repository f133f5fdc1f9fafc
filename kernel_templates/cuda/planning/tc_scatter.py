"""tc_scatter's planning knowledge: unstructured weights at decode widths, where its bytes (3 per kept
value) and its work (a few instructions per kept value) both fall with the sparsity.

Measured on the H200 (session 32, 2026-12-04, fp16, magnitude-pruned 4096x4096 and 11008x4096 at
50/70/90%, N = 8 and 16, CUDA-graph launch, read-flushed cold L2, WARPS=4 SPLIT=8 PIPE=3;
`benchmarks/llm_layers.py --preset decode`): 24.3-25.9 / 19.5-19.7 / 14.8-15.7 us on 4096x4096 and
45.1-48.2 / 34.9-38.3 / 25.2-28.7 us on 11008x4096, fitted (12 rows, within 9%) by 1.14 ps per
kept value + 0.25 ps per matrix element + ~10 us fixed (the launch, the first blobs' latency, B's
staging, the cluster reduction; the fixed part is not added: estimates stay lower bounds, as in
tc_lanemask's). Against cuBLAS in the same run (chained): 0.57-0.70x at 50%, 0.74-0.89x at 70%,
1.01-1.27x at 90%. Its decode issues ~320-450 warp instructions per 16x64 blob at 70% (ncu,
11008x4096, N = 16), as many as tc_lanemask's bitmap decode, at 16 warps per SM (shared memory:
the blob ring, the fragment regions and B's slice): the per-value scatter did not make the work
fall with the sparsity as hoped, so it ranks behind tc_lanemask below ~80% sparsity and ahead of
it at 90% (where it measured 3-8% faster).
"""
from __future__ import annotations

from sparseditto.kernel_templates.cost import (VALUE_BYTES, CostTerms, h200_scaled, tc_bytes, tc_flops,
                                               tc_n_blocks)

NNZ_S = 1.14e-12            # decode floor per kept value per block of 64 columns (H200 fit, above)
ELEMENT_S = 0.25e-12        # ... and per matrix element (read-back, B fragments, mma, loop)

APPLICABILITY = "any unstructured pattern; fp16/bf16 (3 bytes per kept value: cheaper than a bitmap above ~60% sparsity)"
COST_MODEL = ("bytes = 3*nnz + tiles*chunks*16 + offsets + B + C per block of 64 columns of N; time = max(bytes / "
              "bandwidth, decode floor 1.14 ps per kept value + 0.25 ps per element per block of 64 columns)")


def applicable(stats, template) -> tuple[bool, str]:
    if stats.nnz == 0:
        return False, "no kept values"
    return True, f"density {stats.density:.3f}: 3 bytes per kept value"


def grid(stats, n: int, target, template) -> list[dict]:
    return [{}, {"WARPS": 8}]


def cost(stats, n: int, dtype: str, target, params: dict) -> CostTerms:
    blocks = tc_n_blocks(n)
    floor = blocks * (stats.nnz * NNZ_S + stats.m * stats.k * ELEMENT_S)
    return CostTerms(a_bytes=blocks * tc_bytes("tc_scatter", stats.m, stats.k, stats.nnz, VALUE_BYTES[dtype]),
                     flops=tc_flops(stats.m, stats.k, n), unit="tensor", decode_s=h200_scaled(floor, target),
                     notes=["value + position byte per kept value, scattered into mma fragments"])
