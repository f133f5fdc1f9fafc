"""csr_rowdecomp's planning knowledge: CSR for any pattern, with rows cut into items of at most CHUNK
nonzeros so that no warp waits on a hub row; meant for graphs and meshes at N >= 8."""
from __future__ import annotations

from sparseditto.kernel_templates.cost import VALUE_BYTES, CostTerms, next_pow2, row_split_csr_terms
from sparseditto.row_items import auto_chunk

APPLICABILITY = "always: CSR represents any pattern; built for skewed (power-law) and mesh rows at N >= 8"
COST_MODEL = ("bytes = nnz*(vb + 4) + items*16 + B + C, plus fp32 partial rows of split rows written and read "
              "(<= 2 * nnz/CHUNK * N * 4) and a second launch when a row is longer than CHUNK; flops 2*nnz*N on "
              "CUDA cores; critical path: one item (<= CHUNK nonzeros) instead of the longest row")
ITEM_BYTES = 16


def applicable(stats, template) -> tuple[bool, str]:
    return True, (f"CSR fits any pattern; items of <= {chunk_for(stats, {})} nonzeros cut the longest row "
                  f"({int(stats.row_max)} nonzeros, mean {stats.row_mean:.1f})")


def chunk_for(stats, params: dict) -> int:
    """CHUNK, "auto" resolved exactly as prepare does (sparseditto.row_items.auto_chunk)."""
    chunk = params.get("CHUNK", "auto")
    return auto_chunk(stats.row_mean) if chunk == "auto" else int(chunk)


def grid(stats, n: int, target, template) -> list[dict]:
    chunk = chunk_for(stats, {})
    other_order = "row" if stats.row_cv > 1.0 else "length"
    out = [{}, {"ORDER": other_order}, {"UNROLL": 8}, {"CHUNK": min(1024, 2 * chunk)}, {"CHUNK": max(16, chunk // 2)}]
    if n > 32:
        # two lane groups per N strip instead of one: more items in flight, half the columns each
        out.append({"LANES": max(1, min(32, next_pow2(n / 8)) // 2)})
    out += [{"WARPS_PER_BLOCK": 8}, {"WARPS_PER_BLOCK": 2}]
    return out


def cost(stats, n: int, dtype: str, target, params: dict) -> CostTerms:
    vb = VALUE_BYTES[dtype]
    chunk = chunk_for(stats, params)
    terms = row_split_csr_terms(stats, n, dtype, params, default_bits=32)
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
