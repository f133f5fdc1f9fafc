"""Roofline cost models per storage format: what a kernel must move and compute, before it exists.

Why: the planner ranks strategies before compiling anything, often for a GPU other than the local
one. For SpMM at small N the time is bytes over bandwidth, and the bytes are decided by the
format's index metadata, so each format gets a byte formula computed from the analyzer's
statistics (`sparseditto.analysis.PatternReport`), without building the format. Bytes and flops
then go through `sparseditto.targets.roofline` on the execution unit the template uses.

Bytes of A (value bytes vb = 2 for fp16/bf16, 4 for fp32; identical to `formats.<F>.nbytes(vb)`
for the layout the template ships):
  csr           nnz*(vb + ib) + (M+1)*4            ib = 4 (int32 column ids) or 2 (int16, K <= 32768)
  bsr (bm x bk) nblocks*bm*bk*vb + nblocks*4 + (ceil(M/bm)+1)*4
                nblocks = report.block_stat((bm, bk)).nonzero_blocks (random-placement estimate
                total*(1-(1-d)^(bm*bk)) when that shape was not measured)
  nm (n:m)      M*ceil(K/m)*n*vb + M*ceil(ceil(K/m)*n / (32/bits))*4   bits = 2 (m <= 4) or 4
                (2:4 fp16: ~2.25 B per kept value), plus a CSR residual of ~(1-conformance)*groups
                entries when the pattern does not fully conform
  bitmap        nnz*vb + M*T*(tile_k/8 + 4) + (M+1)*4   T = ceil(K/tile_k): masks + tile offsets
                (OFFSETS="running": no per-tile offsets, M*T*tile_k/8 of masks only)
  ell           M*width*(4 + vb)                    width = longest row
  blocked_ell   Mb*width*(4 + bm*bk*vb)             width ~ ceil(nblocks / nonempty block rows) (estimate)
  compact       r*c*vb + (r + c)*4                  r, c = kept (non-empty) rows and columns
  dense         M*K*vb
Every estimate adds B (K*N*vb; kept_cols*N*vb for compact: only gathered rows are read) and C
(M*N*vb), plus template extras: the row order of csr_rowsplit (M*4 when reordered), the fp32
partials of csr_balanced (written then read: 2 * programs * N * 4).

FLOPs and units (the peak the roofline divides by):
  CSR family    2*nnz*N useful flops on CUDA cores ("cuda_core")
  bsr           2*nblocks*bm*bk*N16 on tensor cores ("tensor"); N16 = N rounded up to 16,
                because an MMA computes whole tiles (padding is real work)
  nm, bitmap    2*M*K*N16: compressed in memory, expanded to dense tiles, dense MMA ("tensor");
                a template may declare META["cost"]["unit"] = "sparse_tensor" for hardware 2:4
  compact       2*pad(r)*pad(c)*pad(N) with the GEMM tiles; "tensor"
  (MMA formats in fp32 run on "cuda_core" unless FP32_DOT="tf32" / ALLOW_TF32=True: exact fp32
  dots are FMA loops, not tensor-core instructions)
  dense         2*M*K*N, "tensor" (fp32: "cuda_core": torch keeps TF32 off for matmul by default)

Time = max(memory_s, compute_s) + launches * LAUNCH_S (csr_balanced with FIXUP="launch": 2 launches
when a row can cross a program boundary; the default inline fix-up needs one). Row-split CSR kernels also carry a critical-path term: one program
streams its rows alone, at about 2/sm_count of the bandwidth, so a long row bounds the kernel:
    critical_s = (longest row + (ROWS_PER_PROGRAM-1)*mean row) * (vb + ib + N*vb) * sm_count / (2*bandwidth)
and seconds = max(roofline seconds, critical_s + launch). This is what makes nnz-balanced
splitting win on power-law rows. These are lower bounds, not predictions: irregular gathers rarely
reach peak bandwidth; the measured time decides.
"""
from __future__ import annotations

import math
import numbers
from typing import Any

from pydantic import BaseModel

VALUE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
LAUNCH_S = 2.5e-6            # one kernel launch, eager (DESIGN: ~2-4 us)
INT16_COLUMN_LIMIT = 32768   # int16 column ids hold 0..32767
TENSOR_TILE_N = 16           # narrowest N tile an MMA-based kernel computes
ROW_SPLIT_TEMPLATES = ("csr_rowsplit", "csr_vector")

