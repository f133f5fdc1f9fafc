"""Raw structural measurements of a sparse matrix, computed in a few vectorized passes over nnz.

Why a separate module: :mod:`sparseditto.analysis` turns these numbers into the public
:class:`~sparseditto.analysis.PatternReport` and :mod:`sparseditto.pattern_classes` turns them
into a pattern class; both need exactly the same measurements, and keeping the measuring here
keeps the speed-critical code in one place.

How it stays fast (a 4096 x 11008 matrix with 22.5M nonzeros takes well under a second on two
cores) and small in memory (no dense boolean mask is ever built):

* **8x8 bit tiles.** Every nonzero sets one bit in a 64-bit word of its 8x8 tile (bit
  ``8*(i%8) + j%8``). The nonempty tiles (ids sorted, plus words) are a bitmap of the matrix
  that stores only nonempty tiles. Built with ``np.bitwise_or.at`` into a dense word grid when the
  tile grid is small enough (``DENSE_TILE_LIMIT``), else by a stable sort of tile ids per
  8-row stripe and ``np.bitwise_or.reduceat``. Entries are processed in row stripes of about
  ``CHUNK_NNZ`` nonzeros so temporaries stay bounded.
* From the tiles, everything else is a lookup: byte ``r`` of a word is the 8-column mask of
  row ``r``; N:M violations along rows (1:2, 2:4, 4:8) are table lookups on those bytes; an 8x8
  bit-matrix transpose (three mask/shift steps) gives the 8-row masks of each column, hence N:M
  along columns; popcounts give 8x8 block counts; larger block shapes (8..128, square and
  rectangular) come from OR-reducing the tile-occupancy grid.
* Row lengths are ``diff(indptr)``; column lengths one ``bincount``; the ``|i - j|`` histogram
  (bandwidth, diagonal fraction, banded-ness) one more ``bincount``.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from sparseditto.matrix import SparseMatrix

# Dense tile grids up to this many 8x8 tiles (8 bytes each: 64 MB) use bitwise_or.at; larger,
# sparser grids (big graphs) sort tile ids instead.
DENSE_TILE_LIMIT = 1 << 23
# Nonzeros processed per stripe of rows (bounds the int64/uint64 temporaries at ~100 MB).
CHUNK_NNZ = 1 << 22
# Block edge lengths measured for BSR-style blocks; every (bm, bk) pair of these is measured.
BLOCK_EDGES = (8, 16, 32, 64, 128)
# Row/column vectors measured too (free from the tiles): 1x8 row segments and 8x1 column segments.
VECTOR_SHAPES = ((1, 8), (8, 1))
# N:M ratios measured, as (n, m).
NM_RATIOS = ((1, 2), (2, 4), (4, 8))
# The |i - j| histogram has one bin per offset up to this many bins, coarser bins beyond (very
# tall or wide matrices); bandwidth and the near-diagonal count stay exact either way.
OFFSET_HIST_BINS = 1 << 22
SIGNATURE_VERSION = b"sparseditto-pattern-signature-v1"
SIGNATURE_CHARS = 20


@dataclass(frozen=True)
class BlockCount:
    """Raw counts for one block shape (blocks are aligned to multiples of the shape)."""

    shape: tuple[int, int]
    nonzero_blocks: int
    total_blocks: int
    nonempty_block_rows: int
    nonempty_block_cols: int

    @property
    def interior_empty_fraction(self) -> float:
        """Empty blocks among those whose block-row AND block-column hold something.

        Whole empty block-rows/-columns are excluded on purpose: they are what row/column pruning
        leaves behind. Only block structure *inside* the used rows and columns counts as block
        sparsity.
        """
        interior = self.nonempty_block_rows * self.nonempty_block_cols
        return 1.0 - self.nonzero_blocks / interior if interior else 0.0


@dataclass
class PatternFeatures:
    """Everything measured about one matrix (arrays are per row / per column, never per nonzero)."""

    shape: tuple[int, int]
    nnz: int
    row_lengths: np.ndarray
    col_lengths: np.ndarray
    nm_violations: dict[tuple[int, int, str], int]
    nm_groups: dict[tuple[int, int, str], int]
    blocks: list[BlockCount]
    offset_hist: np.ndarray            # offset_hist[b] = nonzeros with |i - j| // offset_bin == b
    offset_bin: int                    # 1 unless max(rows, cols) > OFFSET_HIST_BINS
    max_offset: int                    # max |i - j| (0 without nonzeros)
    near_diagonal: int                 # nonzeros with |i - j| <= diag_band(shape)
    signature: str
    extras: dict = field(default_factory=dict)

    @property
    def density(self) -> float:
        return self.nnz / float(self.shape[0] * self.shape[1])

    def nm_conformance(self, n: int, m: int, axis: str) -> float:
        total = self.nm_groups[(n, m, axis)]
        return 1.0 - self.nm_violations[(n, m, axis)] / total if total else 1.0

    def offset_quantile(self, q: float) -> int:
        """Smallest d such that at least a fraction q of the nonzeros have |i - j| <= d.

        Exact with unit bins; with coarse bins, the upper edge of the bin (an upper bound).
        """
        if self.nnz == 0:
            return 0
        cum = np.cumsum(self.offset_hist)
        b = int(np.searchsorted(cum, q * self.nnz - 1e-9, side="left"))
        return min(self.max_offset, (b + 1) * self.offset_bin - 1)


# ---- byte lookup tables for N:M violations inside one 8-entry group ---------------------------
def _byte_tables() -> dict[tuple[int, int], np.ndarray]:
    b = np.arange(256, dtype=np.uint8)
    pairs = sum(((b >> (2 * i)) & 3) == 3 for i in range(4)).astype(np.uint8)
    quads = ((np.bitwise_count(b & 0x0F) > 2).astype(np.uint8) + (np.bitwise_count(b >> 4) > 2).astype(np.uint8))
    octs = (np.bitwise_count(b) > 4).astype(np.uint8)
    return {(1, 2): pairs, (2, 4): quads, (4, 8): octs}


_NM_TABLES = _byte_tables()


def _transpose_tiles(words: np.ndarray) -> np.ndarray:
    """Transpose each 8x8 bit-matrix (bit 8r+c -> bit 8c+r): Hacker's Delight, three swap steps."""
    x = words.copy()
    for shift, mask in ((7, 0x00AA00AA00AA00AA), (14, 0x0000CCCC0000CCCC), (28, 0x00000000F0F0F0F0)):
        s, msk = np.uint64(shift), np.uint64(mask)
        t = (x ^ (x >> s)) & msk
        x ^= t ^ (t << s)
    return x


