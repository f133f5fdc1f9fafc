"""Shared roofline arithmetic: what every template's cost model is built from.

Why: the planner ranks strategies before compiling anything, often for a GPU other than the local
one. For SpMM at small N the time is bytes over bandwidth, and the bytes are decided by the
format's index metadata, so each template states (in its planning module, see
`kernel_templates/registry.py`) what one instance moves and computes, as `CostTerms`, from the
analyzer's statistics (`ReportStats`), without building the format. This module turns those terms
into a `CostEstimate` the same way for every template, and holds the pieces several templates
share: the per-format byte formulas, the readers of common parameters, the compute unit of an MMA.

Bytes of A per format (value bytes vb = 2 for fp16/bf16, 4 for fp32; identical to
`formats.<F>.nbytes(vb)` for the layout; `format_bytes` dispatches on the format name):
  csr           nnz*(vb + ib) + (M+1)*4            ib = 4 (int32 column ids) or 2 (int16, K <= 32768)
  bsr (bm x bk) nblocks*bm*bk*vb + nblocks*4 + (ceil(M/bm)+1)*4
                nblocks = report.block_stat((bm, bk)).nonzero_blocks (random-placement estimate
                total*(1-(1-d)^(bm*bk)) when that shape was not measured)
  nm (n:m)      M*ceil(K/m)*n*vb + M*ceil(ceil(K/m)*n / (32/bits))*4   bits = 2 (m <= 4) or 4
  bitmap        nnz*vb + M*T*(tile_k/8 + 4) + (M+1)*4   T = ceil(K/tile_k): masks + tile offsets
                (OFFSETS="running": no per-tile offsets, M*T*tile_k/8 of masks only)
  ell           M*width*(4 + vb)                    width = longest row
  compact       r*c*vb + (r + c)*4                  r, c = kept (non-empty) rows and columns
  dense         M*K*vb
  tc_dense      Mp*Kp*vb (Mp = M rounded up to 16, Kp = K to 64)          (the CUDA decode tier,
  tc_sp24       Mp*Kp/2*vb + tiles*chunks*128 (mma.sp metadata)            sparseditto.tc_formats)
  tc_bitmap     nnz*vb + tiles*chunks*184 (headers, mean padding) + tiles*(chunks+1)*4
  tc_lanemask   nnz*vb + tiles*chunks*136 (lane words, mean padding) + tiles*(chunks+1)*4
  tc_words      4*U*units + tiles*chunks*(head + 8) + tiles*(chunks+1)*4, units = kept fragment units of U
                registers (2U neighbouring values of a row): Mp*Kp/(2U)*(1-(1-d)^(2U)) at random placement,
                head = 16/U masks and bases rounded to 16 bytes (96 at U = 1, 48 at U = 2)
  tc_scatter    (nnz + pads)*(vb+1) + tiles*chunks*20 (step counts, mean 16-byte padding) + tiles*(chunks+1)*4
                pads = each step's count rounded up to 8, in expectation (binomial count per step)
  delta_slices  slots*(vb + bits/8) + M*L*4 + (M+1)*4   slots = nonzeros + gap fillers, padded to 8*L
                per row (sparseditto.delta_format; random-placement estimate of the fillers)
An estimate adds B (K*N*vb unless the template reads less) and C (M*N*vb) to a template's bytes of
A and its extra traffic, and goes through `sparseditto.targets.roofline` on the template's unit:

  time = max(bytes / bandwidth, flops / peak(unit)) + launches * LAUNCH_S

Row-split kernels also declare a critical path: one program streams its rows alone, at about
2/sm_count of the bandwidth, so a long row bounds the kernel (`row_critical_bytes`):
    critical_s = critical_bytes * sm_count / (2*bandwidth) + launches * LAUNCH_S
and seconds = max(roofline seconds, critical_s). These are lower bounds, not predictions:
irregular gathers rarely reach peak bandwidth; the measured time decides.

A kernel that is not a template instance (an LLM's edit) is costed with the model of the template it
adapts, its A bytes replaced by the bytes of the tensors its prepare() returns (`with_a_bytes`).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import BaseModel

from sparseditto.delta_format import LANE_CHOICES as DELTA_LANES, LANE_WASTE as DELTA_LANE_WASTE
from sparseditto.delta_format import lanes_floor as delta_lanes_floor  # noqa: F401 - delta_spmv's planning
from sparseditto.delta_format import packing_score as delta_packing_score
from sparseditto.tc_formats import SCATTER_GROUP, SCATTER_STEP_HALVES, words_header_bytes

VALUE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
LAUNCH_S = 2.5e-6            # one kernel launch, eager (DESIGN: ~2-4 us)
INT16_COLUMN_LIMIT = 32768   # int16 column ids hold 0..32767
TENSOR_TILE_N = 16           # narrowest N tile an MMA-based kernel computes

_DTYPE_ALIASES = {"float16": "float16", "fp16": "float16", "half": "float16", "torch.float16": "float16",
                  "bfloat16": "bfloat16", "bf16": "bfloat16", "torch.bfloat16": "bfloat16",
                  "float32": "float32", "fp32": "float32", "float": "float32", "torch.float32": "float32"}
_FORMAT_ALIASES = {"csr": "csr", "bsr": "bsr", "nm": "nm", "nm_compressed": "nm", "2:4": "nm",
                   "bitmap": "bitmap", "bitmap_tiles": "bitmap", "ell": "ell", "blocked_ell": "blocked_ell",
                   "compact": "compact", "compacted": "compact", "dense": "dense",
                   "tc_dense": "tc_dense", "tc_sp24": "tc_sp24", "tc_bitmap": "tc_bitmap",
                   "tc_lanemask": "tc_lanemask", "tc_scatter": "tc_scatter", "tc_words": "tc_words",
                   "delta_slices": "delta_slices"}


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
    a_bytes: float | None = None   # the part of ``bytes`` that is A in its format


@dataclass
class CostTerms:
    """What one template instance moves and computes at one N: its planning module's answer.

    ``b_bytes`` None means B is read once (K*N*vb); C (M*N*vb) is always added. ``critical_bytes``
    (with ``critical_what``, e.g. "longest row (410 nonzeros)") is what one program streams alone,
    for kernels a long row can bound; 0 means no such path.
    """

    a_bytes: float
    flops: float
    unit: str                          # "tensor" | "sparse_tensor" | "cuda_core"
    b_bytes: float | None = None
    extra_bytes: float = 0.0
    launches: int = 1
    critical_bytes: float = 0.0
    critical_what: str = ""
    notes: list[str] = field(default_factory=list)
    # A floor for kernels bound by their decode instructions rather than their bytes, measured by the
    # template (tc_bitmap's planning module states its H200 fit); 0 leaves the roofline bound alone.
    decode_s: float = 0.0


# ---- inputs -----------------------------------------------------------------------------------

def dtype_name(dtype: Any) -> str:
    """'float16' | 'bfloat16' | 'float32' from a name, alias or torch dtype."""
    key = str(dtype).lower()
    if key not in _DTYPE_ALIASES:
        raise ValueError(f"Unsupported value dtype {dtype!r}; expected one of float16, bfloat16, float32.")
    return _DTYPE_ALIASES[key]


def format_name(fmt: str) -> str:
    """The canonical storage-format name ('csr', 'bsr', 'nm', ...); ValueError for an unknown one."""
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
        self.best_block_shape = _get(report, "best_block_shape")

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


#: Below this density one bit per element costs more than the values a bitmap indexes.
BITMAP_MIN_DENSITY = 0.02


def bitmap_applicable(stats: ReportStats, index_cost: str) -> tuple[bool, str]:
    """Applicability of a bitmap format (bitmap_tiles, tc_bitmap): it pays for every element, so it
    is only worth its bytes while the kept values outweigh the index (`index_cost` says how much)."""
    if stats.density >= BITMAP_MIN_DENSITY:
        return True, f"density {stats.density:.3f}: {index_cost}, values dominate"
    return False, f"density {stats.density:.4f} < {BITMAP_MIN_DENSITY}: the bitmap's index bytes exceed the values'"


def ell_bytes(m: int, width: int, vb: int) -> float:
    return float(m * width * (4 + vb))


def compact_bytes(kept_m: int, kept_k: int, vb: int) -> float:
    return float(kept_m * kept_k * vb + (kept_m + kept_k) * 4)


def dense_bytes(m: int, k: int, vb: int) -> float:
    return float(m * k * vb)


# ---- readers of parameters several templates share --------------------------------------------

def param(params: dict, *names: str, default: Any = None) -> Any:
    """The first of ``names`` set to a concrete value ("auto" and None do not count)."""
    for name in names:
        if name in params and params[name] not in (None, "auto"):
            return params[name]
    return default


def block_shape(stats: ReportStats, params: dict) -> tuple[int, int]:
    """(bm, bk) of a block format: explicit params, else the analyzer's best shape, else 16x16."""
    shape = param(params, "block_shape", "BLOCK_SHAPE")
    if shape is not None:
        return int(shape[0]), int(shape[1])
    bm = param(params, "BM", "BLOCK_M", "block_m")
    bk = param(params, "BK", "BLOCK_K", "block_k")
    if bm is not None and bk is not None:
        return int(bm), int(bk)
    if stats.best_block_shape:
        return int(stats.best_block_shape[0]), int(stats.best_block_shape[1])
    return 16, 16


