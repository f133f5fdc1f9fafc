"""tc_scatter's planning knowledge: unstructured weights at decode widths, where its bytes (3 per kept
value, plus each step's padding to a whole group of 8) and its work (a few instructions per kept
value) both fall with the sparsity.

Measured on the H200 (session 32, 2026-12-04, fp16, magnitude-pruned 4096x4096 and 11008x4096 at
50/70/90%, N = 8 and 16, CUDA-graph launch, read-flushed cold L2, defaults (WARPS 4, auto split,
PIPE 3), grouped layout: a lane loads 8 values and 8 position bytes at once;
`benchmarks/llm_layers.py --preset decode`): 20.5-23.1 / 17.9-18.2 / 15.9-16.2 us on 4096x4096 and
40.5-42.6 / 32.6-35.5 / 28.7-30.2 us on 11008x4096, fitted (12 rows, within 9%) by 0.69 ps per kept
value + 0.37 ps per matrix element + ~9 us fixed (the launch, the first blobs' latency, B's staging,
the cluster reduction; the fixed part is not added: estimates stay lower bounds, as in
tc_lanemask's). Against cuBLAS in the same run (chained): 0.64-0.81x at 50%, 0.78-0.98x at 70%,
0.96-1.15x at 90%. The first layout (one value per lane per round) issued 317 warp instructions per
16x64 blob at 70% (ncu, 11008x4096, N = 16), as many as tc_lanemask's bitmap decode, at 16 warps
per SM (shared memory); the grouped one ran 6-15% faster at 50-70% and up to 8% slower at 90% (its
padding). docs/kernels.md "Sessions 31-32" has the tables.

SCHED="stream" (session 33, a stream-K grid of one wave, partial tiles summed in global memory by
the last CTA of a row-tile group) is correct and 2-8% faster only on 11008x4096 at N = 8 (50-70%),
up to 1.6x slower on 4096x4096 and 1.9x at N = 16 (docs/kernels.md "Session 33"), so the grid below does
not try it and the cost model (fitted on the cluster schedule) does not describe it. LOAD="reg"
(tc_scatter_rg, blobs straight into registers; session 34) is correct and within a few % of the ring at
N = 8, up to 1.6x slower at N = 16 (docs/kernels.md "Session 34"): the grid leaves it out.
"""
from __future__ import annotations

from sparseditto.kernel_templates.cost import (VALUE_BYTES, CostTerms, h200_scaled, tc_bytes, tc_flops,
                                               tc_n_blocks)

NNZ_S = 0.69e-12            # decode floor per kept value per block of 64 columns (H200 fit, above)
ELEMENT_S = 0.37e-12        # ... and per matrix element (read-back, B fragments, mma, loop)

APPLICABILITY = "any unstructured pattern; fp16/bf16 (~3.1-3.6 bytes per kept value: cheaper than a bitmap above ~60% sparsity)"
COST_MODEL = ("bytes = 3*(nnz + step padding) + tiles*chunks*20 + offsets + B + C per block of 64 columns of N; time = max(bytes / "
              "bandwidth, decode floor 0.69 ps per kept value + 0.37 ps per element per block of 64 columns)")


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
