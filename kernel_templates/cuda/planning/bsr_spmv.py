"""bsr_spmv's planning knowledge: block-pruned weights at decode N, on the CUDA cores."""
from __future__ import annotations

from sparseditto.kernel_templates.cost import VALUE_BYTES, CostTerms, bsr_bytes, next_pow2

APPLICABILITY = "needs a block shape from the analyzer (report.best_block_shape); fp16 / bf16 values"
COST_MODEL = ("bytes = (nblocks*BS*BS*vb + 4*nblocks + block-row pointers) * strips + B + C, strips = ceil(N / NN) "
              "(NN = the power of two >= N, at most 8: every strip of columns reads the blocks again; BS 16 or 32: "
              "'auto' the one storing fewer values); flops 2*nblocks*BS*BS*N on CUDA cores")
MAX_NN = 8
BLOCK_SIZES = (16, 32)
AUTO_SLACK = 1.15     # as the template's prepare: 16 only where 32 stores 15% more values


def applicable(stats, template) -> tuple[bool, str]:
    best = stats.best_block_shape
    if best:
        return True, f"analyzer found block structure (best block shape {tuple(best)}); stored as 16/32 square blocks"
    return False, "analyzer found no block shape (report.best_block_shape is None)"


def block_size(stats, params: dict) -> tuple[int, int, bool]:
    """(BS, nonzero blocks, measured?): BS as prepare resolves "auto" (32 unless 16 stores AUTO_SLACK
    times fewer values), from the analyzer's block counts."""
    bs = params.get("BS", "auto")
    if bs != "auto":
        count, measured = stats.nonzero_blocks(int(bs), int(bs))
        return int(bs), count, measured
    small, large = stats.nonzero_blocks(16, 16), stats.nonzero_blocks(32, 32)
    if small[0] * 256 * AUTO_SLACK < large[0] * 1024:
        return 16, small[0], small[1]
    return 32, large[0], large[1]


def grid(stats, n: int, target, template) -> list[dict]:
    return [{}, {"WARPS": 16}, {"UNROLL": 1}, {"WARPS": 4}, {"BS": 16}, {"BS": 32}]


def strips(n: int, params: dict) -> int:
    """CTAs per block row along N: NN columns each (the template's nn_for)."""
    nn = params.get("NN", "auto")
    nn = min(MAX_NN, next_pow2(n)) if nn == "auto" else int(nn)
    return -(-int(n) // nn)


def cost(stats, n: int, dtype: str, target, params: dict) -> CostTerms:
    vb = VALUE_BYTES[dtype]
    bs, nblocks, measured = block_size(stats, params)
    reads = strips(n, params)
    notes = [f"{nblocks} nonzero {bs}x{bs} blocks" + ("" if measured else " (random-placement estimate)")]
    if reads > 1:
        notes.append(f"the blocks read {reads} times (strips of N)")
    return CostTerms(a_bytes=bsr_bytes(stats.m, nblocks, bs, bs, vb) * reads, flops=2.0 * nblocks * bs * bs * n,
                     unit="cuda_core", notes=notes)