def nm_ratio(params: dict, stats: ReportStats | None = None) -> tuple[int, int]:
    """The n:m a template instance uses; "auto" (or none given) -> the report's best-conforming
    ratio among 1:2, 2:4, 4:8 (ties: the smaller group), 2:4 without a report."""
    ratio = param(params, "NM", "nm", "ratio", "RATIO")
    if isinstance(ratio, str) and ":" in ratio:
        n, m = ratio.split(":")
        return int(n), int(m)
    n = param(params, "N_KEEP", "n", "NM_N")
    m = param(params, "M_GROUP", "m", "NM_M")
    if n is not None and m is not None:
        return int(n), int(m)
    if stats is not None:
        best = max(((stats.nm_conformance(a, b, "row"), -b, a) for a, b in ((1, 2), (2, 4), (4, 8))))
        if best[0] > 0:
            return best[2], -best[1]
    return 2, 4


def csr_index_bytes(stats: ReportStats, params: dict, default_bits: Any = "auto") -> int:
    """Bytes per column id: INDEX_BITS (16 | 32 | "auto": 16 when K <= 32768), else ``default_bits``."""
    bits = params.get("INDEX_BITS", default_bits)
    if bits == "auto":
        bits = 16 if stats.k <= INT16_COLUMN_LIMIT else 32
    return 2 if int(bits) == 16 else 4


