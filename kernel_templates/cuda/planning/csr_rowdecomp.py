"""csr_rowdecomp's planning knowledge: CSR for any pattern, with rows cut into items of at most CHUNK
nonzeros so that no warp waits on a hub row; meant for graphs and meshes at N >= 8."""
from __future__ import annotations

from sparseditto.kernel_templates.cost import VALUE_BYTES, CostTerms, csr_decode_floor_s, next_pow2, row_split_csr_terms

APPLICABILITY = "always: CSR represents any pattern; built for skewed (power-law) and mesh rows at N >= 8"
COST_MODEL = ("bytes = nnz*(vb + 4) + items*16 + B + C, plus fp32 partial rows of split rows written and read "
              "(<= 2 * nnz/CHUNK * N * 4) and a second launch when a row is longer than CHUNK; flops 2*nnz*N on "
              "CUDA cores; critical path: one item (<= CHUNK nonzeros) instead of the longest row")
ITEM_BYTES = 16


def applicable(stats, template) -> tuple[bool, str]:
    return True, (f"CSR fits any pattern; items of <= {chunk_for(stats, {})} nonzeros cut the longest row "
                  f"({int(stats.row_max)} nonzeros, mean {stats.row_mean:.1f})")


def chunk_for(stats, params: dict) -> int:
    """CHUNK, "auto" resolved as prepare does (sparseditto.row_items.auto_chunk, restated here because a
    planning module imports the cost arithmetic only; tests/test_csr_rowdecomp.py checks they agree)."""
    chunk = params.get("CHUNK", "auto")
    return min(512, max(32, next_pow2(4.0 * stats.row_mean))) if chunk == "auto" else int(chunk)


# H200, fp32, graph-replayed (benchmarks/graph_kernels.py, session 30): UNROLL 8 was 8-18% faster than
# 4 on the SuiteSparse files (< 5000 rows: fewer groups, so more loads in flight per lane pay) and 5-8%
# slower on the 32768-65536-row graphs and meshes; at N <= 32 rows of ~45 nonzeros ran 1.5-1.8x faster
# cut into items of 16 (pushpull 20.0 -> 11.2 us, bcsstk13 15.6 -> 10.3 us: 4 items share a warp there,
# so long items serialize it); at N >= 128 R-MAT's hub rows ran best in items of 128 (75.6 -> 66.9 us).
FEW_ROWS = 16384


def grid(stats, n: int, target, template) -> list[dict]:
    chunk = chunk_for(stats, {})
    out = [{}]
    if stats.m < FEW_ROWS:
        out.append({"UNROLL": 8})
    if n <= 32 and stats.row_mean >= 24:
        out.append({"CHUNK": 16, "UNROLL": 8})
    if n >= 128 and stats.row_max > chunk:
        out.append({"CHUNK": min(1024, 2 * chunk)})
    other_order = "row" if stats.row_cv > 1.0 else "length"
    for extra in ({"UNROLL": 8}, {"ORDER": other_order}, {"CHUNK": max(16, chunk // 2)}, {"WARPS_PER_BLOCK": 8},
                  {"WARPS_PER_BLOCK": 2}):
        if extra not in out:
            out.append(extra)
    if stats.m >= FEW_ROWS:
        # the pipelined walk (session 41, not yet measured: last until the H200 says where it wins) for
        # matrices whose one-item groups take several waves
        out.append({"ITEMS": 8})
    return out


def cost(stats, n: int, dtype: str, target, params: dict) -> CostTerms:
    vb = VALUE_BYTES[dtype]
    chunk = chunk_for(stats, params)
    terms = row_split_csr_terms(stats, n, dtype, params, default_bits=32)
    terms.decode_s = csr_decode_floor_s(stats, n, dtype, target)            # 16-bit decode widths (cost.py)
    items = stats.m + stats.nnz / chunk
    terms.a_bytes += items * ITEM_BYTES - (stats.m + 1) * 4          # items replace the row pointer
    terms.notes.append(f"work items of <= {chunk} nonzeros")
    if stats.row_max > chunk:
        slots = stats.nnz / chunk                                     # an upper bound: every nonzero in split rows
        terms.extra_bytes += 2.0 * slots * n * 4
        terms.launches = 2
        terms.critical_bytes = chunk * (vb + 4 + n * vb)
        terms.critical_what = f"one item ({chunk} nonzeros of a longer row)"
    return terms
