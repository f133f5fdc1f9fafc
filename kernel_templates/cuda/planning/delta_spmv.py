"""delta_spmv's planning knowledge: per-nonzero decode with 4/8-bit column deltas for N <= 8.

It fits any pattern (fillers bridge wide gaps), fp16/bf16, K small enough for a 16-bit strip of B
per CTA in shared memory (B_HALF, the default; fp32 with B_HALF 0). Its bytes are 2.5-3 per nonzero
plus row-slice padding; above the shared-memory cap of NV columns it re-reads A once per column
block, so it only pays at small N.
"""
from __future__ import annotations

from sparseditto.kernel_templates.cost import (VALUE_BYTES, CostTerms, delta_lanes_floor, delta_packing, h200_scaled,
                                               next_pow2, sm_count)

COST_MODEL = ("bytes = slots*(vb + bits/8) + M*L*4 + (M+1)*4 per pass, slots = entries (nonzeros + gap fillers) "
              "padded to 8*L per row, passes = ceil(N / NV); time = max(bytes / bandwidth, measured floor "
              "0.5 ps + 0.1 ps per column per slot) (H200 fit)")
SMEM_CAP = 99 * 1024      # the template's own cap (kernel_templates/cuda/delta_spmv.py says why)
APPLICABILITY = f"fp16/bf16 values and K <= {SMEM_CAP // 2} (a 16-bit column strip of B per CTA in shared memory)"
# Measured floor: a fit to the H200 sweep `benchmarks/llm_layers.py --preset decode --cases 11008x4096`
# (2026-12-01, session 20: B's copy in 16-bit values, MIN_WARPS 24; fp16, CUDA-graph launch,
# read-flushed cold L2) between 50% (23.3 M slots) and 90% (4.6 M): 0.66 ps per slot at N = 1 and 2,
# 0.95 at N = 4 (50%: 26.1 / 24.3 / 33.2 us at N = 1 / 2 / 4), i.e. ~0.5 ps + 0.1 ps per column of B
# per slot, plus ~10 us fixed (not added: estimates stay lower bounds). Other GPUs get it scaled by
# their bandwidth (an assumption).
SLOT_S = 0.5e-12
SLOT_COLUMN_S = 0.1e-12


def nv_cap(k: int, element_bytes: int = 2) -> int:
    """The widest NV whose strip of B fits SMEM_CAP (B_HALF, the default: 2 bytes; fp32: 4)."""
    fits = [nv for nv in (1, 2, 4, 8) if k * nv * element_bytes <= SMEM_CAP]
    return fits[-1] if fits else 0


def applicable(stats, template) -> tuple[bool, str]:
    if nv_cap(stats.k) == 0:
        return False, f"K = {stats.k}: a 16-bit column of B ({stats.k * 2} bytes) exceeds the {SMEM_CAP}-byte strip"
    return True, f"{stats.nnz} nonzeros: 4/8-bit column deltas, 2.5-3 bytes per fp16 nonzero"


# An explicit LANES below prepare's floor leaves SMs idle ("auto" never does: `delta_format.lanes_to_fill`).
# Measured on the H200 (session 21, 4096x4096 90%, N = 1): 4 lanes per row (64 CTAs on 132 SMs) 9.3 us, 8 lanes
# (128 CTAs) 7.9 us. Without this the fewer lanes' smaller padding ranked LANES 4 first on 50% weights at N = 1
# (4096x4096: 7.48 us estimated against the default's 7.75), a count that runs 64 CTAs there.
UNDERFILL_FLOOR = 9.3 / 7.9


def lanes_floor(stats, target, params: dict) -> int:
    """prepare's floor on "auto" lanes for these launch parameters (`delta_format.lanes_floor`)."""
    return delta_lanes_floor(stats.m, int(params.get("WARPS", 8)), sm_count(target), int(params.get("ROW_SPLIT", 0)))


def packing(stats, vb: int, target, params: dict) -> tuple[float, int, int, float]:
    """delta_packing under these launch parameters, with prepare's floor on "auto" lanes
    (`delta_format.lanes_floor`: the rows must spread over the target's SMs)."""
    return delta_packing(stats, vb, params.get("LANES", "auto"), lanes_floor(stats, target, params))


def grid(stats, n: int, target, template) -> list[dict]:
    """The default first (MIN_WARPS 24 was the fastest on every 11008x4096 case; "auto" lanes are
    raised until the rows fill the SMs, `lanes_to_fill`), then, where the packing puts 32 lanes on
    a row, 16; then no register cap, smaller CTAs and the plain B copy.

    Why 16 lanes second: with 32 a warp streams whole rows, and M rows over the ~24 resident warps
    per SM leave the warps with one row more than others running alone at the end (M = 4096: 1-2
    rows per warp). On the H200 (session 21, N = 1) 16 lanes measured 10.1 vs 11.8 us on 4096x4096
    70%, 22.7 vs 25.4 on 4096x11008 50% and 15.6 vs 17.4 on 11008x4096 70% (two runs), but 15.1 vs
    13.8 on 4096x4096 50%: a measurement decides, so it comes second."""
    variants = [{}, {"MIN_WARPS": 0}, {"WARPS": 4}, {"SKEW": 0}]
    if packing(stats, VALUE_BYTES["float16"], target, {})[2] == 32:
        variants.insert(1, {"LANES": 16})
    return variants


def cost(stats, n: int, dtype: str, target, params: dict) -> CostTerms:
    a_bytes, bits, lanes, slots = packing(stats, VALUE_BYTES[dtype], target, params)
    nv = params.get("NV", "auto")
    cap = nv_cap(stats.k, 2 if int(params.get("B_HALF", 1)) else 4)
    nv = min(next_pow2(max(1, n)), cap) if nv in (None, "auto") else int(nv)
    passes = -(-max(1, n) // max(1, nv))
    notes = [f"{bits}-bit deltas, {lanes} lanes per row, B strip of {nv} column(s) in shared memory"]
    if passes > 1:
        notes.append(f"N = {n} runs as {passes} passes over A of NV = {nv} columns")
    floor = h200_scaled(slots * (SLOT_S + SLOT_COLUMN_S * min(nv, max(1, n))) * passes, target)
    if lanes < lanes_floor(stats, target, params):
        floor *= UNDERFILL_FLOOR
        notes.append(f"{lanes} lanes per row leave SMs idle (measured {UNDERFILL_FLOOR:.2f}x on the floor)")
    return CostTerms(a_bytes=a_bytes * passes, flops=2.0 * stats.nnz * n, unit="cuda_core", notes=notes,
                     decode_s=floor)
