"""Seeded synthetic sparse matrices, one generator per pattern class the analyzer knows.

Why this exists: the analyzer's classifier, the kernel templates and the benchmarks all need
matrices whose *true* pattern is known, at any size, reproducibly. Every generator

* is deterministic for a given ``seed`` (``numpy.random.default_rng(seed)``),
* is vectorized (masks are built a chunk of rows at a time, so a 4096 x 11008 matrix never needs
  more than a few tens of MB of temporaries),
* returns a canonical :class:`~sparseditto.matrix.SparseMatrix` whose values are standard-normal
  draws (rounded to the requested ``dtype`` so a float16 kernel sees exactly these values) and
  whose ``name`` says what was generated, and whose ``meta["generator"]`` records the call.

Pattern classes (the names the analyzer reports):

==================  ==========================================================================
``unstructured``    every entry kept independently with probability ``1 - sparsity``
``block``           a random subset of ``bm x bk`` blocks kept, entries inside a kept block kept
                    with probability ``occupancy``
``nm``              exactly ``n`` of every ``m_group`` consecutive entries along rows or columns,
                    plus an optional fraction of groups with one extra nonzero (violations)
``row_pruned``      whole rows zero, kept rows Bernoulli(``density``) (``column_pruned`` likewise)
``magnitude``       how LLM weights are pruned: dense Gaussian weights, the largest ``|w|`` kept
                    (``magnitude_pruned``: the top fraction of each row, so every row holds the
                    same nnz, as Wanda/SparseGPT-style per-output pruning leaves it;
                    ``nm_magnitude_pruned``: the ``n`` largest of each group of ``m`` along K)
``banded``          entries with ``|i - j| <= bandwidth`` (diagonal always kept, the rest with
                    probability ``fill``); ``laplacian_2d`` / ``laplacian_3d`` are the 5- and
                    7-point finite-difference stencils
``power_law``       R-MAT / Kronecker graph (``rmat``), heavy-tailed row and column degrees
``dense``           (nearly) every entry present
==================  ==========================================================================
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from sparseditto.matrix import VALUE_DTYPES, SparseMatrix

__all__ = [
    "GENERATORS",
    "banded",
    "block_sparse",
    "column_pruned",
    "dense",
    "laplacian_2d",
    "laplacian_3d",
    "magnitude_pruned",
    "make",
    "nm_magnitude_pruned",
    "nm_sparse",
    "rmat",
    "row_pruned",
    "unstructured",
]

# Cells of the dense boolean mask built per chunk of rows (bounds generator memory at ~4 MB + the
# float32 random draws, ~16 MB, whatever the matrix size).
_CHUNK_CELLS = 1 << 22


# ---- validation helpers ---------------------------------------------------------------------
def _check_dim(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) <= 0:
        raise ValueError(f"Expected {name} to be a positive integer, got {value!r}.")
    return int(value)


def _check_fraction(name: str, value, *, low: float = 0.0, high: float = 1.0,
                    low_open: bool = False) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"Expected {name} to be a number in [{low}, {high}], got {value!r}.") from None
    if not (low < value <= high if low_open else low <= value <= high) or math.isnan(value):
        bracket = "(" if low_open else "["
        raise ValueError(f"Expected {name} in {bracket}{low}, {high}], got {value}.")
    return value


def _check_dtype(dtype: str) -> str:
    if dtype not in VALUE_DTYPES:
        raise ValueError(f"Unsupported value dtype '{dtype}'; expected one of {VALUE_DTYPES}.")
    return dtype


# ---- assembly helpers -----------------------------------------------------------------------
def _values(rng: np.random.Generator, count: int, dtype: str) -> np.ndarray:
    """Standard-normal values, rounded to ``dtype`` so kernels in that dtype see them exactly."""
    return _rounded(rng.standard_normal(count, dtype=np.float64 if dtype == "float64" else np.float32), dtype)


def _rounded(vals: np.ndarray, dtype: str) -> np.ndarray:
    """``vals`` (float32, or float64 for dtype float64) rounded to ``dtype`` and stored as float32/64."""
    vals = np.ascontiguousarray(vals, dtype=np.float64 if dtype == "float64" else np.float32)
    if dtype == "float16":
        vals = vals.astype(np.float16).astype(np.float32)
    elif dtype == "bfloat16":
        # Round-to-nearest-even on the top 16 bits of the float32 pattern.
        bits = vals.view(np.uint32)
        bits = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
        vals = bits.view(np.float32)
    return vals


def _assemble(indptr: np.ndarray, indices: np.ndarray, shape: tuple[int, int], rng: np.random.Generator,
              dtype: str, name: str, meta: dict) -> SparseMatrix:
    return SparseMatrix(
        indptr=np.ascontiguousarray(indptr, dtype=np.int64),
        indices=np.ascontiguousarray(indices, dtype=np.int32),
        data=_values(rng, int(indices.shape[0]), dtype),
        shape=(int(shape[0]), int(shape[1])),
        dtype=dtype,
        name=name,
        meta={"generator": meta},
    )


def _from_row_chunks(m: int, k: int, chunk_mask: Callable[[int, int], np.ndarray], *, align: int = 1):
    """Build CSR structure from a function returning the boolean mask of rows ``[r0, r1)``.

    Chunks start at multiples of ``align`` so that generators with row groups (blocks, column
    N:M groups) can draw whole groups per chunk. ``np.nonzero`` yields row-major order, so the
    result is already canonical (sorted, unique) CSR.
    """
    rows_per_chunk = max(align, (_CHUNK_CELLS // max(k, 1)) // align * align)
    counts = np.zeros(m, dtype=np.int64)
    parts = []
    for r0 in range(0, m, rows_per_chunk):
        r1 = min(m, r0 + rows_per_chunk)
        mask = chunk_mask(r0, r1)
        counts[r0:r1] = np.count_nonzero(mask, axis=1)
        parts.append(np.nonzero(mask)[1].astype(np.int32))
    indptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    indices = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
    return indptr, indices


def _from_coo(rows: np.ndarray, cols: np.ndarray, m: int, k: int):
    """Canonical CSR structure from coordinates (duplicates merged, columns sorted per row).

    Sort + adjacent dedupe rather than ``np.unique``: numpy 2.x's hash-based unique is ~15x
    slower on millions of int64 keys.
    """
    keys = np.sort(rows.astype(np.int64) * k + cols.astype(np.int64))
    if keys.size:
        keys = keys[np.r_[True, keys[1:] != keys[:-1]]]
    rows = keys // k
    indptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=m), out=indptr[1:])
    return indptr, (keys - rows * k).astype(np.int32)


# ---- generators ---------------------------------------------------------------------------
def unstructured(m: int, k: int, sparsity: float, seed: int = 0, *, dtype: str = "float32") -> SparseMatrix:
    """Each entry kept independently with probability ``1 - sparsity`` (magnitude-free random pruning)."""
    m, k = _check_dim("m", m), _check_dim("k", k)
    sparsity = _check_fraction("sparsity", sparsity)
    _check_dtype(dtype)
    rng = np.random.default_rng(seed)
    keep = 1.0 - sparsity
    indptr, indices = _from_row_chunks(m, k, lambda r0, r1: rng.random((r1 - r0, k), dtype=np.float32) < keep)
    return _assemble(indptr, indices, (m, k), rng, dtype, f"unstructured_{m}x{k}_s{sparsity:.3g}_seed{seed}",
                     {"kind": "unstructured", "m": m, "k": k, "sparsity": sparsity, "seed": seed})


def dense(m: int, k: int, sparsity: float = 0.0, seed: int = 0, *, dtype: str = "float32") -> SparseMatrix:
    """A (nearly) dense matrix: each entry is a zero with probability ``sparsity`` (default none)."""
    m, k = _check_dim("m", m), _check_dim("k", k)
    sparsity = _check_fraction("sparsity", sparsity)
    _check_dtype(dtype)
    rng = np.random.default_rng(seed)
    if sparsity == 0.0:
        indptr = np.arange(0, (m + 1) * k, k, dtype=np.int64)
        indices = np.tile(np.arange(k, dtype=np.int32), m)
    else:
        keep = 1.0 - sparsity
        indptr, indices = _from_row_chunks(m, k, lambda r0, r1: rng.random((r1 - r0, k), dtype=np.float32) < keep)
    return _assemble(indptr, indices, (m, k), rng, dtype, f"dense_{m}x{k}_s{sparsity:.3g}_seed{seed}",
                     {"kind": "dense", "m": m, "k": k, "sparsity": sparsity, "seed": seed})


def block_sparse(m: int, k: int, block: tuple[int, int] = (16, 16), block_density: float = 0.25,
                 occupancy: float = 1.0, seed: int = 0, *, dtype: str = "float32") -> SparseMatrix:
    """Block sparsity: ``round(block_density * n_blocks)`` (at least one) blocks of ``bm x bk`` kept.

    Blocks are chosen uniformly without replacement on the ``ceil(m/bm) x ceil(k/bk)`` grid (edge
    blocks are clipped to the matrix); inside a kept block each entry is nonzero with probability
    ``occupancy`` (1.0 = full blocks, as block-pruned weights are).
    """
    m, k = _check_dim("m", m), _check_dim("k", k)
    if not (isinstance(block, (tuple, list)) and len(block) == 2):
        raise ValueError(f"Expected block=(bm, bk), got {block!r}.")
    bm, bk = _check_dim("block rows bm", block[0]), _check_dim("block cols bk", block[1])
    block_density = _check_fraction("block_density", block_density, low_open=True)
    occupancy = _check_fraction("occupancy", occupancy, low_open=True)
    _check_dtype(dtype)
    rng = np.random.default_rng(seed)
    gm, gk = -(-m // bm), -(-k // bk)
    n_keep = max(1, int(round(block_density * gm * gk)))
    kept = np.zeros(gm * gk, dtype=bool)
    kept[rng.choice(gm * gk, size=n_keep, replace=False)] = True
    kept = kept.reshape(gm, gk)
    col_block = np.arange(k) // bk

    def chunk(r0: int, r1: int) -> np.ndarray:
        mask = kept[np.arange(r0, r1) // bm][:, col_block]
        if occupancy < 1.0:
            mask &= rng.random((r1 - r0, k), dtype=np.float32) < occupancy
        return mask

    indptr, indices = _from_row_chunks(m, k, chunk, align=bm)
    return _assemble(indptr, indices, (m, k), rng, dtype,
                     f"block{bm}x{bk}_{m}x{k}_bd{block_density:.3g}_occ{occupancy:.3g}_seed{seed}",
                     {"kind": "block", "m": m, "k": k, "block": [bm, bk], "block_density": block_density,
                      "occupancy": occupancy, "seed": seed})


def _nm_group_mask(rng: np.random.Generator, shape: tuple[int, ...], n: int, m_group: int,
                   violations: float) -> np.ndarray:
    """Mask of shape ``shape + (m_group,)`` with exactly n ones per group (n + 1 in violating groups).

    A uniformly random order of each group comes from ranking random keys; the first n positions
    in that order are kept and, in a violating group, the (n+1)-th as well.
    """
    keys = rng.random(shape + (m_group,), dtype=np.float32)
    rank = np.argsort(np.argsort(keys, axis=-1), axis=-1)
    mask = rank < n
    if violations > 0.0 and n < m_group:
        extra = rng.random(shape + (1,), dtype=np.float32) < violations
        mask |= extra & (rank == n)
    return mask


def nm_sparse(m: int, k: int, n: int = 2, m_group: int = 4, axis: str = "row", violations: float = 0.0,
              seed: int = 0, *, dtype: str = "float32") -> SparseMatrix:
    """N:M structured sparsity: exactly ``n`` nonzeros in every ``m_group`` consecutive entries.

    ``axis="row"`` groups run along each row (the K direction, as NVIDIA's 2:4 sparse tensor cores
    need for A in ``A @ B``); ``axis="col"`` groups run down each column. Positions inside a group
    are uniform. ``violations`` is the probability that a group gets one extra nonzero (a weight
    pruned almost-but-not-quite to N:M). A partial tail group (``k % m_group`` entries) is cut
    from a full group, so it holds at most ``n`` (+1) nonzeros.
    """
    m, k = _check_dim("m", m), _check_dim("k", k)
    n, m_group = _check_dim("n", n), _check_dim("m_group", m_group)
    if n > m_group:
        raise ValueError(f"Expected n <= m_group for N:M sparsity, got n={n}, m_group={m_group}.")
    if axis not in ("row", "col"):
        raise ValueError(f"Expected axis 'row' or 'col', got {axis!r}.")
    violations = _check_fraction("violations", violations)
    _check_dtype(dtype)
    rng = np.random.default_rng(seed)
    if axis == "row":
        groups_per_row = -(-k // m_group)

        def chunk(r0: int, r1: int) -> np.ndarray:
            g = _nm_group_mask(rng, (r1 - r0, groups_per_row), n, m_group, violations)  # [rows, G, m_group]
            return g.reshape(r1 - r0, groups_per_row * m_group)[:, :k]

        indptr, indices = _from_row_chunks(m, k, chunk)
    else:
        def chunk(r0: int, r1: int) -> np.ndarray:
            groups = -(-(r1 - r0) // m_group)
            g = _nm_group_mask(rng, (groups, k), n, m_group, violations)             # [G, k, m_group]
            return g.transpose(0, 2, 1).reshape(groups * m_group, k)[: r1 - r0]

        indptr, indices = _from_row_chunks(m, k, chunk, align=m_group)
    return _assemble(indptr, indices, (m, k), rng, dtype,
                     f"nm{n}of{m_group}_{axis}_{m}x{k}_viol{violations:.3g}_seed{seed}",
                     {"kind": "nm", "m": m, "k": k, "n": n, "m_group": m_group, "axis": axis,
                      "violations": violations, "seed": seed})


def row_pruned(m: int, k: int, prune_fraction: float, density: float = 1.0, seed: int = 0, *,
               dtype: str = "float32") -> SparseMatrix:
    """``round(prune_fraction * m)`` random rows entirely zero; kept rows Bernoulli(``density``).

    This is what structured (output-channel / neuron) pruning leaves in a weight.
    """
    m, k = _check_dim("m", m), _check_dim("k", k)
    prune_fraction = _check_fraction("prune_fraction", prune_fraction)
    density = _check_fraction("density", density, low_open=True)
    _check_dtype(dtype)
    rng = np.random.default_rng(seed)
    kept = np.ones(m, dtype=bool)
    kept[rng.choice(m, size=int(round(prune_fraction * m)), replace=False)] = False

    def chunk(r0: int, r1: int) -> np.ndarray:
        mask = np.repeat(kept[r0:r1, None], k, axis=1)
        if density < 1.0:
            mask &= rng.random((r1 - r0, k), dtype=np.float32) < density
        return mask

    indptr, indices = _from_row_chunks(m, k, chunk)
    return _assemble(indptr, indices, (m, k), rng, dtype,
                     f"row_pruned_{m}x{k}_p{prune_fraction:.3g}_d{density:.3g}_seed{seed}",
                     {"kind": "row_pruned", "m": m, "k": k, "prune_fraction": prune_fraction,
                      "density": density, "seed": seed, "kept_rows": int(kept.sum())})


def column_pruned(m: int, k: int, prune_fraction: float, density: float = 1.0, seed: int = 0, *,
                  dtype: str = "float32") -> SparseMatrix:
    """``round(prune_fraction * k)`` random columns entirely zero; kept columns Bernoulli(``density``).

    This is what input-channel pruning leaves in a weight (the matching rows of B are never read).
    """
    m, k = _check_dim("m", m), _check_dim("k", k)
    prune_fraction = _check_fraction("prune_fraction", prune_fraction)
    density = _check_fraction("density", density, low_open=True)
    _check_dtype(dtype)
    rng = np.random.default_rng(seed)
    kept = np.ones(k, dtype=bool)
    kept[rng.choice(k, size=int(round(prune_fraction * k)), replace=False)] = False

    def chunk(r0: int, r1: int) -> np.ndarray:
        mask = np.repeat(kept[None, :], r1 - r0, axis=0)
        if density < 1.0:
            mask &= rng.random((r1 - r0, k), dtype=np.float32) < density
        return mask

    indptr, indices = _from_row_chunks(m, k, chunk)
    return _assemble(indptr, indices, (m, k), rng, dtype,
                     f"column_pruned_{m}x{k}_p{prune_fraction:.3g}_d{density:.3g}_seed{seed}",
                     {"kind": "column_pruned", "m": m, "k": k, "prune_fraction": prune_fraction,
                      "density": density, "seed": seed, "kept_cols": int(kept.sum())})


def _magnitude_pruned(m: int, k: int, rng: np.random.Generator, keep_mask: Callable[[np.ndarray], np.ndarray],
                      dtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR (indptr, indices, values) of Gaussian weights drawn a chunk of rows at a time and
    pruned by ``keep_mask(|W chunk|) -> bool mask``; the kept values are the weights themselves."""
    rows_per_chunk = max(1, _CHUNK_CELLS // max(k, 1))
    counts = np.zeros(m, dtype=np.int64)
    cols, vals = [], []
    for r0 in range(0, m, rows_per_chunk):
        r1 = min(m, r0 + rows_per_chunk)
        w = rng.standard_normal((r1 - r0, k), dtype=np.float32)
        mask = keep_mask(np.abs(w))
        counts[r0:r1] = np.count_nonzero(mask, axis=1)
        cols.append(np.nonzero(mask)[1].astype(np.int32))
        vals.append(w[mask])
    indptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return indptr, np.concatenate(cols), _rounded(np.concatenate(vals), dtype)


def magnitude_pruned(m: int, k: int, sparsity: float, seed: int = 0, *, dtype: str = "float32") -> SparseMatrix:
    """Per-row magnitude pruning of dense Gaussian weights: each row keeps its ``round((1 - sparsity) * k)``
    largest ``|w|`` (ties broken by position), so every row holds the same nnz.

    This is the pattern Wanda / SparseGPT-style unstructured LLM pruning leaves (one comparison
    group per output row), unlike `unstructured`, whose row lengths are binomial.
    """
    m, k = _check_dim("m", m), _check_dim("k", k)
    sparsity = _check_fraction("sparsity", sparsity)
    _check_dtype(dtype)
    rng = np.random.default_rng(seed)
    keep = k - int(round(sparsity * k))

    def keep_mask(mag: np.ndarray) -> np.ndarray:
        mask = np.zeros(mag.shape, dtype=bool)
        if keep >= k:
            mask[:] = True
        elif keep > 0:
            top = np.argpartition(-mag, keep - 1, axis=1)[:, :keep]
            np.put_along_axis(mask, top, True, axis=1)
        return mask

    indptr, indices, values = _magnitude_pruned(m, k, rng, keep_mask, dtype)
    return SparseMatrix(indptr=indptr, indices=indices, data=values, shape=(m, k), dtype=dtype,
                        name=f"magnitude_pruned_{m}x{k}_s{sparsity:.3g}_seed{seed}",
                        meta={"generator": {"kind": "unstructured", "pruning": "row_magnitude", "m": m, "k": k,
                                            "sparsity": sparsity, "keep_per_row": keep, "seed": seed}})


def nm_magnitude_pruned(m: int, k: int, n: int = 2, m_group: int = 4, seed: int = 0, *,
                        dtype: str = "float32") -> SparseMatrix:
    """N:M magnitude pruning of dense Gaussian weights: the ``n`` largest ``|w|`` of every group of
    ``m_group`` consecutive entries along K are kept (2:4 as NVIDIA's sparse tensor cores want it).

    A partial tail group (``k % m_group`` entries) keeps its ``min(n, len)`` largest.
    """
    m, k = _check_dim("m", m), _check_dim("k", k)
    n, m_group = _check_dim("n", n), _check_dim("m_group", m_group)
    if n > m_group:
        raise ValueError(f"Expected n <= m_group for N:M sparsity, got n={n}, m_group={m_group}.")
    _check_dtype(dtype)
    rng = np.random.default_rng(seed)
    groups = -(-k // m_group)

    def keep_mask(mag: np.ndarray) -> np.ndarray:
        rows = mag.shape[0]
        padded = np.full((rows, groups * m_group), -1.0, dtype=np.float32)  # pads never win: |w| >= 0
        padded[:, :k] = mag
        order = np.argsort(-padded.reshape(rows, groups, m_group), axis=2, kind="stable")
        mask = np.zeros((rows, groups, m_group), dtype=bool)
        np.put_along_axis(mask, order[:, :, :n], True, axis=2)
        return mask.reshape(rows, groups * m_group)[:, :k]

    indptr, indices, values = _magnitude_pruned(m, k, rng, keep_mask, dtype)
    return SparseMatrix(indptr=indptr, indices=indices, data=values, shape=(m, k), dtype=dtype,
                        name=f"nm{n}of{m_group}_magnitude_{m}x{k}_seed{seed}",
                        meta={"generator": {"kind": "nm", "pruning": "group_magnitude", "m": m, "k": k, "n": n,
                                            "m_group": m_group, "axis": "row", "seed": seed}})


def banded(m: int, k: int, bandwidth: int, fill: float = 1.0, seed: int = 0, *,
           dtype: str = "float32") -> SparseMatrix:
    """Entries with ``|i - j| <= bandwidth``: the diagonal always, off-diagonals with probability ``fill``.

    Built directly from the ``2 * bandwidth + 1`` diagonals (no dense mask), so long thin bands are
    cheap. Keeping the diagonal mirrors FEM/FD matrices, whose diagonal is structurally nonzero.
    """
    m, k = _check_dim("m", m), _check_dim("k", k)
    if isinstance(bandwidth, bool) or not isinstance(bandwidth, (int, np.integer)) or bandwidth < 0:
        raise ValueError(f"Expected bandwidth to be a non-negative integer, got {bandwidth!r}.")
    bandwidth = int(bandwidth)
    fill = _check_fraction("fill", fill)
    _check_dtype(dtype)
    rng = np.random.default_rng(seed)
    offsets = np.arange(-bandwidth, bandwidth + 1, dtype=np.int64)
    rows_per_chunk = max(1, _CHUNK_CELLS // offsets.size)
    counts = np.zeros(m, dtype=np.int64)
    parts = []
    for r0 in range(0, m, rows_per_chunk):
        r1 = min(m, r0 + rows_per_chunk)
        cols = np.arange(r0, r1, dtype=np.int64)[:, None] + offsets[None, :]
        mask = (cols >= 0) & (cols < k)
        if fill < 1.0:
            mask &= (rng.random(cols.shape, dtype=np.float32) < fill) | (offsets[None, :] == 0)
        counts[r0:r1] = mask.sum(axis=1)
        parts.append(cols[mask].astype(np.int32))
    indptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    indices = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
    return _assemble(indptr, indices, (m, k), rng, dtype, f"banded_{m}x{k}_bw{bandwidth}_fill{fill:.3g}_seed{seed}",
                     {"kind": "banded", "m": m, "k": k, "bandwidth": bandwidth, "fill": fill, "seed": seed})


def laplacian_2d(nx: int, ny: int, *, dtype: str = "float32") -> SparseMatrix:
    """The 5-point finite-difference Laplacian on an ``nx x ny`` grid (``nx*ny`` square, SPD).

    Values are the stencil's own (4 on the diagonal, -1 to each grid neighbour), not random: this
    is the classic FEM/FD test matrix, banded with bandwidth ``nx`` in natural ordering.
    """
    nx, ny = _check_dim("nx", nx), _check_dim("ny", ny)
    _check_dtype(dtype)
    n = nx * ny
    idx = np.arange(n, dtype=np.int64)
    x = idx % nx
    offsets = [(-nx, idx >= nx), (-1, x > 0), (0, np.ones(n, dtype=bool)), (1, x < nx - 1), (nx, idx < n - nx)]
    cols = np.stack([idx + off for off, _ in offsets], axis=1)     # ascending offsets: sorted rows
    mask = np.stack([ok for _, ok in offsets], axis=1)
    vals = np.where(np.arange(5)[None, :] == 2, 4.0, -1.0)
    vals = np.broadcast_to(vals, cols.shape)[mask]
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(mask.sum(axis=1), out=indptr[1:])
    return SparseMatrix(indptr=indptr, indices=cols[mask].astype(np.int32),
                        data=vals.astype(np.float64 if dtype == "float64" else np.float32),
                        shape=(n, n), dtype=dtype, name=f"laplacian2d_{nx}x{ny}",
                        meta={"generator": {"kind": "banded", "nx": nx, "ny": ny, "bandwidth": nx}})


def laplacian_3d(nx: int, ny: int, nz: int, *, dtype: str = "float32") -> SparseMatrix:
    """The 7-point finite-difference Laplacian on an ``nx x ny x nz`` grid (6 on the diagonal, -1 to
    each of the up to six grid neighbours): the 3-D mesh matrix of scientific codes, banded with
    bandwidth ``nx * ny`` in natural ordering."""
    nx, ny, nz = _check_dim("nx", nx), _check_dim("ny", ny), _check_dim("nz", nz)
    _check_dtype(dtype)
    n = nx * ny * nz
    idx = np.arange(n, dtype=np.int64)
    x, y, z = idx % nx, (idx // nx) % ny, idx // (nx * ny)
    plane = nx * ny
    offsets = [(-plane, z > 0), (-nx, y > 0), (-1, x > 0), (0, np.ones(n, dtype=bool)),
               (1, x < nx - 1), (nx, y < ny - 1), (plane, z < nz - 1)]
    cols = np.stack([idx + off for off, _ in offsets], axis=1)     # ascending offsets: sorted rows
    mask = np.stack([ok for _, ok in offsets], axis=1)
    vals = np.broadcast_to(np.where(np.arange(7)[None, :] == 3, 6.0, -1.0), cols.shape)[mask]
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(mask.sum(axis=1), out=indptr[1:])
    return SparseMatrix(indptr=indptr, indices=cols[mask].astype(np.int32),
                        data=vals.astype(np.float64 if dtype == "float64" else np.float32),
                        shape=(n, n), dtype=dtype, name=f"laplacian3d_{nx}x{ny}x{nz}",
                        meta={"generator": {"kind": "banded", "nx": nx, "ny": ny, "nz": nz, "bandwidth": plane}})


def rmat(scale: int, edge_factor: int = 16, a: float = 0.57, b: float = 0.19, c: float = 0.19, seed: int = 0, *,
         permute: bool = True, dtype: str = "float32") -> SparseMatrix:
    """R-MAT (recursive Kronecker) graph on ``2**scale`` vertices with ``edge_factor * 2**scale`` edges.

    Each edge picks one quadrant per level with probabilities ``(a, b, c, d = 1 - a - b - c)``, which
    gives the heavy-tailed (power-law-like) degree distributions of web and social graphs (the
    Graph500 generator; defaults are Graph500's). Duplicate edges are merged, so nnz is a little
    below the edge count. ``permute`` relabels vertices randomly, as Graph500 does, so the hubs are
    not all in the top-left corner.
    """
    scale = _check_dim("scale", scale)
    if scale > 30:
        raise ValueError(f"Expected scale <= 30 (2**scale vertices), got {scale}.")
    edge_factor = _check_dim("edge_factor", edge_factor)
    probs = [_check_fraction(name, v) for name, v in (("a", a), ("b", b), ("c", c))]
    if sum(probs) > 1.0 + 1e-12:
        raise ValueError(f"Expected a + b + c <= 1 for R-MAT, got a={a}, b={b}, c={c} (sum {sum(probs):.4g}).")
    _check_dtype(dtype)
    rng = np.random.default_rng(seed)
    n = 1 << scale
    edges = edge_factor * n
    ab, abc = a + b, a + b + c
    rows = np.zeros(edges, dtype=np.int64)
    cols = np.zeros(edges, dtype=np.int64)
    per_chunk = max(1, (1 << 23) // scale)
    for e0 in range(0, edges, per_chunk):
        e1 = min(edges, e0 + per_chunk)
        u = rng.random((scale, e1 - e0))
        row_bit = u >= ab                                   # quadrants c and d: lower half
        col_bit = ((u >= a) & (u < ab)) | (u >= abc)        # quadrants b and d: right half
        weights = (1 << np.arange(scale - 1, -1, -1, dtype=np.int64))[:, None]
        rows[e0:e1] = (row_bit * weights).sum(axis=0)
        cols[e0:e1] = (col_bit * weights).sum(axis=0)
    if permute:
        perm = rng.permutation(n)
        rows, cols = perm[rows], perm[cols]
    indptr, indices = _from_coo(rows, cols, n, n)
    return _assemble(indptr, indices, (n, n), rng, dtype, f"rmat_s{scale}_ef{edge_factor}_seed{seed}",
                     {"kind": "power_law", "scale": scale, "edge_factor": edge_factor, "a": a, "b": b, "c": c,
                      "seed": seed, "permute": permute})


GENERATORS: dict[str, Callable[..., SparseMatrix]] = {
    "unstructured": unstructured,
    "dense": dense,
    "block": block_sparse,
    "block_sparse": block_sparse,
    "nm": nm_sparse,
    "nm_sparse": nm_sparse,
    "row_pruned": row_pruned,
    "column_pruned": column_pruned,
    "banded": banded,
    "laplacian_2d": laplacian_2d,
    "laplacian_3d": laplacian_3d,
    "magnitude_pruned": magnitude_pruned,
    "nm_magnitude_pruned": nm_magnitude_pruned,
    "rmat": rmat,
    "power_law": rmat,
}


def make(kind: str, **kw) -> SparseMatrix:
    """Dispatch by name: pattern-class names (``"block"``, ``"nm"``, ``"power_law"``...) or function names."""
    try:
        fn = GENERATORS[kind]
    except KeyError:
        raise ValueError(f"Unknown generator kind {kind!r}; expected one of {sorted(GENERATORS)}.") from None
    try:
        return fn(**kw)
    except TypeError as exc:  # wrong keyword: say which generator and what it takes
        import inspect

        raise ValueError(f"Bad arguments for generator {kind!r}: {exc}. Signature: {fn.__name__}"
                         f"{inspect.signature(fn)}") from None


# ---- labelled suites (classifier accuracy tests and benchmarks) -----------------------------
SUITE_CLASSES = ("dense", "unstructured", "block", "nm", "row_pruned", "column_pruned", "banded", "power_law")
_SUITE_EDGES = (64, 96, 128, 200, 256, 384, 512, 768, 1000, 1024, 1536, 2048)
_SUITE_BLOCKS = ((8, 8), (16, 16), (32, 32), (64, 64), (16, 32), (32, 16), (8, 32), (32, 8), (32, 64), (64, 32),
                 (16, 64), (64, 16))


def labelled_suite(cases_per_class: int, *, seed: int = 0, max_cells: int = 2048 * 2048) -> list[tuple[str, str, dict]]:
    """``(true_class, generator_kind, kwargs)`` triples covering every class with noise.

    Sizes run from 64 to 2048 per side (rectangular too, at most ``max_cells`` entries); within a
    class the parameters sweep the ranges a real pruned weight or graph shows: sparsity 50..99%
    (unstructured), 1:2 / 2:4 / 4:8 along rows or columns with 0 or 1% violating groups, blocks of
    8..64 (square and rectangular) at block density 10..50% and occupancy 30..100%, R-MAT graphs of
    scale 9..12, FEM Laplacians and bands of fill 0.3..1, 30..70% pruned rows/columns at
    within-line density 20..100%, near-dense with 0..10% zeros. Build a case with
    ``make(kind, **kwargs)``. Deterministic for a given ``seed``.
    """
    rng = np.random.default_rng(seed)

    def dims(min_m: int = 64, min_k: int = 64) -> tuple[int, int]:
        while True:
            m_, k_ = (int(x) for x in rng.choice(_SUITE_EDGES, size=2))
            if rng.random() < 0.4:
                k_ = m_
            if m_ >= min_m and k_ >= min_k and m_ * k_ <= max_cells:
                return m_, k_

    out: list[tuple[str, str, dict]] = []
    for i in range(cases_per_class):
        s = int(rng.integers(0, 2**31))
        m_, k_ = dims()
        out.append(("dense", "dense", dict(m=m_, k=k_, sparsity=round(float(rng.uniform(0.0, 0.10)), 4), seed=s)))
        m_, k_ = dims()
        out.append(("unstructured", "unstructured",
                    dict(m=m_, k=k_, sparsity=round(float(rng.uniform(0.5, 0.99)), 4), seed=s)))
        bm, bk = _SUITE_BLOCKS[int(rng.integers(len(_SUITE_BLOCKS)))]
        m_, k_ = dims(4 * bm, 4 * bk)
        out.append(("block", "block", dict(m=m_, k=k_, block=(bm, bk),
                                           block_density=round(float(rng.uniform(0.1, 0.5)), 3),
                                           occupancy=round(float(rng.uniform(0.3, 1.0)), 3), seed=s)))
        n, g = ((2, 4), (2, 4), (1, 2), (4, 8))[i % 4]
        m_, k_ = dims()
        out.append(("nm", "nm", dict(m=m_, k=k_, n=n, m_group=g, axis=("row", "col")[int(rng.integers(2))],
                                     violations=(0.0, 0.01)[int(rng.integers(2))], seed=s)))
        for kind in ("row_pruned", "column_pruned"):
            m_, k_ = dims()
            out.append((kind, kind, dict(m=m_, k=k_, prune_fraction=round(float(rng.uniform(0.3, 0.7)), 3),
                                         density=round(float(rng.uniform(0.2, 1.0)), 3), seed=s)))
        if i % 3 == 0:
            nx = int(rng.integers(8, 65))
            out.append(("banded", "laplacian_2d", dict(nx=nx, ny=int(rng.integers(8, max(9, 4096 // nx + 1))))))
        else:
            m_, _ = dims()
            k_ = m_ if rng.random() < 0.6 else int(m_ * rng.choice((0.5, 0.75, 1.25, 1.5)))
            bw = int(rng.integers(1, max(2, min(m_, k_) // 16 + 1)))
            out.append(("banded", "banded", dict(m=m_, k=k_, bandwidth=bw, fill=round(float(rng.uniform(0.3, 1.0)), 3),
                                                 seed=s)))
        out.append(("power_law", "rmat", dict(scale=int(rng.integers(9, 13)), edge_factor=int(rng.choice((8, 16))),
                                              seed=s, permute=bool(rng.integers(2)))))
    return out