def mma_unit(dt: str, params: dict) -> str:
    """Tensor cores, except fp32 kept exact (FP32_DOT="ieee" / ALLOW_TF32=False): CUDA-core FMA."""
    if dt != "float32":
        return "tensor"
    tf32 = params.get("FP32_DOT") == "tf32" or params.get("ALLOW_TF32") is True
    return "tensor" if tf32 else "cuda_core"


def row_critical_bytes(stats: ReportStats, rows_per_program: int, vb: int, ib: int, n: int) -> float:
    """Bytes the busiest program of a row-split kernel streams alone: its longest row plus the
    mean rows it shares a program with, each nonzero bringing its value, its id and a row of B."""
    row_work = stats.row_max + (rows_per_program - 1) * stats.row_mean
    return row_work * (vb + ib + n * vb)


def row_split_csr_terms(stats: ReportStats, n: int, dtype: str, params: dict, *, rows_per_program: int = 1,
                        default_bits: Any = "auto") -> CostTerms:
    """A CSR kernel whose programs own whole rows (csr_rowsplit, csr_vector): the CSR bytes, 2*nnz*N
    flops on CUDA cores, and the critical path of its busiest program."""
    vb = VALUE_BYTES[dtype]
    ib = csr_index_bytes(stats, params, default_bits)
    terms = CostTerms(a_bytes=csr_bytes(stats.m, stats.nnz, vb, ib), flops=2.0 * stats.nnz * n, unit="cuda_core",
                      notes=[f"CSR with {8 * ib}-bit column ids"])
    if stats.nnz:
        terms.critical_bytes = row_critical_bytes(stats, rows_per_program, vb, ib, n)
        terms.critical_what = f"longest row ({int(stats.row_max)} nonzeros)"
    return terms


# The CUDA-core CSR kernels' (csr_vector, csr_rowdecomp) decode floor per nonzero and column of N on
# 16-bit LLM weights at decode widths (N <= CSR_DECODE_MAX_N), from the H200 (per-row magnitude 90%,
# chained): csr_vector 10.6 / 19.6 us at N = 8 on 4096x4096 / 11008x4096 (1.68 / 4.51 M nonzeros: 6.3 /
# 4.3 ps each, session 29) and 16.5 us at N = 16 on 4096x4096 (9.8 ps, session 34's run_graph, where
# csr_rowdecomp ran slower still). 0.55 ps x N is below all of them (a lower bound, as every floor);
# without it their byte estimates (4.9 us at N = 16 on 4096x4096) put them first where they ran 3.4x
# slower and lost to cuBLAS. At N = 64 (session 36, `sparseditto bench --suite llm`, graph-launched)
# csr_vector ran 186 / 74 / 239 us on 4096x4096 70% / 90% / block-32 75% (0.58 / 0.69 / 0.89 ps), where the
# byte estimate (~10 us) had put it first ahead of cuBLAS (15.5 us). fp32 and wider N (graphs) keep the
# byte estimates: not measured there.
CSR_DECODE_NNZ_COLUMN_S = 0.55e-12
CSR_DECODE_MAX_N = 64


