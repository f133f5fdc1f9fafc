"""Test inputs, fp64 references and the tolerance rule shared by verification and benchmarking.

Tolerance (elementwise, for output entry (i, j))::

    |C_ij - R_ij| <= atol + rtol_i * (|A| @ |B|)_ij
    rtol_i = rtol_dtype + 4 * sqrt(k_i) * 2^-24

``R`` is the fp64 product of the *dtype-rounded* A and B the kernel actually received; ``k_i`` is the
number of nonzeros in row i. ``rtol_dtype`` covers rounding the fp32 accumulator to the output dtype
(4 units of roundoff for halves: 2^-9 for float16, 2^-6 for bfloat16; 1e-4 for float32, which
admits any fp32 summation order but not TF32 inputs, matching torch.matmul's fp32 default; 1e-10 for
float64). The sqrt(k) term is the typical growth of fp32 accumulation error with the row length.
Scaling by ``|A| @ |B|`` (not |C|) keeps the bound meaningful under cancellation, and ``atol`` is
tiny so an empty row must come out as exact zeros.

Values are chosen so a lazy kernel cannot hide: A's nonzeros are ±U(0.5, 1.5)/sqrt(k_i) (every row's
output is O(1), never tiny next to atol), drawn fresh from the seed for every check, never the
matrix's stored values alone. B comes from one of `DISTRIBUTIONS` (uniform, normal times a large
scale, heavy-tailed, all above 1, tiny), scaled down where needed so that no output can come near
the float16 limit (|C| <= `SAFE_OUTPUT`, far below 65504).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

DTYPE_NAMES = ("float16", "bfloat16", "float32", "float64")
RTOL = {"float16": 2.0 ** -9, "bfloat16": 2.0 ** -6, "float32": 1e-4, "float64": 1e-10}
ATOL = {"float16": 1e-6, "bfloat16": 1e-6, "float32": 1e-9, "float64": 1e-15}
ACC_UNIT = {"float16": 2.0 ** -24, "bfloat16": 2.0 ** -24, "float32": 2.0 ** -24, "float64": 2.0 ** -53}
ACC_FACTOR = 4.0
SCALED_CHECK_FACTOR = 2.0 ** -6


def check_dtype(dtype: str) -> str:
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"Unsupported dtype {dtype!r}; expected one of {DTYPE_NAMES}.")
    return dtype


def torch_dtype(dtype: str):
    import torch

    return {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
            "float64": torch.float64}[check_dtype(dtype)]


def round_to_dtype(values: np.ndarray, dtype: str) -> np.ndarray:
    """Round float64 values to ``dtype`` and back, so the reference sees what the kernel sees."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64)).to(torch_dtype(dtype)).to(
        torch.float64).numpy()


def draw_matrix_values(matrix, rng: np.random.Generator, dtype: str) -> np.ndarray:
    """Fresh nonzero values on ``matrix``'s pattern: ±U(0.5, 1.5)/sqrt(row length), dtype-rounded."""
    lengths = matrix.row_lengths()
    per_row = 1.0 / np.sqrt(np.maximum(lengths, 1).astype(np.float64))
    values = rng.uniform(0.5, 1.5, matrix.nnz)
    negative = rng.random(matrix.nnz) < 0.5                  # the same draws as ever: seeds reproduce
    values *= np.repeat(per_row, lengths)
    # in place (22M values on an LLM weight); the values are positive, so this is copysign's result
    # without its float copy of the mask (2.1 -> 0.2 s for 22M on the CPU machine)
    np.negative(values, out=values, where=negative)
    return round_to_dtype(values, dtype)


def draw_dense(rng: np.random.Generator, shape: tuple[int, int], dtype: str, scale: float = 1.0) -> np.ndarray:
    return round_to_dtype(rng.uniform(-1.0, 1.0, shape) * scale, dtype)


#: B distributions verification rotates through (a kernel correct only for |B| <= 1, or only for
#: positive inputs, or only for values near the verifier's usual ones, fails one of them).
DISTRIBUTIONS = ("uniform", "normal_scaled", "heavy_tailed", "above_one", "tiny")
SAFE_OUTPUT = 2.0 ** 13


