"""nm_compressed's planning knowledge: it needs rows that (nearly) conform to an N:M ratio it supports."""
from __future__ import annotations

import math

from sparseditto.kernel_templates.cost import (TENSOR_TILE_N, VALUE_BYTES, CostTerms, csr_bytes, mma_unit, nm_bytes,
                                               nm_ratio, round_up, tc_stream_floor_s)

NM_CONFORMANCE_MIN = 0.9
# The expand (values and 2/4-bit positions back into dense tiles in registers) is instruction-bound
# and redone per block of N: measured on the H200 (session 28, run_graph at N = 64, 11008x4096 2:4)
# 52.2 us where the byte roofline says 14.7, i.e. 0.148 ns per (16-row tile, 64-column chunk, n8
# tile). As a floor (tc_stream_floor_s) it is below the byte time up to N ~ 16 (1.07x cuBLAS measured
# at N = 16) and keeps the planner from trying it first at wide N, where tc_sp24 wins.
NM_EXPAND_STEP_S = 0.14e-9
APPLICABILITY = f"needs row-direction N:M conformance >= {NM_CONFORMANCE_MIN} for a ratio the template supports"
COST_MODEL = ("bytes = M*ceil(K/m)*n*vb + packed 2/4-bit positions + residual CSR + B + C; flops 2*M*K*N16 "
              "(expanded dense dot) on tensor cores")


def ratios(template) -> list[tuple[int, int]]:
    """The N:M ratios the template supports, from its NM parameter's legal values (default 2:4)."""
    for key in ("NM", "nm", "ratio", "RATIO"):
        if key in template.params:
            out = []
            for v in template.params[key]:
                if isinstance(v, str) and ":" in v:
                    a, b = v.split(":")
                    out.append((int(a), int(b)))
            if out:
                return out
    return [(2, 4)]


def applicable(stats, template) -> tuple[bool, str]:
    results = [(stats.nm_conformance(n, m, "row"), f"{n}:{m}") for n, m in ratios(template)]
    conf, ratio = max(results)
    if conf >= NM_CONFORMANCE_MIN:
        return True, f"{ratio} row conformance {conf:.3f} >= {NM_CONFORMANCE_MIN}"
    return False, f"best N:M row conformance is {conf:.3f} ({ratio}) < {NM_CONFORMANCE_MIN}"


def grid(stats, n: int, target, template) -> list[dict]:
    """The best-conforming ratio the template supports, then its expand variants and tiles."""
    scored = [(stats.nm_conformance(a, b, "row"), -b, f"{a}:{b}") for a, b in ratios(template)]
    best = max(scored)[2] if scored else "2:4"
    base = {"NM": best}
    return [base, {**base, "EXPAND": "planes"}, {**base, "EXPAND": "select"}, {**base, "BLOCK_M": 128},
            {**base, "BLOCK_M": 32}, {**base, "BLOCK_G": 64}, {**base, "num_stages": 4}]


def cost(stats, n: int, dtype: str, target, params: dict) -> CostTerms:
    vb = VALUE_BYTES[dtype]
    nk, mg = nm_ratio(params, stats)
    terms = CostTerms(a_bytes=nm_bytes(stats.m, stats.k, nk, mg, vb),
                      flops=2.0 * stats.m * round_up(stats.k, mg) * round_up(n, TENSOR_TILE_N),
                      unit=mma_unit(dtype, params),
                      decode_s=tc_stream_floor_s(stats.m, stats.k, n, target, NM_EXPAND_STEP_S))
    conf = stats.nm_conformance(nk, mg, "row")
    if conf < 1.0:
        residual = (1.0 - conf) * stats.m * math.ceil(stats.k / mg)
        terms.a_bytes += csr_bytes(stats.m, int(round(residual)), vb, 4)
        terms.notes.append(f"{nk}:{mg} row conformance {conf:.3f}: residual CSR of ~{int(round(residual))} entries")
    return terms