_DTYPE_ALIASES = {"float16": "float16", "fp16": "float16", "half": "float16", "torch.float16": "float16",
                  "bfloat16": "bfloat16", "bf16": "bfloat16", "torch.bfloat16": "bfloat16",
                  "float32": "float32", "fp32": "float32", "float": "float32", "torch.float32": "float32"}
_FORMAT_ALIASES = {"csr": "csr", "bsr": "bsr", "nm": "nm", "nm_compressed": "nm", "2:4": "nm",
                   "bitmap": "bitmap", "bitmap_tiles": "bitmap", "ell": "ell", "blocked_ell": "blocked_ell",
                   "compact": "compact", "compacted": "compact", "dense": "dense"}

FORMAT_DOCS = {
    "csr": "bytes = nnz*(vb + 4 or 2 for int16 ids) + (M+1)*4 + B + C; flops 2*nnz*N on CUDA cores",
    "bsr": "bytes = nblocks*bm*bk*vb + index bytes + B + C; flops 2*nblocks*bm*bk*N16 on tensor cores",
    "nm": "bytes = M*ceil(K/m)*n*vb + packed 2/4-bit positions + residual CSR + B + C; flops 2*M*K*N16 (expanded dense dot) on tensor cores",
    "bitmap": "bytes = nnz*vb + M*ceil(K/tile_k)*(tile_k/8 + 4) + (M+1)*4 + B + C; flops 2*M*K*N16 on tensor cores",
    "ell": "bytes = M*max_row*(4 + vb) + B + C; flops 2*M*max_row*N on CUDA cores",
    "blocked_ell": "bytes = Mb*width*(4 + bm*bk*vb) + B + C (width estimated); flops 2*Mb*width*bm*bk*N16 on tensor cores",
    "compact": "bytes = kept_rows*kept_cols*vb + (kept_rows + kept_cols)*4 + kept_cols*N*vb + M*N*vb; flops 2*padded kept GEMM on tensor cores",
    "dense": "bytes = (M*K + K*N + M*N)*vb; flops 2*M*K*N on tensor cores (fp32: CUDA cores)",
}


class CostEstimate(BaseModel):
    """A roofline estimate for one template instance at one N (all times in seconds)."""

    bytes: float
    flops: float
    memory_s: float
    compute_s: float
    seconds: float
    bound: str
    unit: str
    notes: str = ""


# ---- inputs -----------------------------------------------------------------------------------

def dtype_name(dtype: Any) -> str:
    """'float16' | 'bfloat16' | 'float32' from a name, alias or torch dtype."""
    key = str(dtype).lower()
    if key not in _DTYPE_ALIASES:
        raise ValueError(f"Unsupported value dtype {dtype!r}; expected one of float16, bfloat16, float32.")
    return _DTYPE_ALIASES[key]


def format_name(fmt: str) -> str:
    key = str(fmt).lower()
    if key not in _FORMAT_ALIASES:
        raise ValueError(f"No cost model for format {fmt!r}; known formats: {sorted(set(_FORMAT_ALIASES.values()))}.")
    return _FORMAT_ALIASES[key]


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _count(value: Any) -> int:
    """Empty rows/cols may be reported as a count or as the list of ids."""
    if value is None:
        return 0
    if isinstance(value, (list, tuple)) or hasattr(value, "__len__"):
        return len(value)
    return int(value)


class ReportStats:
    """The numbers the cost models read from a PatternReport (or any object/dict with its fields)."""

    def __init__(self, report: Any):
        shape = _get(report, "shape")
        if shape is None or len(shape) != 2:
            raise ValueError(f"Expected a report with a 2-D shape (m, k), got shape {shape!r}.")
        self.report = report
        self.m, self.k = int(shape[0]), int(shape[1])
        self.nnz = int(_get(report, "nnz"))
        rows = _get(report, "row_stats") or {}
        self.row_mean = float(_get(rows, "mean", self.nnz / self.m))
        self.row_max = float(_get(rows, "max", self.row_mean))
        self.row_cv = float(_get(rows, "cv", 0.0) or 0.0)
        self.empty_rows = _count(_get(report, "empty_rows", 0))
        self.empty_cols = _count(_get(report, "empty_cols", 0))

    @property
    def density(self) -> float:
        return self.nnz / float(self.m * self.k)

    def nm_conformance(self, n: int, m: int, axis: str = "row") -> float:
        table = _get(self.report, "nm_conformance") or {}
        entry = table.get(f"{n}:{m}") if isinstance(table, dict) else None
        if entry is None:
            return 0.0
        value = _get(entry, axis)
        return float(value) if value is not None else 0.0

    def nonzero_blocks(self, bm: int, bk: int) -> tuple[int, bool]:
        """(nonzero blocks of shape bm x bk, measured?) — estimated for a random pattern otherwise."""
        getter = _get(self.report, "block_stat")
        stat = None
        if callable(getter):
            try:
                stat = getter((bm, bk))
            except (KeyError, ValueError, LookupError):
                stat = None
        if stat is None:
            for b in _get(self.report, "blocks") or []:
                if tuple(_get(b, "shape")) == (bm, bk):
                    stat = b
                    break
        if stat is not None:
            return int(_get(stat, "nonzero_blocks")), True
        total = math.ceil(self.m / bm) * math.ceil(self.k / bk)
        expected = total * (1.0 - (1.0 - self.density) ** (bm * bk))
        return int(min(total, max(math.ceil(self.nnz / (bm * bk)), round(expected)))), False

    def nonempty_block_rows(self, bm: int, bk: int) -> int | None:
        for b in _get(self.report, "blocks") or []:
            if tuple(_get(b, "shape")) == (bm, bk):
                value = _get(b, "nonempty_block_rows")
                return int(value) if value is not None else None
        return None