def draw_b(rng: np.random.Generator, shape: tuple[int, int], dtype: str, dist: str, matrix=None) -> np.ndarray:
    """B values from ``dist``, rounded to ``dtype``; bounded so |A| @ |B| <= `SAFE_OUTPUT` for A
    drawn by `draw_matrix_values` (|a_ij| <= 1.5 / sqrt(k_i), so a row sums to <= 1.5 sqrt(k_i))."""
    if dist == "uniform":
        values = rng.uniform(-1.0, 1.0, shape)
    elif dist == "normal_scaled":
        values = rng.standard_normal(shape) * float(rng.choice([8.0, 64.0, 512.0]))
    elif dist == "heavy_tailed":
        values = np.clip(rng.standard_t(1.5, shape), -1e4, 1e4)
    elif dist == "above_one":
        values = rng.uniform(1.0, 16.0, shape)
    elif dist == "tiny":
        values = rng.uniform(-1.0, 1.0, shape) * 2.0 ** -6
    else:
        raise ValueError(f"Unknown B distribution {dist!r}; expected one of {DISTRIBUTIONS}.")
    peak = float(np.max(np.abs(values))) if values.size else 0.0
    kmax = float(matrix.row_lengths().max()) if matrix is not None and matrix.nnz else 1.0
    bound = 1.5 * np.sqrt(max(kmax, 1.0)) * peak
    if bound > SAFE_OUTPUT:
        values = values * (SAFE_OUTPUT / bound)
    return round_to_dtype(values, dtype)


def with_values(matrix, values64: np.ndarray, dtype: str):
    """The same pattern carrying new values and the dtype name the kernel is asked to use."""
    from sparseditto.matrix import SparseMatrix

    store = np.float64 if dtype == "float64" else np.float32
    return SparseMatrix(matrix.indptr, matrix.indices, values64.astype(store), tuple(matrix.shape),
                        dtype, matrix.name, dict(matrix.meta))


# fp64 products on the GPU when one is there and the densified operands fit comfortably: scipy's
# single-threaded CSR @ dense takes tens of seconds at 4096x4096, N=2048 (several per candidate),
# while an fp64 GEMM on the GPU takes milliseconds. Both are exact fp64 products of the same inputs.
GPU_REFERENCE_MAX_BYTES = 4 << 30


_FLAT_POSITIONS: list = []   # [(matrix, its row * k + col positions)]: the last matrix's, held strongly
_NARROW_VALUES: list = []    # [(values64, the narrowest float array holding them exactly)]: the last ones


def _kept_for_last(cache: list, key, make):
    """``make()`` for ``key``, kept for the last key only (held strongly, so ``is`` cannot see a recycled id)."""
    if cache and cache[0][0] is key:
        return cache[0][1]
    value = make()
    cache[:] = [(key, value)]
    return value


def _flat_positions(matrix) -> np.ndarray:
    """Row-major positions (row * k + col: int32 where every one fits, else int64) of ``matrix``'s
    entries, kept for the last matrix.

    A verification computes 9 references of one pattern (two calls at each of 4 N values, two more
    at the first), a benchmark up to 4 more: building the positions was the host side's largest
    part on an LLM-sized weight (22M entries). Host memory (pageable) only: device memory is where a candidate's kernel writes,
    so nothing of a reference lives there while candidate code runs (module doc of verify)."""
    def make() -> np.ndarray:
        m, k = (int(s) for s in matrix.shape)
        # int32 where every position fits (always on the GPU path: its dense fp64 A stays under
        # GPU_REFERENCE_MAX_BYTES): half the bytes of each host-to-device copy (as _narrow_values does for values)
        it = np.int32 if m * k < 2 ** 31 else np.int64
        flat = matrix.row_ids().astype(it) * it(k)
        flat += matrix.indices.astype(it, copy=False)
        return flat
    return _kept_for_last(_FLAT_POSITIONS, matrix, make)


def _narrow_values(values64: np.ndarray) -> np.ndarray:
    """``values64`` as float32 when that holds every value exactly (a kernel's fp16 / bf16 / fp32
    values always are), else as they are: half the bytes to copy to the GPU, widened there exactly.
    Kept for the last array: a verification's references share one value draw per prepare."""
    def make() -> np.ndarray:
        v64 = np.ascontiguousarray(values64, dtype=np.float64)
        v32 = v64.astype(np.float32)
        return v32 if np.array_equal(v32, v64) else v64
    return _kept_for_last(_NARROW_VALUES, values64, make)


