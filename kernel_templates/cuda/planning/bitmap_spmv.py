"""bitmap_spmv's planning knowledge: a row bitmap pays one bit per element, so it fits any pattern
dense enough for the values to outweigh the masks; above N = 8 it re-reads A once per 8 columns."""
from __future__ import annotations

from sparseditto.kernel_templates.cost import VALUE_BYTES, CostTerms, bitmap_applicable, next_pow2

APPLICABILITY = "density >= 0.02 (a mask bit per element must cost less than the values it indexes); fp32/fp16/bf16"
COST_MODEL = ("bytes = ((nnz+1)*vb + M*ceil(K/32)*4 + M*ceil(K/1024)*4) * ceil(N/NV) + B + C; flops 2*nnz*N "
              "on CUDA cores (NV = columns per pass, <= 8)")
MAX_NV = 8


def packed_bytes(m: int, k: int, nnz: int, vb: int) -> int:
    """Bytes of bitmap_spmv.pack: values + the trailing zero, a mask word per 32 columns, an offset
    per 1024-column span."""
    words = -(-k // 32)
    return (nnz + 1) * vb + m * words * 4 + m * (-(-words // 32)) * 4


def applicable(stats, template) -> tuple[bool, str]:
    return bitmap_applicable(stats, "1 bit per element of masks")


def grid(stats, n: int, target, template) -> list[dict]:
    return [{}, {"ROWS": 1}, {"ROWS": 4}, {"WARPS": 8}]


def cost(stats, n: int, dtype: str, target, params: dict) -> CostTerms:
    nv = params.get("NV", "auto")
    nv = min(next_pow2(max(1, n)), MAX_NV) if nv == "auto" else int(nv)
    passes = -(-max(1, n) // nv)
    a_bytes = packed_bytes(stats.m, stats.k, stats.nnz, VALUE_BYTES[dtype])
    notes = ["mask word per 32 columns, popcount offsets, CUDA cores"]
    if passes > 1:
        notes.append(f"N = {n} runs as {passes} passes over A of NV = {nv} columns")
    return CostTerms(a_bytes=a_bytes * passes, flops=2.0 * stats.nnz * n, unit="cuda_core", notes=notes)
