"""tc_sp24's planning knowledge: exact 2:4 (every group of 4 consecutive columns keeps at most 2
values, as 2:4, 1:2 and 1:4 pruning guarantee); the sparse tensor cores decode it for free."""
from __future__ import annotations

from sparseditto.kernel_templates.cost import VALUE_BYTES, CostTerms, round_up, tc_bytes

# Measured on the H200 (benchmarks/llm_layers.py --preset core, fp16, N <= 16, CUDA-graph launch,
# cold L2, 2026-12-01) on 4096x4096 and 11008x4096:
# 13.3 us / 22.1 us for 18.9 / 50.7 MB (1.45x / 1.56x cuBLAS): 3.6 TB/s (87% of the read
# bandwidth) plus ~8.1 us fixed. The estimate below stays the byte roofline; the expert policy puts
# tc_sp24 first for n:m patterns because it measured fastest there.

APPLICABILITY = "every group of 4 consecutive columns of every row keeps at most 2 values (exact 2:4); fp16/bf16"
COST_MODEL = ("bytes = Mp*Kp/2*vb + tiles*chunks*128 + B + C; "
              "flops 2*Mp*Kp*N8/2 on the sparse tensor cores")


def applicable(stats, template) -> tuple[bool, str]:
    conf = max(stats.nm_conformance(2, 4, "row"), stats.nm_conformance(1, 2, "row"), stats.nm_conformance(1, 4, "row"))
    if conf >= 1.0:
        return True, "every row group of 4 columns keeps at most 2 values: exact for mma.sp"
    return False, f"2:4 row conformance {conf:.3f} < 1 (mma.sp needs every group of 4 to keep at most 2 values)"


def grid(stats, n: int, target, template) -> list[dict]:
    return [{}, {"PIPE": 3}, {"SPLIT": 8}, {"WARPS": 4}]


def cost(stats, n: int, dtype: str, target, params: dict) -> CostTerms:
    return CostTerms(a_bytes=tc_bytes("tc_sp24", stats.m, stats.k, stats.nnz, VALUE_BYTES[dtype]),
                     flops=2.0 * round_up(stats.m, 16) * round_up(stats.k, 64) * round_up(n, 8) / 2.0,
                     unit="sparse_tensor", notes=["2:4 values + mma.sp metadata, no decode instructions"])