# ---- bytes of A per format --------------------------------------------------------------------

def csr_bytes(m: int, nnz: int, vb: int, index_bytes: int = 4) -> float:
    return float(nnz * (vb + index_bytes) + (m + 1) * 4)


def bsr_bytes(m: int, nblocks: int, bm: int, bk: int, vb: int) -> float:
    return float(nblocks * bm * bk * vb + nblocks * 4 + (math.ceil(m / bm) + 1) * 4)


def nm_bytes(m: int, k: int, n: int, group: int, vb: int) -> float:
    slots = math.ceil(k / group) * n
    bits = 2 if group <= 4 else 4
    return float(m * slots * vb + m * math.ceil(slots / (32 // bits)) * 4)


def bitmap_bytes(m: int, k: int, nnz: int, vb: int, tile_k: int = 32, tile_offsets: bool = True) -> float:
    tiles = math.ceil(k / tile_k)
    return float(nnz * vb + m * tiles * (tile_k // 8 + (4 if tile_offsets else 0)) + (m + 1) * 4)


def ell_bytes(m: int, width: int, vb: int) -> float:
    return float(m * width * (4 + vb))


def compact_bytes(kept_m: int, kept_k: int, vb: int) -> float:
    return float(kept_m * kept_k * vb + (kept_m + kept_k) * 4)


def dense_bytes(m: int, k: int, vb: int) -> float:
    return float(m * k * vb)


# ---- per-template parameter readers -----------------------------------------------------------

def _param(params: dict, *names: str, default: Any = None) -> Any:
    for name in names:
        if name in params and params[name] not in (None, "auto"):
            return params[name]
    return default


def _block_shape(stats: ReportStats, params: dict) -> tuple[int, int]:
    shape = _param(params, "block_shape", "BLOCK_SHAPE")
    if shape is not None:
        return int(shape[0]), int(shape[1])
    bm = _param(params, "BM", "BLOCK_M", "block_m")
    bk = _param(params, "BK", "BLOCK_K", "block_k")
    if bm is not None and bk is not None:
        return int(bm), int(bk)
    best = _get(stats.report, "best_block_shape")
    if best:
        return int(best[0]), int(best[1])
    return 16, 16


def _nm_ratio(params: dict, stats: ReportStats | None = None) -> tuple[int, int]:
    """The n:m a template instance uses; "auto" (or none given) -> the report's best-conforming
    ratio among 1:2, 2:4, 4:8 (ties: the smaller group), 2:4 without a report."""
    ratio = _param(params, "NM", "nm", "ratio", "RATIO")
    if isinstance(ratio, str) and ":" in ratio:
        n, m = ratio.split(":")
        return int(n), int(m)
    n = _param(params, "N_KEEP", "n", "NM_N")
    m = _param(params, "M_GROUP", "m", "NM_M")
    if n is not None and m is not None:
        return int(n), int(m)
    if stats is not None:
        best = max(((stats.nm_conformance(a, b, "row"), -b, a) for a, b in ((1, 2), (2, 4), (4, 8))))
        if best[0] > 0:
            return best[2], -best[1]
    return 2, 4


def _mma_unit(dt: str, params: dict) -> str:
    """Tensor cores, except fp32 kept exact (FP32_DOT="ieee" / ALLOW_TF32=False): CUDA-core FMA."""
    if dt != "float32":
        return "tensor"
    tf32 = params.get("FP32_DOT") == "tf32" or params.get("ALLOW_TF32") is True
    return "tensor" if tf32 else "cuda_core"


def _csr_index_bytes(stats: ReportStats, params: dict, template: str) -> int:
    bits = params.get("INDEX_BITS", "auto" if template != "csr_vector" else 32)
    if bits == "auto":
        bits = 16 if stats.k <= INT16_COLUMN_LIMIT else 32
    return 2 if int(bits) == 16 else 4


def _next_pow2(x: float) -> int:
    return 1 if x <= 1 else 1 << (int(math.ceil(x)) - 1).bit_length()


def _round_up(x: int, tile: int) -> int:
    return -(-int(x) // int(tile)) * int(tile)


def balanced_nnz_per_program(nnz: int, params: dict) -> int:
    """csr_balanced's NNZ_PER_PROGRAM, "auto" resolved exactly as the template does."""
    chosen = params.get("NNZ_PER_PROGRAM", "auto")
    if chosen != "auto":
        return int(chosen)
    return int(min(4096, max(128, _next_pow2(-(-nnz // 2048)))))


# ---- the estimate -----------------------------------------------------------------------------

def _resolve_target(target: Any):
    from sparseditto.targets import get_target

    return get_target(target)


def estimate(template: str, fmt: str, report: Any, n: int, dtype: Any, target: Any,
             params: dict | None = None, hints: dict | None = None) -> CostEstimate:
    """Roofline estimate for `template` (its `fmt`, its resolved `params`) at N = `n` on `target`.

    `hints` is a template's optional META["cost"] dict: {"unit": ..., "launches": ...} override
    the format's defaults (e.g. a hardware 2:4 template runs on "sparse_tensor").
    """
    from sparseditto.targets import roofline

    if not isinstance(n, numbers.Integral) or isinstance(n, bool) or n < 1:
        raise ValueError(f"Expected N to be a positive integer, got {n!r}.")
    params = dict(params or {})
    hints = dict(hints or {})
    fmt = format_name(fmt)
    dt = dtype_name(dtype)
    vb = VALUE_BYTES[dt]
    tgt = _resolve_target(target)
    s = ReportStats(report)
    n = int(n)
    M, K, nnz = s.m, s.k, s.nnz
    n16 = _round_up(n, TENSOR_TILE_N)
    b_bytes, c_bytes = float(K * n * vb), float(M * n * vb)
    extra, launches, notes = 0.0, 1, []

    if fmt == "csr":
        ib = _csr_index_bytes(s, params, template)
        a_bytes = csr_bytes(M, nnz, vb, ib)
        flops, unit = 2.0 * nnz * n, "cuda_core"
        notes.append(f"CSR with {8 * ib}-bit column ids")
        if template == "csr_rowsplit" and params.get("REORDER", "none") != "none":
            extra += M * 4.0
        if template == "csr_balanced":
            per = balanced_nnz_per_program(nnz, params)
            programs = max(1, -(-nnz // per))
            if s.row_max > 1 and programs > 1:  # some row can cross a program boundary
                launches = 2 if params.get("FIXUP", "inline") == "launch" else 1
                extra += 2.0 * programs * n * 4
            notes.append(f"{programs} programs of {per} nonzeros")
    elif fmt == "bsr":
        bm, bk = _block_shape(s, params)
        nblocks, measured = s.nonzero_blocks(bm, bk)
        a_bytes = bsr_bytes(M, nblocks, bm, bk, vb)
        flops, unit = 2.0 * nblocks * bm * bk * n16, _mma_unit(dt, params)
        notes.append(f"{nblocks} nonzero {bm}x{bk} blocks" + ("" if measured else " (random-placement estimate)"))
    elif fmt == "nm":
        nk, mg = _nm_ratio(params, s)
        a_bytes = nm_bytes(M, K, nk, mg, vb)
        conf = s.nm_conformance(nk, mg, "row")
        if conf < 1.0:
            residual = (1.0 - conf) * M * math.ceil(K / mg)
            a_bytes += csr_bytes(M, int(round(residual)), vb, 4)
            notes.append(f"{nk}:{mg} row conformance {conf:.3f}: residual CSR of ~{int(round(residual))} entries")
        flops, unit = 2.0 * M * _round_up(K, mg) * n16, _mma_unit(dt, params)
    elif fmt == "bitmap":
        tile_k = int(_param(params, "TILE_K", "tile_k", default=32))
        offsets = params.get("OFFSETS", "stored") != "running"
        a_bytes = bitmap_bytes(M, K, nnz, vb, tile_k, tile_offsets=offsets)
        flops, unit = 2.0 * M * _round_up(K, tile_k) * n16, _mma_unit(dt, params)
        notes.append(f"{tile_k}-bit masks" + (" + int32 tile offsets" if offsets else " (running offsets)"))
    elif fmt == "ell":
        width = int(math.ceil(s.row_max))
        a_bytes = ell_bytes(M, width, vb)
        flops, unit = 2.0 * M * width * n, "cuda_core"
    elif fmt == "blocked_ell":
        bm, bk = _block_shape(s, params)
        nblocks, _ = s.nonzero_blocks(bm, bk)
        rows_b = s.nonempty_block_rows(bm, bk) or math.ceil(M / bm)
        width = math.ceil(nblocks / max(1, rows_b))
        mb = math.ceil(M / bm)
        a_bytes = float(mb * width * (4 + bm * bk * vb))
        flops, unit = 2.0 * mb * width * bm * bk * n16, _mma_unit(dt, params)
        notes.append("Blocked-ELL width estimated from the mean blocks per non-empty block row")
    elif fmt == "compact":
        kept_m, kept_k = M - s.empty_rows, K - s.empty_cols
        a_bytes = compact_bytes(kept_m, kept_k, vb)
        b_bytes = float(kept_k * n * vb)
        bm = int(_param(params, "BLOCK_M", default=64))
        bk = int(_param(params, "BLOCK_K", default=64))
        bn = int(_param(params, "BLOCK_N", default=max(16, min(_next_pow2(n), 128))))
        flops = 2.0 * _round_up(kept_m, bm) * _round_up(kept_k, bk) * _round_up(n, bn)
        unit = _mma_unit(dt, params)
        notes.append(f"kept {kept_m}x{kept_k} of {M}x{K}")
    else:  # dense
        a_bytes = dense_bytes(M, K, vb)
        flops = 2.0 * M * K * n
        unit = "cuda_core" if dt == "float32" else "tensor"

    unit = hints.get("unit", unit)
    launches = int(hints.get("launches", launches))
    total = a_bytes + b_bytes + c_bytes + extra
    roof = roofline(tgt, total, flops, dtype=dt, unit=unit, launch_s=launches * LAUNCH_S)
    seconds, bound = roof.seconds, roof.bound
    if template in ROW_SPLIT_TEMPLATES and nnz:
        rows = int(params.get("ROWS_PER_PROGRAM", 1) or 1)
        ib = _csr_index_bytes(s, params, template)
        row_work = s.row_max + (rows - 1) * s.row_mean
        per_program_bw = 2.0 * tgt.bandwidth_gbs() * 1e9 / tgt.sm_count
        critical = row_work * (vb + ib + n * vb) / per_program_bw + launches * LAUNCH_S
        if critical > seconds:
            seconds, bound = critical, "imbalance"
            notes.append(f"longest row ({int(s.row_max)} nonzeros) bounds one program: {critical * 1e6:.2f} us")
    notes.append(f"{launches} launch(es) on {tgt.name}")
    return CostEstimate(bytes=total, flops=flops, memory_s=roof.memory_s, compute_s=roof.compute_s,
                        seconds=seconds, bound=bound, unit=unit, notes="; ".join(notes))


def format_bytes(fmt: str, report: Any, dtype: Any = "float16", params: dict | None = None,
                 template: str = "") -> float:
    """Bytes of A alone in `fmt` (no B, no C), from the report: the formula table above."""
    fmt, vb, s, params = format_name(fmt), VALUE_BYTES[dtype_name(dtype)], ReportStats(report), dict(params or {})
    if fmt == "csr":
        return csr_bytes(s.m, s.nnz, vb, _csr_index_bytes(s, params, template))
    if fmt == "bsr":
        bm, bk = _block_shape(s, params)
        return bsr_bytes(s.m, s.nonzero_blocks(bm, bk)[0], bm, bk, vb)
    if fmt == "nm":
        nk, mg = _nm_ratio(params, s)
        return nm_bytes(s.m, s.k, nk, mg, vb)
    if fmt == "bitmap":
        return bitmap_bytes(s.m, s.k, s.nnz, vb, int(_param(params, "TILE_K", "tile_k", default=32)),
                            tile_offsets=params.get("OFFSETS", "stored") != "running")
    if fmt == "ell":
        return ell_bytes(s.m, int(math.ceil(s.row_max)), vb)
    if fmt == "compact":
        return compact_bytes(s.m - s.empty_rows, s.k - s.empty_cols, vb)
    if fmt == "dense":
        return dense_bytes(s.m, s.k, vb)
    raise ValueError(f"format_bytes has no exact formula for {fmt!r}; use estimate().")
