"""csr_vector's planning knowledge: it fits any pattern; the lane layout follows N and the rows."""
from __future__ import annotations

from sparseditto.kernel_templates.cost import CostTerms, csr_decode_floor_s, next_pow2, row_split_csr_terms

APPLICABILITY = "always: CSR represents any pattern"
COST_MODEL = ("bytes = nnz*(vb + 4) + (M+1)*4 + B + C (int32 column ids); flops 2*nnz*N on CUDA cores; "
              "a long row bounds its warp (critical path)")


def applicable(stats, template) -> tuple[bool, str]:
    return True, f"CSR fits any pattern ({stats.nnz} nonzeros, mean row {stats.row_mean:.1f})"


def grid(stats, n: int, target, template) -> list[dict]:
    group = max(2, min(32, next_pow2(stats.row_mean)))
    out = [{}]
    if n <= 8:
        tile = min(next_pow2(n), 8)
        out += [{"LAYOUT": "nnz", "GROUP": group, "TILE_N": tile},
                {"LAYOUT": "nnz", "GROUP": max(2, group // 2), "TILE_N": tile},
                {"LAYOUT": "nnz", "GROUP": min(32, group * 2), "TILE_N": tile},
                {"LAYOUT": "cols", "VEC": 1}]
    else:
        vec = max(1, min(8, next_pow2(n / 32)))
        out += [{"LAYOUT": "cols", "VEC": vec},
                {"LAYOUT": "cols", "VEC": max(1, vec // 2)},
                {"LAYOUT": "cols", "VEC": vec, "WARPS_PER_BLOCK": 8},
                {"LAYOUT": "nnz", "GROUP": group, "TILE_N": 8}]
    out += [{"WARPS_PER_BLOCK": 2}, {"WARPS_PER_BLOCK": 8}]
    return out


def cost(stats, n: int, dtype: str, target, params: dict) -> CostTerms:
    terms = row_split_csr_terms(stats, n, dtype, params, default_bits=32)   # always int32 column ids
    terms.decode_s = csr_decode_floor_s(stats, n, dtype, target)            # 16-bit decode widths (cost.py)
    return terms
