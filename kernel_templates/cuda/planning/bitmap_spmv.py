"""bitmap_spmv's planning knowledge: a row bitmap pays one bit per element, so it fits any pattern
dense enough for the values to outweigh the masks; above N = 8 it re-reads A once per 8 columns.
Its time is set by the per-slot instructions (shuffles, popcounts, a load per slot), not its bytes:
the measured fit below keeps the planner from trying it where it loses to cuBLAS (everywhere it was
measured, so far)."""
from __future__ import annotations

from sparseditto.kernel_templates.cost import VALUE_BYTES, CostTerms, bitmap_applicable, h200_scaled, next_pow2

APPLICABILITY = "density >= 0.02 (a mask bit per element must cost less than the values it indexes); fp32/fp16/bf16"
COST_MODEL = ("bytes = ((nnz+1)*vb + M*ceil(K/32)*4 + M*ceil(K/1024)*4) * ceil(N/NV) + B + C; time = max(bytes / "
              "bandwidth, per-slot floor 1.05 ns/element (+0.18 ns per extra column) per pass) (H200 fit)")
MAX_NV = 8

# Measured calibration: a fit to the H200 sweep `benchmarks/llm_layers.py --preset decode`
# (2026-12-01, fp16, ROWS=2 SPLIT=4, CUDA-graph launch, cold L2) on 4096x4096 and 11008x4096 at
# 50-90% sparsity: ~1.05 ns per matrix element at NV = 1, +0.18 ns per element per extra column of
# B, per pass over A, almost independent of sparsity (every slot costs its instructions), plus
# ~6.6 us fixed (not added: estimates stay lower bounds). 4096x4096 50% at N = 1: 24.2 us against
# cuBLAS's 18.5 us. Other GPUs get it scaled by their bandwidth (an assumption).
ELEMENT_S = 1.05e-12
COLUMN_S = 0.184e-12


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
    slot_s = stats.m * stats.k * (ELEMENT_S + COLUMN_S * (min(nv, max(1, n)) - 1)) * passes
    return CostTerms(a_bytes=a_bytes * passes, flops=2.0 * stats.nnz * n, unit="cuda_core", notes=notes,
                     decode_s=h200_scaled(slot_s, target))