# ---- the passes over nonzeros -------------------------------------------------------------
def _stripes(indptr: np.ndarray, rows: int):
    """Row ranges [r0, r1) starting at multiples of 8 holding about CHUNK_NNZ nonzeros each."""
    r0 = 0
    while r0 < rows:
        target = int(indptr[r0]) + CHUNK_NNZ
        r1 = int(np.searchsorted(indptr, target, side="right")) - 1
        r1 = max(r0 + 8, (r1 // 8) * 8)
        r1 = min(r1, rows)
        yield r0, r1
        r0 = r1


_BIT = np.left_shift(np.uint64(1), np.arange(64, dtype=np.uint64))   # bit p of a tile word


def diag_band(shape: tuple[int, int]) -> int:
    """Half-width of the band ``diag_fraction`` counts: max(1, floor(1% of min(rows, cols)))."""
    return max(1, int(0.01 * min(shape)))


def _scan_nonzeros(A: SparseMatrix):
    """One pass over nnz: 8x8 tile words (sorted nonempty tile ids + words) and |i - j| statistics."""
    m, k = A.shape
    tile_rows, tile_cols = -(-m // 8), -(-k // 8)
    n_tiles = tile_rows * tile_cols
    dense_grid = n_tiles <= DENSE_TILE_LIMIT
    grid = np.zeros(n_tiles, dtype=np.uint64) if dense_grid else None
    id_parts, word_parts = [], []
    offset_bin = -(-max(m, k) // OFFSET_HIST_BINS)
    offset_hist = np.zeros(-(-max(m, k) // offset_bin), dtype=np.int64)
    max_offset = near_diagonal = 0
    band = diag_band((m, k))
    lengths = np.diff(A.indptr)
    # int32 arithmetic is ~2x faster than int64 on these passes; fall back when ids could overflow
    small = max(m, k, n_tiles) < 2**31 - 1
    idx_dtype = np.int32 if small else np.int64
    for r0, r1 in _stripes(A.indptr, m):
        lo, hi = int(A.indptr[r0]), int(A.indptr[r1])
        if hi == lo:
            continue
        cols = A.indices[lo:hi].astype(idx_dtype, copy=False)
        rows = np.repeat(np.arange(r0, r1, dtype=idx_dtype), lengths[r0:r1])
        offset = np.abs(rows - cols)
        max_offset = max(max_offset, int(offset.max()))
        near_diagonal += int(np.count_nonzero(offset <= band))
        offset_hist += np.bincount(offset // offset_bin if offset_bin > 1 else offset, minlength=offset_hist.size)
        del offset
        pos = rows & 7
        pos <<= 3
        pos |= cols & 7
        bit = _BIT[pos]
        tile = rows >> 3
        tile *= tile_cols
        tile += cols >> 3
        if dense_grid:
            np.bitwise_or.at(grid, tile, bit)
        else:
            order = np.argsort(tile, kind="stable")   # 8 sorted runs per stripe: a cheap merge
            tile, bit = tile[order], bit[order]
            starts = np.flatnonzero(np.r_[True, tile[1:] != tile[:-1]])
            id_parts.append(tile[starts].astype(np.int64))
            word_parts.append(np.bitwise_or.reduceat(bit, starts))
    if dense_grid:
        ids = np.flatnonzero(grid)
        words = grid[ids]
    else:
        ids = np.concatenate(id_parts) if id_parts else np.zeros(0, dtype=np.int64)
        words = np.concatenate(word_parts) if word_parts else np.zeros(0, dtype=np.uint64)
    return ids, words, (tile_rows, tile_cols), (offset_hist, offset_bin, max_offset, near_diagonal)


def _column_lengths(A: SparseMatrix, ids: np.ndarray, words_t: np.ndarray, tile_cols: int) -> np.ndarray:
    """Nonzeros per column: from the transposed tiles (byte c is column c's 8-row mask) when there
    are fewer tile bytes than nonzeros, else one bincount over the column indices."""
    k = A.shape[1]
    if 8 * ids.size >= A.nnz:
        return np.bincount(A.indices, minlength=k).astype(np.int64)
    per_byte = np.bitwise_count(words_t.astype("<u8", copy=False).view(np.uint8))
    col = ((ids % tile_cols) * 8)[:, None] + np.arange(8)
    return np.bincount(col.ravel(), weights=per_byte, minlength=tile_cols * 8)[:k].astype(np.int64)


def _nm_counts(words: np.ndarray, words_t: np.ndarray, m: int, k: int):
    """Violating groups and total groups for each N:M ratio along rows and along columns.

    Only tiles with at least two nonzeros can hold a violating group (1:2 needs two in a pair), so
    very sparse matrices look up just those.
    """
    crowded = np.bitwise_count(words) >= 2
    if np.count_nonzero(crowded) < 0.5 * words.size:
        words, words_t = words[crowded], words_t[crowded]
    row_bytes = words.astype("<u8", copy=False).view(np.uint8)
    col_bytes = words_t.astype("<u8", copy=False).view(np.uint8)
    violations, groups = {}, {}
    for (n, g), table in _NM_TABLES.items():
        violations[(n, g, "row")] = int(table[row_bytes].sum(dtype=np.int64))
        violations[(n, g, "col")] = int(table[col_bytes].sum(dtype=np.int64))
        groups[(n, g, "row")] = m * -(-k // g)
        groups[(n, g, "col")] = k * -(-m // g)
    return violations, groups


def _or_pairs(grid: np.ndarray, axis: int) -> np.ndarray:
    """OR neighbouring pairs along ``axis`` (padding an odd length with an empty line)."""
    if grid.shape[axis] % 2:
        pad = [(0, 0), (0, 0)]
        pad[axis] = (0, 1)
        grid = np.pad(grid, pad)
    return grid[0::2] | grid[1::2] if axis == 0 else grid[:, 0::2] | grid[:, 1::2]


def _block_counts(ids: np.ndarray, tile_grid: tuple[int, int], shape: tuple[int, int]) -> list[BlockCount]:
    """Nonzero-block counts for every (bm, bk) in BLOCK_EDGES^2 that fits in the matrix."""
    m, k = shape
    tile_rows, tile_cols = tile_grid
    edges_m = [e for e in BLOCK_EDGES if e <= m]
    edges_k = [e for e in BLOCK_EDGES if e <= k]
    out: list[BlockCount] = []
    if not edges_m or not edges_k:
        return out
    if tile_rows * tile_cols <= DENSE_TILE_LIMIT:
        occupied = np.zeros(tile_rows * tile_cols, dtype=bool)
        occupied[ids] = True
        level_rows = occupied.reshape(tile_rows, tile_cols)
        for bm in edges_m:
            level = level_rows
            for bk in edges_k:
                out.append(BlockCount((bm, bk), int(np.count_nonzero(level)),
                                      -(-m // bm) * -(-k // bk),
                                      int(np.count_nonzero(level.any(axis=1))),
                                      int(np.count_nonzero(level.any(axis=0)))))
                level = _or_pairs(level, 1)
            level_rows = _or_pairs(level_rows, 0)
        return out
    # Sorted-tile path (huge, sparse grids). Keys (block_row << S) | block_col are sorted. Merging
    # g neighbouring tile columns = clearing the low log2(g) bits of the column part, which keeps
    # the order (drop adjacent duplicates); merging f tile rows = clearing low bits of the row
    # part, then one stable sort (a merge of sorted runs). Each level starts from the
    # deduplicated keys of the level before, so the sets shrink as blocks grow.
    shift = max(1, int(tile_cols).bit_length())
    block_row, block_col = np.divmod(ids, tile_cols)
    level = (block_row << shift) | block_col
    # nonempty block columns do not depend on bm: OR-reduce the nonempty tile columns once per bk
    used_cols, block_cols = np.bincount(block_col, minlength=tile_cols) > 0, {}
    del block_row, block_col
    for bk in edges_k:
        block_cols[bk] = int(np.count_nonzero(used_cols))
        used_cols = _or_pairs(used_cols[None, :], 1)[0]
    for bm in edges_m:
        if bm > 8:
            level = _dedupe_sorted(np.sort(level & ~np.int64(((bm // 8) - 1) << shift), kind="stable"))
        n_block_rows = _count_runs(level >> shift)
        keys = level
        for bk in edges_k:
            if bk > 8:
                keys = _dedupe_sorted(keys & ~np.int64((bk // 8) - 1))
            out.append(BlockCount((bm, bk), int(keys.size), -(-m // bm) * -(-k // bk), n_block_rows,
                                  block_cols[bk]))
    return out


def _dedupe_sorted(values: np.ndarray) -> np.ndarray:
    """Drop adjacent duplicates of a sorted array (np.unique without the sort or the hashing)."""
    if values.size < 2:
        return values
    keep = np.empty(values.size, dtype=bool)
    keep[0] = True
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return values[keep]


def _count_runs(sorted_values: np.ndarray) -> int:
    """Number of distinct values in a sorted array."""
    if sorted_values.size == 0:
        return 0
    return 1 + int(np.count_nonzero(sorted_values[1:] != sorted_values[:-1]))


def _vector_counts(words: np.ndarray, words_t: np.ndarray, shape: tuple[int, int]) -> list[BlockCount]:
    """1x8 row segments and 8x1 column segments, read off the tile bytes."""
    m, k = shape
    out = []
    if k >= 8:
        nz = int(np.count_nonzero(words.astype("<u8", copy=False).view(np.uint8)))
        out.append(BlockCount((1, 8), nz, m * -(-k // 8), 0, 0))
    if m >= 8:
        nz = int(np.count_nonzero(words_t.astype("<u8", copy=False).view(np.uint8)))
        out.append(BlockCount((8, 1), nz, -(-m // 8) * k, 0, 0))
    return out


def structure_signature(A: SparseMatrix) -> str:
    """sha256 of the structure only: version tag, shape, indptr (int64 LE), indices (int32 LE).

    Values never enter, so the same pattern with other values hashes the same; canonical dtypes
    and explicit byte order make the hash the same on every machine.
    """
    h = hashlib.sha256(SIGNATURE_VERSION)
    h.update(np.asarray(A.shape, dtype="<i8").tobytes())
    h.update(memoryview(np.ascontiguousarray(A.indptr, dtype="<i8")))
    h.update(memoryview(np.ascontiguousarray(A.indices, dtype="<i4")))
    return h.hexdigest()[:SIGNATURE_CHARS]


def compute_features(A: SparseMatrix) -> PatternFeatures:
    """Measure everything the report and the classifier need (see the module docstring)."""
    m, k = A.shape
    ids, words, tile_grid, (offset_hist, offset_bin, max_offset, near_diagonal) = _scan_nonzeros(A)
    words_t = _transpose_tiles(words)
    col_lengths = _column_lengths(A, ids, words_t, tile_grid[1])
    violations, groups = _nm_counts(words, words_t, m, k)
    blocks = _block_counts(ids, tile_grid, A.shape) + _vector_counts(words, words_t, A.shape)
    return PatternFeatures(
        shape=(m, k),
        nnz=A.nnz,
        row_lengths=np.diff(A.indptr),
        col_lengths=col_lengths,
        nm_violations=violations,
        nm_groups=groups,
        blocks=blocks,
        offset_hist=offset_hist,
        offset_bin=offset_bin,
        max_offset=max_offset,
        near_diagonal=near_diagonal,
        signature=structure_signature(A),
    )


# ---- degree statistics ----------------------------------------------------------------------
def gini(counts: np.ndarray) -> float:
    """Gini coefficient of non-negative counts (0 = all equal, -> 1 = all mass on one entry)."""
    total = float(counts.sum())
    n = counts.size
    if n == 0 or total == 0.0:
        return 0.0
    x = np.sort(counts).astype(np.float64)
    weights = 2.0 * np.arange(1, n + 1) - n - 1
    return float(np.dot(weights, x) / (n * total))


def powerlaw_fit(degrees: np.ndarray) -> tuple[float, float] | None:
    """Discrete power-law tail fit of a degree sequence: (alpha, r2), or None when not meaningful.

    alpha is the discrete maximum-likelihood estimate (Clauset, Shalizi & Newman 2009, eq. 3.7
    approximation) for the tail ``x >= x_min``, with x_min chosen among degree quantiles by the
    smallest Kolmogorov-Smirnov distance; r2 is the coefficient of determination of the straight
    line through the tail's empirical CCDF on log-log axes (1.0 = a perfect power law). "Not
    meaningful" = fewer than 50 nonzero degrees, or a tail spanning less than a factor of 4 or
    fewer than 5 distinct degrees.
    """
    x = np.sort(degrees[degrees > 0]).astype(np.float64)
    if x.size < 50:
        return None
    best = None
    for q in (0.5, 0.6, 0.7, 0.8, 0.9):
        x_min = float(np.quantile(x, q, method="lower"))
        tail = x[x >= x_min]
        if tail.size < 20 or tail[-1] < 4 * x_min:
            continue
        alpha = 1.0 + tail.size / float(np.log(tail / (x_min - 0.5)).sum())
        # KS distance between empirical and fitted CCDF over the tail's distinct values
        values, counts = np.unique(tail, return_counts=True)
        emp_ccdf = 1.0 - (np.cumsum(counts) - counts) / tail.size
        fit_ccdf = (values / x_min) ** (1.0 - alpha)
        ks = float(np.max(np.abs(emp_ccdf - fit_ccdf)))
        if best is None or ks < best[0]:
            best = (ks, alpha, values, emp_ccdf)
    if best is None:
        return None
    _, alpha, values, ccdf = best
    if values.size < 5:
        return None
    lx, ly = np.log(values), np.log(ccdf)
    slope, intercept = np.polyfit(lx, ly, 1)
    resid = ly - (slope * lx + intercept)
    ss_tot = float(((ly - ly.mean()) ** 2).sum())
    r2 = 1.0 - float((resid ** 2).sum()) / ss_tot if ss_tot > 0 else 0.0
    return float(alpha), float(max(0.0, r2))
