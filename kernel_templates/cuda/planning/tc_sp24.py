"""tc_sp24's planning knowledge: exact 2:4 (every group of 4 consecutive columns keeps at most 2
values, as 2:4, 1:2 and 1:4 pruning guarantee); the sparse tensor cores decode it for free."""
from __future__ import annotations

from sparseditto.kernel_templates.cost import (TC_WG_N_BLOCK, TC_WG_TILE_STEP_S, VALUE_BYTES, CostTerms, tc_bytes,
                                               tc_flops, tc_n_blocks, tc_sp24_uses_wgmma, tc_stream_floor_s)

# Measured on the H200 (benchmarks/llm_layers.py --preset decode, fp16, chained, cold L2, session 25,
# docs/kernels.md): 8.6-9.8 us on 4096x4096 and 17.2-17.8 us on 11008x4096 at N = 1-16 (74-85% of a
# pure read of the same bytes, 1.47-2.28x cuBLAS); at N >= 32 the per-tile work grows with N and the
# kernel turns latency-bound (tc_stream_floor_s, its measured floor), 0.67x cuBLAS at N = 64. The
# expert policy puts tc_sp24 first for n:m patterns; the estimate ranks it behind dense at wide N.
# Session 26 (B ring where the K slice is large, no launch-bounds cap): N = 32 1.11-1.18x on K = 4096
# and 0.94x on K = 11008, N = 64 0.67-0.73x, N = 128 0.38-0.43x. The floor's 0.10 ns per tile x chunk
# x n8 tile now sits inside the measured range (0.088-0.145 ns over the three shapes at N = 64-128:
# 11008x4096 N = 64 35.2 us estimated vs 34.3 chained, 4096x4096 13.1 vs 19.0); left as it is, since
# either end still ranks tc_sp24 behind cuBLAS there (~25 us on 11008x4096).
# Session 27: on compute capability 9.0 (H100/H200) N >= 32 runs the sm_90a wgmma kernel (cost.py's
# TC_WG_* floor): N = 64 1.06-1.11x cuBLAS on 11008x4096 / 4096x11008, 0.79x on 4096x4096; N = 128
# 0.57-0.71x; the estimate (24.5 us on 11008x4096 at N = 64, 22.9 measured) now sits within the expert
# policy's margin of dense there, so tc_sp24 is among the N = 64 candidates on H100/H200 targets.
# Session 28: the copy-engine kernel (tc_sp24tma) measured 1.18x at N = 64 (21.6 us) and 0.94x at
# N = 128 on 11008x4096; TC_WG_TILE_STEP_S follows it (0.061 ns), and tc_sp24 is the first N = 64
# candidate on H100/H200 targets.

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
    a_bytes = tc_bytes("tc_sp24", stats.m, stats.k, stats.nnz, VALUE_BYTES[dtype])
    if params.get("MMA", "auto") != "sync" and tc_sp24_uses_wgmma(n, target):
        return CostTerms(a_bytes=-(-n // TC_WG_N_BLOCK) * a_bytes, flops=tc_flops(stats.m, stats.k, n) / 2.0,
                         unit="sparse_tensor",
                         decode_s=tc_stream_floor_s(stats.m, stats.k, n, target, TC_WG_TILE_STEP_S),
                         notes=["2:4 values + metadata on wgmma.mma_async.sp (sm_90a), N up to 128 per block"])
    return CostTerms(a_bytes=tc_n_blocks(n) * a_bytes,
                     flops=tc_flops(stats.m, stats.k, n) / 2.0,
                     unit="sparse_tensor", decode_s=tc_stream_floor_s(stats.m, stats.k, n, target),
                     notes=["2:4 values + mma.sp metadata, no decode instructions"])
