"""bsr_tc's planning knowledge: it needs the block structure the analyzer found."""
from __future__ import annotations

from sparseditto.kernel_templates.cost import (TENSOR_TILE_N, VALUE_BYTES, CostTerms, block_shape, bsr_bytes, mma_unit,
                                               next_pow2, round_up)

APPLICABILITY = "needs a block shape from the analyzer (report.best_block_shape)"
COST_MODEL = "bytes = nblocks*bm*bk*vb + index bytes + B + C; flops 2*nblocks*bm*bk*N16 on tensor cores"


def applicable(stats, template) -> tuple[bool, str]:
    best = stats.best_block_shape
    if best:
        return True, f"analyzer found block structure, best block shape {tuple(best)}"
    return False, "analyzer found no block shape (report.best_block_shape is None)"


def grid(stats, n: int, target, template) -> list[dict]:
    """The analyzer's best block shape first, then the template's own "auto" re-blocking."""
    best = stats.best_block_shape
    shaped = {"BM": int(best[0]), "BK": int(best[1])} if best else {}
    bn = max(16, min(next_pow2(n), 128))
    return [shaped, {}, {**shaped, "BLOCK_N": bn}, {**shaped, "ORDER": "natural"},
            {**shaped, "num_stages": 4}, {**shaped, "SPLIT": 1}, {**shaped, "BLOCK_N": max(16, bn // 2)}]


def cost(stats, n: int, dtype: str, target, params: dict) -> CostTerms:
    vb = VALUE_BYTES[dtype]
    bm, bk = block_shape(stats, params)
    nblocks, measured = stats.nonzero_blocks(bm, bk)
    return CostTerms(a_bytes=bsr_bytes(stats.m, nblocks, bm, bk, vb),
                     flops=2.0 * nblocks * bm * bk * round_up(n, TENSOR_TILE_N), unit=mma_unit(dtype, params),
                     notes=[f"{nblocks} nonzero {bm}x{bk} blocks" + ("" if measured else " (random-placement estimate)")])
