"""tc_dense's planning knowledge: any pattern fits (it streams the padded dense weight); it pays off
only at skinny N (decode), where cuBLAS reads a weight of this size at ~43-63% of the bandwidth."""
from __future__ import annotations

from sparseditto.kernel_templates.cost import VALUE_BYTES, CostTerms, tc_bytes, tc_flops, tc_n_blocks, tc_stream_floor_s

# Measured on the H200 (benchmarks/llm_layers.py --preset core, fp16, N <= 16, CUDA-graph launch,
# cold L2, 2026-12-01) on 4096x4096 and 11008x4096:
# 17.2 us / 34.6 us for 33.5 / 90.2 MB (1.12x / 1.0x cuBLAS): a stream at 3.2 TB/s (77% of the
# 4.13 TB/s read bandwidth) plus ~6.7 us of fixed cost (launch, B staging, ramp-up, cluster
# reduction). The estimate below stays the byte roofline, like every template's, so the planner
# compares like with like; the measured time decides.

APPLICABILITY = "always (dense stream of the padded weight); fp16/bf16 only"
COST_MODEL = ("bytes = Mp*Kp*vb + B + C; "
              "flops 2*Mp*Kp*N8 on tensor cores")


def applicable(stats, template) -> tuple[bool, str]:
    return True, (f"a dense {stats.m}x{stats.k} stream fits any pattern; it beats cuBLAS only at small N "
                  "by reading the weight closer to the copy bandwidth")


def grid(stats, n: int, target, template) -> list[dict]:
    return [{}, {"PIPE": 3}, {"R": 2}, {"SPLIT": 8}]


def cost(stats, n: int, dtype: str, target, params: dict) -> CostTerms:
    return CostTerms(a_bytes=tc_n_blocks(n) * tc_bytes("tc_dense", stats.m, stats.k, stats.nnz, VALUE_BYTES[dtype]),
                     flops=tc_flops(stats.m, stats.k, n), unit="tensor",
                     decode_s=tc_stream_floor_s(stats.m, stats.k, n, target),
                     notes=["dense weight in fragment order, padded to 16-row tiles and 64-column chunks"])