def csr_decode_floor_s(stats: ReportStats, n: int, dtype: str, target: Any) -> float:
    """The CUDA-core CSR kernels' measured decode floor (0 where it was not measured: fp32, N > 64)."""
    if dtype not in ("float16", "bfloat16") or n > CSR_DECODE_MAX_N:
        return 0.0
    return h200_scaled(stats.nnz * n * CSR_DECODE_NNZ_COLUMN_S, target)


def next_pow2(x: float) -> int:
    return 1 if x <= 1 else 1 << (int(math.ceil(x)) - 1).bit_length()


def round_up(x: int, tile: int) -> int:
    return -(-int(x) // int(tile)) * int(tile)


def sm_count(target: Any) -> int:
    """SMs of ``target`` (a name or Target) for grid heuristics; 132 (H100/H200) when unknown."""
    if target is None:
        return 132
    try:
        from sparseditto.targets import get_target

        return int(get_target(target).sm_count)
    except (ImportError, ValueError):
        return 132


H200_BANDWIDTH_GBS = 4130.0      # the read bandwidth the H200-measured decode floors were fit at
# The register-streaming tensor-core kernels (tc_dense, tc_sp24) per (16-row tile, 64-column chunk,
# n8 tile): below their byte time at N <= 16, their bound at N >= 32, where each warp's B-fragment
# reads and mma's grow with N and the kernel turns latency-bound (ncu, docs/kernels.md session 25).
# H200 fit, chained, session 25: tc_sp24 0.10-0.21 ns (11008x4096 N = 128 .. 4096x11008 N = 32),
# tc_dense 0.13-0.17 ns; the smallest, so it stays a floor.
TC_TILE_STEP_S = 0.10e-9


def tc_stream_floor_s(m: int, k: int, n: int, target: Any, step_s: float = TC_TILE_STEP_S) -> float:
    """tc_dense / tc_sp24's measured wide-N floor: tiles x chunks x n8 tiles x `step_s`."""
    return h200_scaled(-(-m // 16) * -(-k // 64) * -(-max(1, n) // 8) * step_s, target)


# tc_sp24's sm_90a warpgroup kernel (tc_launch.mma_for: MMA auto from TC_WG_FROM_N columns on a
# compute-capability 9.0 GPU), measured on the H200 (session 27, chained, 2:4): 22.9 us on 11008x4096
# and 28.2 us on 4096x11008 at N = 64 (0.065-0.080 ns per tile x chunk x n8 tile), 38.1 us on
# 11008x4096 at N = 128 (0.054 ns); it runs N up to 128 as one block, reading A once.
# Session 28, fed by the copy engine (tc_sp24tma, the default where B allows): N = 64 21.6 / 26.6 /
# 13.4 us on 11008x4096 / 4096x11008 / 4096x4096 (0.061 / 0.076 / 0.102 ns), N = 128 28.9 / 34.6 /
# 16.8 us (0.041 / 0.049 / 0.064 ns). 0.061 keeps the ranking every one of those rows measured
# (ahead of cuBLAS at N = 32-64 on the large shapes, behind it at N = 128), a floor at N = 64.
TC_WG_TILE_STEP_S = 0.061e-9
TC_WG_N_BLOCK = 128
TC_WG_FROM_N = 32
TC_WG_CC = (9, 0)


def tc_sp24_uses_wgmma(n: int, target: Any) -> bool:
    """Whether tc_sp24 runs N = n on `target` through its warpgroup kernel (MMA auto)."""
    cc = getattr(target, "compute_capability", None)
    return cc is not None and tuple(cc) == TC_WG_CC and int(n) >= TC_WG_FROM_N


def h200_scaled(seconds: float, target: Any) -> float:
    """A decode floor measured on the H200, scaled to ``target`` by its bandwidth (an assumption:
    the decode kernels' instruction rate tracks the GPU generation's bandwidth); unscaled for None."""
    if target is None:
        return seconds
    return seconds * H200_BANDWIDTH_GBS / max(1.0, float(target.bandwidth_gbs()))


# ---- the estimate -----------------------------------------------------------------------------

def estimate(cost_terms, report: Any, n: int, dtype: Any, target: Any, params: dict) -> CostEstimate:
    """Roofline estimate at N = ``n`` on ``target`` of the instance whose (resolved) ``params``
    ``cost_terms(stats, n, dtype, target, params) -> CostTerms`` describes (a planning module's
    ``cost`` hook)."""
    from sparseditto.targets import get_target, roofline

    if not isinstance(n, numbers.Integral) or isinstance(n, bool) or n < 1:
        raise ValueError(f"Expected N to be a positive integer, got {n!r}.")
    dt = dtype_name(dtype)
    tgt = get_target(target)
    s = ReportStats(report)
    n = int(n)
    terms = cost_terms(s, n, dt, tgt, dict(params))
    vb = VALUE_BYTES[dt]
    b_bytes = float(s.k * n * vb) if terms.b_bytes is None else terms.b_bytes
    total = terms.a_bytes + b_bytes + float(s.m * n * vb) + terms.extra_bytes
    notes = list(terms.notes)
    roof = roofline(tgt, total, terms.flops, dtype=dt, unit=terms.unit, launch_s=terms.launches * LAUNCH_S)
    seconds, bound = roof.seconds, roof.bound
    if terms.decode_s > max(roof.memory_s, roof.compute_s):
        seconds, bound = terms.decode_s + terms.launches * LAUNCH_S, "decode"
        notes.append(f"decode floor {terms.decode_s * 1e6:.2f} us (measured) above the byte roofline")
    if terms.critical_bytes:
        per_program_bw = 2.0 * tgt.bandwidth_gbs() * 1e9 / tgt.sm_count
        critical = terms.critical_bytes / per_program_bw + terms.launches * LAUNCH_S
        if critical > seconds:
            seconds, bound = critical, "imbalance"
            notes.append(f"{terms.critical_what} bounds one program: {critical * 1e6:.2f} us")
    notes.append(f"{terms.launches} launch(es) on {tgt.name}")
    return CostEstimate(bytes=total, flops=terms.flops, memory_s=roof.memory_s, compute_s=roof.compute_s,
                        seconds=seconds, bound=bound, unit=terms.unit, notes="; ".join(notes),
                        a_bytes=float(terms.a_bytes))


def with_a_bytes(cost_terms, a_bytes: float):
    """``cost_terms`` with A's bytes replaced by ``a_bytes``: the template's model of a kernel that
    packs A its own way (an LLM's edit, measured from the tensors its prepare() returns)."""
    def terms(stats, n, dtype, target, params) -> CostTerms:
        base = cost_terms(stats, n, dtype, target, params)
        # A measured floor is a latency-bound stream's: with the same bytes in flight, its time
        # follows the bytes it streams, so a kernel that packs A smaller gets a proportionally lower one
        scale = float(a_bytes) / base.a_bytes if base.a_bytes > 0 else 1.0
        return replace(base, a_bytes=float(a_bytes), decode_s=base.decode_s * scale,
                       notes=list(base.notes) + [f"A: {a_bytes:.0f} bytes as the kernel packs it (measured)"])
    return terms


TC_N_BLOCK = 64   # columns of N one tensor-core launch covers (8 n8 tiles); wider N loops over blocks


def tc_n_blocks(n: int) -> int:
    """Blocks of TC_N_BLOCK columns a tensor-core template runs N as (each streams A once more)."""
    return -(-max(1, int(n)) // TC_N_BLOCK)


def tc_n8_tiles(n: int) -> int:
    """n8 tiles of one launch block at N columns (1 .. TC_N_BLOCK / 8): each adds its mma and B fragment
    loads to every 16x64 block a decoder feeds, which is why the decode floors grow with N past 16."""
    return -(-min(max(1, int(n)), TC_N_BLOCK) // 8)


def wide_n_floor(at_16: float, per_tile: float, n: int) -> float:
    """A tensor-core decoder's floor per unit of work at N columns: ``at_16`` up to two n8 tiles (N <= 16,
    where the floors were fitted), + ``per_tile`` for each further tile of the launch block."""
    return at_16 + max(0, tc_n8_tiles(n) - 2) * per_tile


def tc_flops(m: int, k: int, n: int) -> float:
    """Dense-equivalent mma flops of the tensor-core templates on their padded tiles (16-row tiles,
    64-column chunks, n8 tiles)."""
    return 2.0 * round_up(m, 16) * round_up(k, 64) * round_up(n, 8)


def scatter_step_padding(density: float) -> float:
    """Expected padding values of one tc_scatter step (256 elements, its count rounded up to a
    multiple of 8), its kept count binomial at `density`: ~3.5 on dense steps, up to ~7 on steps of
    one to three values (the mean alone undercounted 99%-sparse weights by 16%)."""
    d = min(max(float(density), 0.0), 1.0)
    if d in (0.0, 1.0):
        return 0.0
    pmf, total = (1.0 - d) ** SCATTER_STEP_HALVES, 0.0
    for c in range(SCATTER_STEP_HALVES):
        total += pmf * ((-c) % SCATTER_GROUP)
        pmf *= (SCATTER_STEP_HALVES - c) / (c + 1) * d / (1.0 - d)
    return total


def kept_words(m: int, k: int, nnz: int, unit: int = 1) -> float:
    """Expected tc_words units (`unit` 32-bit fragment words: 2 * unit neighbouring columns of one row)
    holding a kept value, padded as tc_words packs them, if the kept values sat at random:
    Mp*Kp/(2 unit) * (1 - (1-d)^(2 unit)). Patterns that keep neighbours together (2:4 pairs, blocks)
    keep fewer; the packed bytes are exact."""
    mp, kp = round_up(m, 16), round_up(k, 64)
    d = min(1.0, nnz / float(max(1, m * k)))
    return mp * kp / (2.0 * unit) * (1.0 - (1.0 - d) ** (2 * unit))


# tc_words' "auto" parameters, from the H200 sweep of session 34 (magnitude-pruned 4096x4096 and
# 11008x4096, N = 1 / 8 / 16, chained): two-register units win at 90% (11008x4096 17.5-21.0 us against
# 20.0-21.5 with one register; 4096x4096 10.1-11.0 against 10.9-11.7) and lose at 50-70% (70%:
# 27.1-29.6 against 23.0-24.7); 8 warps per CTA win on 11008x4096 (688 row tiles: 23.0-24.7 us at 70%
# against 24.7-27.7 with 4) and lose on 4096x4096 (256 tiles: 12.5-13.7 against 12.3-13.1).
WORDS_UNIT2_MAX_DENSITY = 0.15
WORDS_WIDE_TILES = 512
WORDS_TWO_ROWS_MAX_DENSITY = 0.35   # "auto" R: two row tiles per warp on the CTA stream at or below this density
# "auto" LOAD on narrower matrices: the CTA stream (4 warps, one tile each) from WORDS_NARROW_STREAM_TILES row tiles
# when K is at most WORDS_NARROW_STREAM_CHUNKS 64-column chunks. H200, session 38 (4096x4096, magnitude 50 / 70 /
# 90%, N = 8 / 16, chained): 12.6-13.4 / 11.4-12.4 / 9.7-10.9 us against the ring's 13.6-13.9 / 11.8-12.4 /
# 9.9-11.1 (2-7% at 50%, 1-3% at 70-90%); on 4096x11008 (172 chunks) 4-5% slower than the ring, so K bounds it
WORDS_NARROW_STREAM_TILES = 128
WORDS_NARROW_STREAM_CHUNKS = 64
BULK_UNIT_BLOBS = 4          # blobs per bulk copy of blob_stream_bulk (SD_UNIT in tc_stream.cu)
WORDS_RING_UNITS = 3         # tc_words LOAD="bulk": mean bulk copies a warp's ring holds ("auto" RING_KB)
WORDS_RING_MIN_KB = 4


def words_auto_params(params: dict, m: int, k: int, nnz: int) -> dict:
    """tc_words' params with "auto" UNIT (2 at density <= WORDS_UNIT2_MAX_DENSITY, else 1), WARPS (8 from
    WORDS_WIDE_TILES row tiles, else 4), LOAD ("group", the CTA stream, from WORDS_WIDE_TILES row tiles
    with one-register units, or from WORDS_NARROW_STREAM_TILES with K up to WORDS_NARROW_STREAM_CHUNKS chunks,
    else "ring"), R (2 row tiles per warp on the wide CTA stream of one-chunk stages at
    density <= WORDS_TWO_ROWS_MAX_DENSITY with one warp per tile, else 1) and RING_KB resolved for an m x k
    matrix of nnz kept values.
    H200, session 35 (two calls), 11008x4096 at N = 1 / 8 / 16, PIPE 2, fp16 and bf16: the CTA stream
    24.9-26.4 us against the ring's 28.0-29.1 at 50%, 21.6-23.2 against 22.4-23.4 at 70%, and 2-3% slower
    at 90% (two-register units: 17.8-21.2 against 17.3-20.5); on 4096x4096 (256 row tiles) level at 50%
    with 8 warps, 3-12% slower at 70-90%. R = 2, session 37 (11008x4096, N = 8 / 16, pushed epilogue):
    20.7 / 21.6 us against 21.6 / 22.6 at 70%, 26.0 / 30.5 against 25.6 / 25.2 at 50%."""
    out = dict(params)
    if out.get("UNIT", "auto") == "auto":
        out["UNIT"] = 2 if nnz <= WORDS_UNIT2_MAX_DENSITY * m * k else 1
    tiles, chunks = round_up(m, 16) // 16, round_up(k, 64) // 64
    wide = tiles >= WORDS_WIDE_TILES
    if out.get("WARPS", "auto") == "auto":
        out["WARPS"] = 8 if wide else 4
    narrow = not wide and tiles >= WORDS_NARROW_STREAM_TILES and chunks <= WORDS_NARROW_STREAM_CHUNKS
    if out.get("LOAD", "auto") == "auto":   # the stream-K schedule has the per-warp ring only
        cluster = out.get("SCHED", "cluster") == "cluster"
        stream = cluster and ((wide and int(out["UNIT"]) == 1) or narrow)
        two_rows = out.get("R", 1) == 2   # two row tiles per warp exist on the CTA stream only
        out["LOAD"] = "group" if stream or two_rows else "ring"
    if out.get("R", 1) == "auto":
        two = (wide and out["LOAD"] == "group" and int(out.get("STAGE_CHUNKS", 1)) == 1   # R 2 decodes one chunk
               and int(out.get("TILE_WARPS", 1)) == 1)                                   # per stage, one warp per tile
        out["R"] = 2 if two and nnz <= WORDS_TWO_ROWS_MAX_DENSITY * m * k else 1
    if out.get("RING_KB", "auto") == "auto":
        out["RING_KB"] = words_ring_kb(m, k, nnz, int(out["UNIT"]))
    return out


def words_ring_kb(m: int, k: int, nnz: int, unit: int = 1) -> int:
    """tc_words' bulk ring (LOAD="bulk") per warp: WORDS_RING_UNITS mean bulk copies of BULK_UNIT_BLOBS
    blobs, so a warp decoding one copy has the next ones in flight (the pack raises it to the largest
    copy: tc_launch.bulk_ring_floor_kb)."""
    tiles, chunks = round_up(m, 16) // 16, round_up(k, 64) // 64
    blob = words_bytes(m, k, nnz, unit) / max(1, tiles * chunks)
    return max(WORDS_RING_MIN_KB, math.ceil(WORDS_RING_UNITS * BULK_UNIT_BLOBS * blob / 1024))


def words_bytes(m: int, k: int, nnz: int, unit: int = 1) -> float:
    """tc_words' bytes of A: 4 * unit per kept unit, the blob headers (16 / unit masks and bases, to 16
    bytes) with their mean 8-byte padding, the offsets."""
    tiles, chunks = round_up(m, 16) // 16, round_up(k, 64) // 64
    head = words_header_bytes(unit)
    return float(4 * unit * kept_words(m, k, nnz, unit) + tiles * chunks * (head + 8) + tiles * (chunks + 1) * 4)


def tc_bytes(fmt: str, m: int, k: int, nnz: int, vb: int) -> float:
    """Bytes of A in the tensor-core streaming formats (sparseditto.tc_formats), padded as packed
    (rows to 16-row tiles, K to 64-column chunks); the bitmap's blob padding to 16 bytes is counted
    at its mean (8 bytes per blob)."""
    mp, kp = round_up(m, 16), round_up(k, 64)
    tiles, chunks = mp // 16, kp // 64
    if fmt == "tc_dense":
        return float(mp * kp * vb)
    if fmt == "tc_sp24":
        return float(mp * kp // 2 * vb + tiles * chunks * 128)
    if fmt == "tc_bitmap":
        return float(nnz * vb + tiles * chunks * (176 + 8) + tiles * (chunks + 1) * 4)
    if fmt == "tc_lanemask":
        return float(nnz * vb + tiles * chunks * (128 + 8) + tiles * (chunks + 1) * 4)
    if fmt == "tc_words":
        return words_bytes(m, k, nnz)
    if fmt == "tc_scatter":
        pads = tiles * chunks * 4 * scatter_step_padding(nnz / float(max(1, mp * kp)))
        return float((nnz + pads) * (vb + 1) + tiles * chunks * (16 + 4) + tiles * (chunks + 1) * 4)
    raise ValueError(f"Not a tensor-core streaming format: {fmt!r}.")




def delta_entries(stats: "ReportStats", bits: int) -> float:
    """Expected entries (nonzeros + fillers) of delta slices if a row's columns were spread at random:
    a gap wider than the field (2^bits - 1 columns) costs one filler per field width."""
    dmax = (1 << bits) - 1
    d = min(max(stats.row_mean / max(1, stats.k), 1e-9), 1.0)
    q = (1.0 - d) ** dmax
    return stats.nnz * (1.0 + q / max(1e-12, 1.0 - q))


# standard-normal quantiles at (i + 0.5) / 16, i = 0..15
_NORMAL_QUANTILES = (-1.863, -1.318, -1.010, -0.776, -0.579, -0.402, -0.237, -0.078,
                     0.078, 0.237, 0.402, 0.579, 0.776, 1.010, 1.318, 1.863)


def delta_slots(stats: "ReportStats", bits: int, lanes: int) -> float:
    """Slots (entries padded to whole 8-entry groups on each of a row's lanes): rows of one length
    (per-row magnitude pruning) pad to the next multiple of 8*L; rows that vary pad by half a run
    on average."""
    per_row = delta_entries(stats, bits) / max(1, stats.m)
    run = 8 * lanes
    if per_row <= 0:
        return 0.0
    if stats.row_cv < 1e-9:
        # every row has the same nonzeros; its fillers (a rare wide gap at moderate sparsity) are
        # few and Poisson-like, so most rows pad as if they had none: a ceil of the mean would pad
        # every row for a filler one row in sixteen has (4096-column 50% weights: 2048.06 entries)
        base = stats.nnz / max(1, stats.m)
        lam = max(0.0, per_row - base)
        none = math.exp(-lam)
        with_fillers = base + lam / max(1e-12, 1.0 - none)
        return stats.m * run * (none * math.ceil(base / run) + (1.0 - none) * math.ceil(with_fillers / run))
    # rows of varying length: the mean of ceil(len / run) * run over 16 quantiles of a normal law
    # with the report's coefficient of variation
    sd = stats.row_cv * per_row
    quantiles = [per_row + sd * _NORMAL_QUANTILES[i] for i in range(len(_NORMAL_QUANTILES))]
    return stats.m * sum(run * math.ceil(max(q, 0.0) / run) for q in quantiles) / len(quantiles)


def delta_packing(stats: "ReportStats", vb: int, lanes_param: Any = "auto",
                  min_lanes: int = 1) -> tuple[float, int, int, float]:
    """(A bytes, delta bits, lanes, slots) of the packing delta_format picks, estimated from the
    report: the best packing_score over the delta widths; "auto" lanes are the most within
    LANE_WASTE of the least padding and at least ``min_lanes`` (its `lanes_to_fill`), else
    ``lanes_param`` itself."""
    best = None
    for bits in (4, 8):
        by_lanes = {lanes: delta_slots(stats, bits, lanes) for lanes in DELTA_LANES}
        least = min(by_lanes.values())
        if lanes_param in (None, "auto"):
            lanes = max(min_lanes, next(ln for ln in DELTA_LANES if by_lanes[ln] <= DELTA_LANE_WASTE * least))
        else:
            lanes = int(lanes_param)
        nbytes = by_lanes[lanes] * (vb + bits / 8.0) + stats.m * lanes * 4 + (stats.m + 1) * 4
        score = delta_packing_score(by_lanes[lanes], bits, vb)
        if best is None or score < best[0]:
            best = (score, nbytes, bits, lanes, by_lanes[lanes])
    return best[1:]


def format_bytes(fmt: str, report: Any, dtype: Any = "float16", params: dict | None = None) -> float:
    """Bytes of A alone in `fmt` (no B, no C), from the report: the formula table above."""
    fmt, vb, s, params = format_name(fmt), VALUE_BYTES[dtype_name(dtype)], ReportStats(report), dict(params or {})
    if fmt == "csr":
        return csr_bytes(s.m, s.nnz, vb, csr_index_bytes(s, params))
    if fmt == "bsr":
        bm, bk = block_shape(s, params)
        return bsr_bytes(s.m, s.nonzero_blocks(bm, bk)[0], bm, bk, vb)
    if fmt == "nm":
        nk, mg = nm_ratio(params, s)
        return nm_bytes(s.m, s.k, nk, mg, vb)
    if fmt == "bitmap":
        return bitmap_bytes(s.m, s.k, s.nnz, vb, int(param(params, "TILE_K", "tile_k", default=32)),
                            tile_offsets=params.get("OFFSETS", "stored") != "running")
    if fmt in ("tc_dense", "tc_sp24", "tc_words", "tc_bitmap", "tc_lanemask", "tc_scatter"):
        return tc_bytes(fmt, s.m, s.k, s.nnz, vb)
    if fmt == "delta_slices":
        return delta_packing(s, vb)[0]
    if fmt == "ell":
        return ell_bytes(s.m, int(math.ceil(s.row_max)), vb)
    if fmt == "compact":
        return compact_bytes(s.m - s.empty_rows, s.k - s.empty_cols, vb)
    if fmt == "dense":
        return dense_bytes(s.m, s.k, vb)
    raise ValueError(f"format_bytes has no exact formula for {fmt!r}; use estimate().")
