"""compact_rows_cols's planning knowledge: it needs empty rows or columns to drop."""
from __future__ import annotations

from sparseditto.kernel_templates.cost import (VALUE_BYTES, CostTerms, compact_bytes, mma_unit, next_pow2, param,
                                               round_up)

APPLICABILITY = "needs empty rows or empty columns to drop"
COST_MODEL = ("bytes = kept_rows*kept_cols*vb + (kept_rows + kept_cols)*4 + kept_cols*N*vb + M*N*vb; "
              "flops 2*padded kept GEMM on tensor cores")


def applicable(stats, template) -> tuple[bool, str]:
    if stats.nnz == 0:
        return True, "all rows are empty: C is zero, compaction writes zeros only"
    if stats.empty_rows or stats.empty_cols:
        kept = (stats.m - stats.empty_rows) * (stats.k - stats.empty_cols)
        return True, (f"{stats.empty_rows} empty rows and {stats.empty_cols} empty columns to drop; the kept "
                      f"block is {kept / (stats.m * stats.k):.1%} of A, {stats.nnz / max(1, kept):.1%} full")
    return False, "no empty rows or columns: compaction would be a plain dense GEMM"


def grid(stats, n: int, target, template) -> list[dict]:
    kept_m = max(1, stats.m - stats.empty_rows)
    bm = 64 if kept_m >= 512 else (32 if kept_m >= 64 else 16)
    bn = max(16, min(next_pow2(n), 128))
    return [
        {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3},
        {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 128, "num_warps": 4, "num_stages": 3},
        {"BLOCK_M": min(128, bm * 2), "BLOCK_N": bn, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3},
        {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 64, "num_warps": 4, "num_stages": 4},
        {"BLOCK_M": max(16, bm // 2), "BLOCK_N": bn, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3},
        {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 32, "num_warps": 4, "num_stages": 5},
    ]


def cost(stats, n: int, dtype: str, target, params: dict) -> CostTerms:
    vb = VALUE_BYTES[dtype]
    kept_m, kept_k = stats.m - stats.empty_rows, stats.k - stats.empty_cols
    bm = int(param(params, "BLOCK_M", default=64))
    bk = int(param(params, "BLOCK_K", default=64))
    bn = int(param(params, "BLOCK_N", default=max(16, min(next_pow2(n), 128))))
    return CostTerms(a_bytes=compact_bytes(kept_m, kept_k, vb), b_bytes=float(kept_k * n * vb),
                     flops=2.0 * round_up(kept_m, bm) * round_up(kept_k, bk) * round_up(n, bn),
                     unit=mma_unit(dtype, params), notes=[f"kept {kept_m}x{kept_k} of {stats.m}x{stats.k}"])
