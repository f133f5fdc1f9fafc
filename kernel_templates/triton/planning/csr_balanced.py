"""csr_balanced's planning knowledge: it fits any pattern and wins when row lengths are skewed."""
from __future__ import annotations

from sparseditto.kernel_templates.cost import (VALUE_BYTES, CostTerms, csr_bytes, csr_index_bytes, h200_scaled, next_pow2,
                                               sm_count)

APPLICABILITY = "always; it is the natural choice when row lengths are skewed (row cv > 1)"
COST_MODEL = ("bytes = nnz*(vb + 4 or 2 for int16 ids) + (M+1)*4 + B + C, plus fp32 partials of rows that "
              "cross a program boundary (2 * programs * N * 4); flops 2*nnz*N on CUDA cores; a measured floor of "
              "NNZ_STEP_S per nonzero plus NNZ_COLUMN_S per nonzero and column past N = 8")
# Measured on the H200 (fp16, cold L2, graph-replayed, session 29): 90% per-row-magnitude Llama weights
# at N = 8 took 34.0 / 96.4 / 104.4 us for 1.68 / 4.51 / 4.51 M nonzeros (20-23 ps each, 0.27-0.48x
# cuBLAS) where the byte model said 4.1-6.8 us; 15 ps per nonzero stays below them.
NNZ_STEP_S = 15e-12
# Wide N (H200, fp32, N = 128, graph-replayed, session 30's graphs suite): 0.75-4.5 ns per nonzero on the
# SuiteSparse files and 1.24 ns on R-MAT s16 (1187 us where cuSPARSE took 83 us and the byte model said
# ~20 us, so the planner tried it first there); the floor grows by NNZ_COLUMN_S per column past N = 8,
# 0.71 ns at N = 128, below every one of those rows.
NNZ_COLUMN_S = 5.8e-12


def applicable(stats, template) -> tuple[bool, str]:
    return True, (f"CSR fits any pattern; nnz splitting balances rows (row cv {stats.row_cv:.2f}, "
                  f"longest row {int(stats.row_max)} vs mean {stats.row_mean:.1f})")


def nnz_per_program(nnz: int, params: dict) -> int:
    """NNZ_PER_PROGRAM, "auto" resolved exactly as the template does."""
    chosen = params.get("NNZ_PER_PROGRAM", "auto")
    if chosen != "auto":
        return int(chosen)
    return int(min(4096, max(128, next_pow2(-(-nnz // 2048)))))


def grid(stats, n: int, target, template) -> list[dict]:
    sms = sm_count(target)
    # About four programs per SM per N tile, within the legal range.
    per = next_pow2(max(1, stats.nnz) / (4 * sms))
    per = int(min(4096, max(64, per)))
    auto = nnz_per_program(stats.nnz, {})
    bn = min(next_pow2(n), 128)
    block_nnz = 64 if stats.row_mean >= 32 else 32
    return [
        {"NNZ_PER_PROGRAM": per, "BLOCK_NNZ": block_nnz},
        {"NNZ_PER_PROGRAM": auto, "BLOCK_NNZ": block_nnz},
        {"NNZ_PER_PROGRAM": min(4096, per * 4), "BLOCK_NNZ": block_nnz},
        {"NNZ_PER_PROGRAM": max(64, per // 2), "BLOCK_NNZ": 16},
        {"NNZ_PER_PROGRAM": per, "BLOCK_NNZ": block_nnz, "BLOCK_N": max(1, bn // 2)},
        {"NNZ_PER_PROGRAM": per, "BLOCK_NNZ": block_nnz, "INDEX_BITS": 32},
        {"NNZ_PER_PROGRAM": per, "BLOCK_NNZ": block_nnz, "FIXUP": "launch"},
    ]


def cost(stats, n: int, dtype: str, target, params: dict) -> CostTerms:
    vb = VALUE_BYTES[dtype]
    ib = csr_index_bytes(stats, params)
    terms = CostTerms(a_bytes=csr_bytes(stats.m, stats.nnz, vb, ib), flops=2.0 * stats.nnz * n, unit="cuda_core",
                      notes=[f"CSR with {8 * ib}-bit column ids"])
    per = nnz_per_program(stats.nnz, params)
    programs = max(1, -(-stats.nnz // per))
    if stats.row_max > 1 and programs > 1:  # some row can cross a program boundary
        terms.launches = 2 if params.get("FIXUP", "inline") == "launch" else 1
        terms.extra_bytes += 2.0 * programs * n * 4
    terms.notes.append(f"{programs} programs of {per} nonzeros")
    terms.decode_s = h200_scaled(stats.nnz * (NNZ_STEP_S + NNZ_COLUMN_S * max(0, n - 8)), target)
    return terms