def _products_fp64(matrix, values64: np.ndarray, b64: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A @ B and |A| @ |B| in float64."""
    m, k = matrix.shape
    n = b64.shape[1]
    gpu_bytes = 8 * (2 * m * k + 2 * k * n + 2 * m * n)
    if gpu_bytes <= GPU_REFERENCE_MAX_BYTES:
        try:
            import torch

            use_gpu = torch.cuda.is_available()
        except ImportError:
            use_gpu = False
        if use_gpu:
            from . import gpu_lock

            with gpu_lock.shared_section():   # never during another process's timing (gpu_lock)
                a = torch.zeros(m * k, dtype=torch.float64, device="cuda")
                # narrow over PCIe, widened on the GPU (exactly: int32 -> int64, float32 -> float64)
                a[torch.from_numpy(_flat_positions(matrix)).cuda().long()] = torch.from_numpy(
                    _narrow_values(values64)).cuda().double()
                a = a.view(m, k)
                b = torch.from_numpy(np.ascontiguousarray(b64, dtype=np.float64)).cuda()
                value = (a @ b).cpu().numpy()
                bound = (a.abs_() @ b.abs_()).cpu().numpy()
                del a, b
            return value, bound
    a = sp.csr_array((values64, matrix.indices, matrix.indptr), shape=(m, k))
    value = np.asarray(a @ b64, dtype=np.float64)
    a_abs = sp.csr_array((np.abs(values64), matrix.indices, matrix.indptr), shape=(m, k))
    bound = np.asarray(a_abs @ np.abs(b64), dtype=np.float64)
    return value, bound


@dataclass
class Reference:
    """fp64 product, its magnitude bound |A| @ |B|, and the elementwise tolerance."""

    value: np.ndarray
    bound: np.ndarray
    tol: np.ndarray
    rtol: float

    def columns(self, start: int, stop: int) -> "Reference":
        """The reference of B's columns start:stop (one product of several B's side by side serves
        each of them: a benchmark's sampled launches are checked with one product, not one each)."""
        return Reference(value=self.value[:, start:stop], bound=self.bound[:, start:stop],
                         tol=self.tol[:, start:stop], rtol=self.rtol)

    @classmethod
    def compute(cls, matrix, values64: np.ndarray, b64: np.ndarray, dtype: str) -> "Reference":
        value, bound = _products_fp64(matrix, values64, b64)
        k = matrix.row_lengths().astype(np.float64)
        rtol_rows = RTOL[dtype] + ACC_FACTOR * np.sqrt(k) * ACC_UNIT[dtype]
        tol = ATOL[dtype] + rtol_rows[:, None] * bound
        return cls(value=value, bound=bound, tol=tol, rtol=RTOL[dtype])


@dataclass
class Comparison:
    ok: bool
    rel_err: float
    max_abs_err: float
    tol_ratio: float
    n_bad: int
    message: str
    nonfinite: int = 0


def compare(got: np.ndarray, expected: np.ndarray, ref: Reference, what: str = "output") -> Comparison:
    """Elementwise check of ``got`` against ``expected`` with ``ref``'s tolerance; explains failures."""
    got = np.asarray(got, dtype=np.float64)
    if got.shape != expected.shape:
        return Comparison(False, float("inf"), float("inf"), float("inf"), got.size,
                          f"{what} has shape {got.shape}, expected {expected.shape}")
    finite = np.isfinite(got)
    nonfinite = int((~finite).sum())
    err = np.where(finite, np.abs(got - expected), np.inf)
    ratio = err / ref.tol
    bad = ratio > 1.0
    n_bad = int(bad.sum())
    scale = float(np.max(np.abs(expected))) if expected.size else 0.0
    max_abs = float(err.max()) if err.size else 0.0
    rel = max_abs / scale if scale > 0 else max_abs
    worst = float(ratio.max()) if ratio.size else 0.0
    if n_bad == 0:
        return Comparison(True, rel, max_abs, worst, 0, "", nonfinite)
    i, j = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    msg = (f"{n_bad} of {got.size} {what} entries outside tolerance; worst at ({i}, {j}): got "
           f"{got[i, j]:.6g}, expected {expected[i, j]:.6g} (tol {ref.tol[i, j]:.3g})")
    if nonfinite:
        msg += f"; {nonfinite} entries are NaN/Inf"
    msg += "; " + describe_locations(bad)
    if np.all(got[finite] == 0) and np.any(expected != 0):
        msg += "; the output is all zeros"
    return Comparison(False, rel, max_abs, worst, n_bad, msg, nonfinite)


def describe_locations(mask: np.ndarray) -> str:
    """Where the bad entries are: rows/columns involved, with hints the debugger can act on."""
    rows = np.flatnonzero(mask.any(axis=1))
    cols = np.flatnonzero(mask.any(axis=0))
    m, n = mask.shape
    parts = [f"rows affected: {len(rows)}/{m} ({_preview(rows)})",
             f"columns affected: {len(cols)}/{n} ({_preview(cols)})"]
    if len(cols) and len(cols) < n and cols.min() > 0 and np.array_equal(cols, np.arange(cols.min(), n)):
        parts.append(f"only the trailing columns {cols.min()}..{n - 1} are wrong (N-tail masking?)")
    if len(rows) and len(rows) < m and np.array_equal(rows, np.arange(rows.min(), m)):
        parts.append(f"only the trailing rows {rows.min()}..{m - 1} are wrong (grid too small?)")
    return "; ".join(parts)


def _preview(idx: np.ndarray, limit: int = 8) -> str:
    shown = ", ".join(str(int(v)) for v in idx[:limit])
    return shown + (", ..." if len(idx) > limit else "")
