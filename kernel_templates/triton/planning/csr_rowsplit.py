"""csr_rowsplit's planning knowledge: it fits any pattern; group short rows, reorder skewed ones."""
from __future__ import annotations

from sparseditto.kernel_templates.cost import CostTerms, h200_scaled, next_pow2, row_split_csr_terms

APPLICABILITY = "always: CSR represents any pattern"
COST_MODEL = ("bytes = nnz*(vb + 4 or 2 for int16 ids) + (M+1)*4 (+ M*4 row order when reordered) + B + C; "
              "flops 2*nnz*N on CUDA cores; a long row bounds its program (critical path); "
              "a measured floor of NNZ_STEP_S per nonzero")
# Its dependent per-chunk loads hold it well below the byte roofline on the H200 (fp16, cold L2,
# graph-replayed): 90% per-row-magnitude Llama weights at N = 8 (session 29) 19.0 / 38.5 / 37.7 us
# for 1.68 / 4.51 / 4.51 M nonzeros (11.3 / 8.5 / 8.4 ps each, 0.73-0.85x cuBLAS) where the byte
# model said 4.1-6.8 us, so the planner ranked it ahead of csr_vector and delta_spmv (1.3-1.7x);
# 4096x4096 90% at N = 1 / 16 (2026-11-29) 10.4 / 17.3 us (6.2 / 10.3 ps). 6 ps per nonzero stays
# below every one of those.
NNZ_STEP_S = 6e-12


def applicable(stats, template) -> tuple[bool, str]:
    return True, f"CSR fits any pattern ({stats.nnz} nonzeros, mean row {stats.row_mean:.1f})"


def rows_per_program(mean_row: float) -> int:
    """Enough nonzeros per program to amortize it: short rows are grouped."""
    if mean_row < 8:
        return 8
    if mean_row < 24:
        return 4
    if mean_row < 64:
        return 2
    return 1


def grid(stats, n: int, target, template) -> list[dict]:
    rows = rows_per_program(stats.row_mean)
    reorder = "length" if stats.row_cv > 0.5 else "none"
    bn = min(next_pow2(n), 128)
    base = {"ROWS_PER_PROGRAM": rows, "REORDER": reorder}
    return [
        base,
        {**base, "BLOCK_N": max(1, bn // 2)},
        {**base, "ROWS_PER_PROGRAM": max(1, rows // 2)},
        {**base, "ROWS_PER_PROGRAM": min(16, rows * 2)},
        {**base, "REORDER": "none" if reorder == "length" else "length"},
        {**base, "BLOCK_NNZ": 64 if stats.row_mean >= 32 else 16},
        {**base, "INDEX_BITS": 32},
        {**base, "num_stages": 3},
        {**base, "BLOCK_N": min(256, bn * 2)},
    ]


def cost(stats, n: int, dtype: str, target, params: dict) -> CostTerms:
    terms = row_split_csr_terms(stats, n, dtype, params, rows_per_program=int(params.get("ROWS_PER_PROGRAM", 1) or 1))
    if params.get("REORDER", "none") != "none":
        terms.extra_bytes += stats.m * 4.0   # the row order
    terms.decode_s = h200_scaled(stats.nnz * NNZ_STEP_S, target)
    return terms
