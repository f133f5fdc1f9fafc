"""Sparse storage formats that SpMM kernels consume, built from the canonical `SparseMatrix`.

Why several formats: for the small-N SpMM of a pruned weight, time is bytes of A over bandwidth,
and the index metadata is what separates a fast kernel from a slow one. Each format here trades
index bytes against padding: CSR pays 4 (or 2) bytes of column index per nonzero, a bitmap pays one
bit per *element*, N:M pays a few bits per kept value but must hold the pattern's N:M shape, block
formats pay one index per block but store the block's zeros. The planner compares `nbytes()` across
formats; kernels take `to_torch()`.

Shared contract (see docs/formats.md for each layout and its byte formula):
  * `from_matrix(A, **params)`  vectorized numpy construction; bad parameters -> ValueError.
  * `to_dense()`                float64 ndarray equal to `A.to_dense()` exactly (round trip).
  * `nbytes(value_bytes=2)`     bytes a kernel reads for A in this format (values + index/metadata
                                arrays exactly as `to_torch` ships them).
  * `to_torch(device, dtype)`   dict of contiguous tensors: values in `dtype`, index arrays int32
                                unless the format says int16 / uint8 / int64.
  * `shape`                     the logical (M, K) of A.
Values are kept as numpy float32 (float64 when A.data is float64) so the round trip is exact.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar

import numpy as np

from sparseditto.matrix import SparseMatrix

INT32_MAX = np.iinfo(np.int32).max
INT16_COLUMN_LIMIT = 32768  # int16 column ids hold 0..32767, so K may be at most 32768


# ---- shared helpers ---------------------------------------------------------------------------

def _check_matrix(A) -> SparseMatrix:
    if not isinstance(A, SparseMatrix):
        raise ValueError(
            f"Expected a sparseditto.matrix.SparseMatrix, got {type(A).__name__}; "
            "convert with sparseditto.io.load_matrix or SparseMatrix.from_scipy first.")
    return A


def _check_int32_extent(what: str, value: int) -> None:
    if value > INT32_MAX:
        raise ValueError(f"{what} = {value} does not fit the int32 indices kernels use (max {INT32_MAX}).")


def _value_dtype(A: SparseMatrix) -> np.dtype:
    return np.dtype(np.float64) if A.data.dtype == np.float64 else np.dtype(np.float32)


def _values(A: SparseMatrix) -> np.ndarray:
    return A.data.astype(_value_dtype(A), copy=False)


def _check_value_bytes(value_bytes) -> int:
    if not isinstance(value_bytes, (int, np.integer)) or value_bytes <= 0:
        raise ValueError(f"value_bytes must be a positive integer (2 for fp16/bf16, 4 for fp32), got {value_bytes!r}.")
    return int(value_bytes)


def _check_block_shape(block_shape) -> tuple[int, int]:
    try:
        bm, bk = (int(x) for x in block_shape)
        ok = tuple(block_shape) == (bm, bk)
    except (TypeError, ValueError):
        ok = False
    if not ok or bm <= 0 or bk <= 0:
        raise ValueError(f"block_shape must be two positive integers (bm, bk), got {block_shape!r}.")
    return bm, bk


def _tensor(arr: np.ndarray, device, dtype=None):
    """Numpy array -> contiguous torch tensor on `device` (cast to `dtype` when given)."""
    import torch

    t = torch.from_numpy(np.ascontiguousarray(arr))
    t = t.to(device=device, dtype=dtype) if dtype is not None else t.to(device=device)
    return t.contiguous()


def _torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def _segment_starts(keys: np.ndarray) -> np.ndarray:
    """Start offsets of runs of equal values in a sorted 1-D key array."""
    if keys.size == 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))


# ---- CSR --------------------------------------------------------------------------------------

@dataclass(eq=False)
class CSR:
    """Compressed sparse rows: the general-purpose format for row-split kernels.

    `indices` may be int16 when K <= 32768: 16-bit column ids cut the per-nonzero cost from 6 to 4
    bytes at fp16, which moves CSR's break-even with dense from ~67% to ~50% sparsity.
    """

    indptr: np.ndarray   # int32 [M+1]
    indices: np.ndarray  # int32 or int16 [nnz], ascending within a row
    values: np.ndarray   # float32/float64 [nnz]
    shape: tuple[int, int]

    name: ClassVar[str] = "csr"

    @classmethod
    def from_matrix(cls, A: SparseMatrix, index_dtype: str = "int32") -> "CSR":
        A = _check_matrix(A)
        if index_dtype not in ("int32", "int16"):
            raise ValueError(f"index_dtype must be 'int32' or 'int16', got {index_dtype!r}.")
        _check_int32_extent("nnz", A.nnz)
        if index_dtype == "int16" and A.cols > INT16_COLUMN_LIMIT:
            raise ValueError(
                f"index_dtype='int16' needs K <= {INT16_COLUMN_LIMIT} (column ids up to 32767), got K = {A.cols}.")
        return cls(
            indptr=A.indptr.astype(np.int32),
            indices=A.indices.astype(np.dtype(index_dtype)),
            values=_values(A).copy(),
            shape=(A.rows, A.cols),
        )

    @property
    def nnz(self) -> int:
        return int(self.indices.shape[0])

    def row_ids(self) -> np.ndarray:
        return np.repeat(np.arange(self.shape[0], dtype=np.int64), np.diff(self.indptr))

    def to_dense(self) -> np.ndarray:
        out = np.zeros(self.shape, dtype=np.float64)
        out[self.row_ids(), self.indices.astype(np.int64)] = self.values
        return out

    def nbytes(self, value_bytes: int = 2) -> int:
        """(M+1)*4 [indptr] + nnz*idx_bytes [indices, 4 or 2] + nnz*value_bytes [values]."""
        vb = _check_value_bytes(value_bytes)
        return int(self.indptr.size * 4 + self.nnz * self.indices.dtype.itemsize + self.nnz * vb)

    def to_torch(self, device="cpu", dtype=None) -> dict:
        """{'indptr': int32 [M+1], 'indices': int32|int16 [nnz], 'values': dtype [nnz]}."""
        dtype = dtype if dtype is not None else _torch_dtype("float16")
        return {
            "indptr": _tensor(self.indptr, device),
            "indices": _tensor(self.indices, device),
            "values": _tensor(self.values, device, dtype),
        }


# ---- BSR --------------------------------------------------------------------------------------

def occupied_blocks(A: SparseMatrix, block_shape) -> tuple[np.ndarray, np.ndarray]:
    """(the (bm x bk) blocks holding a stored entry, as sorted keys block_row * Kb + block_col; each
    entry's index into them). Block keys in CSR order are not sorted (a block row interleaves its
    rows): when the block grid is not much larger than nnz an occupancy count is O(nnz), else a sort."""
    A = _check_matrix(A)
    bm, bk = _check_block_shape(block_shape)
    Mb, Kb = -(-A.shape[0] // bm), -(-A.shape[1] // bk)
    keys = (A.row_ids() // bm) * Kb + A.indices.astype(np.int64) // bk
    if Mb * Kb <= max(4 * keys.size, 1 << 22):
        occupied = np.bincount(keys, minlength=Mb * Kb) > 0
        return np.flatnonzero(occupied), (np.cumsum(occupied) - 1)[keys]
    return np.unique(keys, return_inverse=True)


@dataclass(eq=False)
class BSR:
    """Block sparse rows: dense (bm x bk) tiles that feed tensor-core dots directly.

    M and K need not be multiples of the block: the matrix is padded with zeros to `padded_shape`.
    A block is kept iff it holds at least one *stored* entry (an explicitly stored zero counts: it
    is part of the pattern).
    """

    block_shape: tuple[int, int]
    indptr: np.ndarray   # int32 [Mb+1]
    indices: np.ndarray  # int32 [nblocks], block-column ids ascending within a block row
    blocks: np.ndarray   # [nblocks, bm, bk]
    shape: tuple[int, int]
    padded_shape: tuple[int, int]

    name: ClassVar[str] = "bsr"

    @classmethod
    def from_matrix(cls, A: SparseMatrix, block_shape=(16, 16)) -> "BSR":
        A = _check_matrix(A)
        bm, bk = _check_block_shape(block_shape)
        M, K = A.shape
        Mb, Kb = -(-M // bm), -(-K // bk)
        rows = A.row_ids()
        cols = A.indices.astype(np.int64)
        ukeys, inverse = occupied_blocks(A, (bm, bk))
        _check_int32_extent("number of blocks", ukeys.size)
        blocks = np.zeros((ukeys.size, bm, bk), dtype=_value_dtype(A))
        blocks[inverse, rows % bm, cols % bk] = _values(A)
        ubr = ukeys // Kb
        indptr = np.zeros(Mb + 1, dtype=np.int64)
        np.cumsum(np.bincount(ubr, minlength=Mb), out=indptr[1:])
        return cls(
            block_shape=(bm, bk),
            indptr=indptr.astype(np.int32),
            indices=(ukeys % Kb).astype(np.int32),
            blocks=blocks,
            shape=(M, K),
            padded_shape=(Mb * bm, Kb * bk),
        )

    @property
    def nblocks(self) -> int:
        return int(self.indices.shape[0])

    def to_dense(self) -> np.ndarray:
        bm, bk = self.block_shape
        Mb = self.indptr.shape[0] - 1
        Kb = self.padded_shape[1] // bk
        brow = np.repeat(np.arange(Mb), np.diff(self.indptr))
        tiles = np.zeros((Mb, Kb, bm, bk), dtype=np.float64)
        tiles[brow, self.indices] = self.blocks
        dense = tiles.transpose(0, 2, 1, 3).reshape(self.padded_shape)
        return np.ascontiguousarray(dense[: self.shape[0], : self.shape[1]])

    def nbytes(self, value_bytes: int = 2) -> int:
        """(Mb+1)*4 [indptr] + nblocks*4 [block-column ids] + nblocks*bm*bk*value_bytes [blocks]."""
        vb = _check_value_bytes(value_bytes)
        bm, bk = self.block_shape
        return int(self.indptr.size * 4 + self.nblocks * 4 + self.nblocks * bm * bk * vb)

    def to_torch(self, device="cpu", dtype=None) -> dict:
        """{'indptr': int32 [Mb+1], 'indices': int32 [nblocks], 'blocks': dtype [nblocks, bm, bk]}."""
        dtype = dtype if dtype is not None else _torch_dtype("float16")
        return {
            "indptr": _tensor(self.indptr, device),
            "indices": _tensor(self.indices, device),
            "blocks": _tensor(self.blocks, device, dtype),
        }


# ---- N:M compressed ---------------------------------------------------------------------------

NM_MAX_M = 16


def _nm_bits(m: int) -> int:
    """Bits per packed position: 2 for m <= 4, 4 (a nibble) for 4 < m <= 16.

    Power-of-two field widths never straddle a 32-bit word, so a kernel extracts a field with one
    shift and one mask.
    """
    return 2 if m <= 4 else 4


@lru_cache(maxsize=None)
def _nm_slot_tables(n: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Lookup tables indexed by a group's occupancy mask (bit p set = position p holds a kept entry).

    slot_positions[mask] ([2**m, n] uint8): the n positions the group stores, ascending: the kept
        positions plus the lowest free positions as zero-valued padding.
    slot_of[mask, p] ([2**m, m] uint8): which of those n slots position p lands in.
    Only masks with popcount <= n are ever looked up. Tables turn the per-group work into two
    gathers (at most 2**16 rows, built once per (n, m)).
    """
    masks = np.arange(1 << m, dtype=np.int64)
    pos = np.arange(m, dtype=np.int64)
    occupied = ((masks[:, None] >> pos) & 1).astype(bool)
    score = np.where(occupied, pos, m + pos)  # kept positions first, then free ones low to high
    slot_positions = np.sort(np.argsort(score, axis=1, kind="stable")[:, :n], axis=1)
    slot_of = (slot_positions[:, :, None] < pos[None, None, :]).sum(axis=1)
    return slot_positions.astype(np.uint8), slot_of.astype(np.uint8)


@dataclass(eq=False)
class NMCompressed:
    """N:M structured sparsity: n kept values per group of m consecutive columns, plus positions.

    Layout: `values[r, g*n + s]` is slot s of group g of row r and sits at column
    `g*m + positions[r, g*n + s]`. Positions within a group are strictly increasing. Groups with
    fewer than n stored entries are padded with zero values at free positions (lowest first);
    groups with more than n keep their n largest-magnitude entries (ties: lower column) and the
    rest go to `residual` (a CSR), so any matrix round-trips exactly; `residual` is None when
    every group conforms. Filler slots land on columns < K whenever the group has at least n
    columns inside K; only in a last group narrower than n can a (zero) slot point at a column
    >= K, so kernels must mask B loads to rows < K (or pad B to G*m rows).
    """

    n: int
    m: int
    values: np.ndarray      # [M, G*n]
    positions: np.ndarray   # uint8 [M, G*n], 0..m-1, strictly increasing within each group
    residual: CSR | None
    shape: tuple[int, int]

    name: ClassVar[str] = "nm"

    @classmethod
    def from_matrix(cls, A: SparseMatrix, n: int = 2, m: int = 4, strict: bool = False) -> "NMCompressed":
        A = _check_matrix(A)
        if not isinstance(m, (int, np.integer)) or not 2 <= m <= NM_MAX_M:
            raise ValueError(f"m must be an integer in 2..{NM_MAX_M}, got m = {m!r}.")
        if not isinstance(n, (int, np.integer)) or not 1 <= n < m:
            raise ValueError(f"n must be an integer with 1 <= n < m, got n = {n!r}, m = {m}.")
        n, m = int(n), int(m)
        M, K = A.shape
        G = -(-K // m)
        _check_int32_extent("M * G * n", M * G * n)
        rows = A.row_ids()
        group, pos = np.divmod(A.indices.astype(np.int64), m)
        vals = _values(A)
        gkey = rows * G + group              # non-decreasing in CSR order
        # Count entries per (row, group); gkey is sorted, so groups are runs.
        gstarts = _segment_starts(gkey)
        gsizes = np.diff(np.append(gstarts, gkey.size))
        over = gsizes > n
        n_violating, first_bad = int(over.sum()), None
        keep = None
        if n_violating:
            # Only entries of over-full groups need ranking: by magnitude, largest first, ties to
            # the lower column. Conforming matrices skip the sort entirely.
            sub = np.flatnonzero(np.repeat(over, gsizes))
            order = sub[np.lexsort((pos[sub], -np.abs(vals[sub]), gkey[sub]))]
            ostarts = _segment_starts(gkey[order])
            rank = np.arange(order.size) - np.repeat(ostarts, np.diff(np.append(ostarts, order.size)))
            keep = np.ones(gkey.size, dtype=bool)
            keep[order[rank >= n]] = False
            first_key = int(gkey[gstarts[np.argmax(over)]])
            first_bad = (first_key // G, first_key % G)
        if strict and n_violating:
            r, g = first_bad
            raise ValueError(
                f"{n_violating} of {M * G} groups violate {n}:{m} (more than {n} stored entries among "
                f"{m} consecutive columns); first at row {r}, group {g} (columns {g * m}..{min(g * m + m, K) - 1}).")

        if keep is None:
            kkey, kpos, kvals, kstarts, ksizes = gkey, pos, vals, gstarts, gsizes
        else:
            # Dropping entries keeps CSR order, and every non-empty group keeps min(size, n) >= 1
            # of them, so the groups are still runs, now of length min(size, n).
            kkey, kpos, kvals = gkey[keep], pos[keep], vals[keep]
            ksizes = np.minimum(gsizes, n)
            kstarts = np.cumsum(ksizes) - ksizes
        # Empty groups: zero values at positions 0..n-1. Non-empty: occupancy mask -> table lookups.
        positions = np.broadcast_to(np.arange(n, dtype=np.uint8), (M * G, n)).copy()
        values = np.zeros((M * G, n), dtype=_value_dtype(A))
        if kkey.size:
            slot_positions, slot_of = _nm_slot_tables(n, m)
            occ = np.add.reduceat(np.left_shift(np.uint16(1), kpos.astype(np.uint16)), kstarts)
            positions[kkey[kstarts]] = slot_positions[occ]
            values[kkey, slot_of[np.repeat(occ, ksizes), kpos]] = kvals

        residual = None
        if keep is not None:
            drop = ~keep
            indptr = np.zeros(M + 1, dtype=np.int64)
            np.cumsum(np.bincount(rows[drop], minlength=M), out=indptr[1:])
            residual = CSR(indptr=indptr.astype(np.int32), indices=A.indices[drop].astype(np.int32),
                           values=vals[drop].copy(), shape=(M, K))
        return cls(n=n, m=m, values=values.reshape(M, G * n), positions=positions.reshape(M, G * n),
                   residual=residual, shape=(M, K))

    @property
    def groups_per_row(self) -> int:
        return -(-self.shape[1] // self.m)

    @property
    def violations(self) -> int:
        """Number of (row, group) pairs that held more than n stored entries (those spill to residual)."""
        if self.residual is None:
            return 0
        keys = self.residual.row_ids() * self.groups_per_row + self.residual.indices.astype(np.int64) // self.m
        return int(np.unique(keys).size)

    @property
    def bits_per_position(self) -> int:
        return _nm_bits(self.m)

    def packed_metadata(self) -> np.ndarray:
        """Positions packed into int32 words along each row: shape [M, ceil(G*n / per_word)].

        b = 2 bits per position when m <= 4 (per_word = 16), 4 bits (a nibble) when 4 < m <= 16
        (per_word = 8). Slot j of a row lives in word j // per_word at bits
        [(j % per_word) * b, (j % per_word) * b + b): slot 0 in the least significant bits. Unused
        tail fields are 0. Words are stored as int32 (bit 31 set -> negative value); a kernel
        should shift logically (cast to uint32 or mask after an arithmetic shift).
        """
        b = self.bits_per_position
        per_word = 32 // b
        M, S = self.positions.shape
        W = -(-S // per_word)
        padded = np.zeros((M, W * per_word), dtype=np.uint64)
        padded[:, :S] = self.positions
        shifts = (np.arange(per_word, dtype=np.uint64) * np.uint64(b))
        words = (padded.reshape(M, W, per_word) << shifts).sum(axis=2, dtype=np.uint64)
        return words.astype(np.uint32).view(np.int32)

    def to_dense(self) -> np.ndarray:
        M, K = self.shape
        G = self.groups_per_row
        out = np.zeros((M, G * self.m), dtype=np.float64)
        cols = (np.arange(G * self.n) // self.n) * self.m + self.positions.astype(np.int64)
        # Padding slots hold exact zeros, and every slot of a group has a distinct position, so
        # assignment (not accumulation) is exact.
        np.put_along_axis(out, cols, self.values.astype(np.float64), axis=1)
        out = out[:, :K]
        if self.residual is not None:
            out[self.residual.row_ids(), self.residual.indices.astype(np.int64)] = self.residual.values
        return np.ascontiguousarray(out)

    def nbytes(self, value_bytes: int = 2, metadata: str = "packed") -> int:
        """M*G*n*value_bytes [values] + metadata + residual.nbytes (if any).

        metadata='packed': M*ceil(G*n/per_word)*4 (2-bit fields for m<=4: ~0.25 B per kept value);
        'positions': M*G*n*1 (uint8); 'both': the sum. Must match the `metadata` given to to_torch.
        """
        vb = _check_value_bytes(value_bytes)
        M, S = self.positions.shape
        packed = M * -(-S // (32 // self.bits_per_position)) * 4
        meta = {"packed": packed, "positions": M * S, "both": packed + M * S}
        if metadata not in meta:
            raise ValueError(f"metadata must be one of {sorted(meta)}, got {metadata!r}.")
        total = M * S * vb + meta[metadata]
        if self.residual is not None:
            total += self.residual.nbytes(vb)
        return int(total)

    def to_torch(self, device="cpu", dtype=None, metadata: str = "packed") -> dict:
        """{'values': dtype [M, G*n], 'metadata': int32 [M, W] (packed) and/or 'positions': uint8
        [M, G*n]} plus, only when a residual exists, 'residual_indptr', 'residual_indices',
        'residual_values' (CSR of the entries that did not fit n:m)."""
        if metadata not in ("packed", "positions", "both"):
            raise ValueError(f"metadata must be 'packed', 'positions' or 'both', got {metadata!r}.")
        dtype = dtype if dtype is not None else _torch_dtype("float16")
        out = {"values": _tensor(self.values, device, dtype)}
        if metadata in ("packed", "both"):
            out["metadata"] = _tensor(self.packed_metadata(), device)
        if metadata in ("positions", "both"):
            out["positions"] = _tensor(self.positions, device)
        if self.residual is not None:
            for key, t in self.residual.to_torch(device, dtype).items():
                out[f"residual_{key}"] = t
        return out


# ---- Bitmap tiles -----------------------------------------------------------------------------

_BITMAP_MASK_DTYPES = {16: np.int16, 32: np.int32, 64: np.int64}


@dataclass(eq=False)
class BitmapTiles:
    """One bit per element in row segments of `tile_k` columns, values packed in CSR order.

    The cheapest index for moderate sparsity (1/8 byte per element regardless of nnz): a kernel
    loads a segment's mask, expands the packed values into a dense register tile, and runs a dense
    dot ("load as sparse, compute as dense"). The value of column t*tile_k + j of row r sits at
    `values[tile_offsets[r, t] + popcount(masks[r, t] & ((1 << j) - 1))]`.
    """

    tile_k: int
    masks: np.ndarray         # int16/int32/int64 [M, T] for tile_k 16/32/64
    tile_offsets: np.ndarray  # int32 [M, T]: index into values of the segment's first stored entry
    row_offsets: np.ndarray   # int32 [M+1]: CSR indptr (tile offsets derivable by popcount)
    values: np.ndarray        # [nnz], row-major, ascending column
    shape: tuple[int, int]

    name: ClassVar[str] = "bitmap"

    @classmethod
    def from_matrix(cls, A: SparseMatrix, tile_k: int = 32) -> "BitmapTiles":
        A = _check_matrix(A)
        if tile_k not in _BITMAP_MASK_DTYPES:
            raise ValueError(f"tile_k must be one of {sorted(_BITMAP_MASK_DTYPES)}, got tile_k = {tile_k!r}.")
        _check_int32_extent("nnz", A.nnz)
        M, K = A.shape
        T = -(-K // tile_k)
        rows = A.row_ids()
        cols = A.indices.astype(np.int64)
        key = rows * T + cols // tile_k                      # non-decreasing in CSR order
        bits = np.left_shift(np.uint64(1), (cols % tile_k).astype(np.uint64))
        masks = np.zeros(M * T, dtype=np.uint64)
        counts = np.zeros(M * T, dtype=np.int64)
        if key.size:
            starts = _segment_starts(key)
            masks[key[starts]] = np.add.reduceat(bits, starts)  # distinct bits: sum == or
            counts[key[starts]] = np.diff(np.append(starts, key.size))
        offsets = np.cumsum(counts) - counts
        mdtype = _BITMAP_MASK_DTYPES[tile_k]
        unsigned = np.dtype(mdtype).str.replace("i", "u")
        return cls(
            tile_k=int(tile_k),
            masks=masks.astype(unsigned).view(mdtype).reshape(M, T),
            tile_offsets=offsets.astype(np.int32).reshape(M, T),
            row_offsets=A.indptr.astype(np.int32),
            values=_values(A).copy(),
            shape=(M, K),
        )

    @property
    def nnz(self) -> int:
        return int(self.values.shape[0])

    def to_dense(self) -> np.ndarray:
        M, K = self.shape
        T = self.masks.shape[1]
        unsigned = self.masks.dtype.str.replace("i", "u")
        m = self.masks.view(unsigned).astype(np.uint64)
        j = np.arange(self.tile_k, dtype=np.uint64)
        dense_mask = ((m[:, :, None] >> j) & np.uint64(1)).astype(bool).reshape(M, T * self.tile_k)
        out = np.zeros((M, T * self.tile_k), dtype=np.float64)
        out[dense_mask] = self.values  # boolean assignment fills row-major: CSR order
        return np.ascontiguousarray(out[:, :K])

    def nbytes(self, value_bytes: int = 2, tile_offsets: bool = True) -> int:
        """M*T*(tile_k/8) [masks] + M*T*4 [tile_offsets, if shipped] + (M+1)*4 [row_offsets]
        + nnz*value_bytes [values]. Pass the same `tile_offsets` as to_torch."""
        vb = _check_value_bytes(value_bytes)
        M, T = self.masks.shape
        offsets = M * T * 4 if tile_offsets else 0
        return int(M * T * self.masks.dtype.itemsize + offsets + (M + 1) * 4 + self.nnz * vb)

    def to_torch(self, device="cpu", dtype=None, tile_offsets: bool = True) -> dict:
        """{'masks': int16/int32/int64 [M, T], 'tile_offsets': int32 [M, T] (omitted when
        tile_offsets=False: the kernel derives them by popcount from row_offsets), 'row_offsets':
        int32 [M+1], 'values': dtype [nnz]}."""
        dtype = dtype if dtype is not None else _torch_dtype("float16")
        out = {"masks": _tensor(self.masks, device)}
        if tile_offsets:
            out["tile_offsets"] = _tensor(self.tile_offsets, device)
        out["row_offsets"] = _tensor(self.row_offsets, device)
        out["values"] = _tensor(self.values, device, dtype)
        return out


# ---- ELL --------------------------------------------------------------------------------------

@dataclass(eq=False)
class ELL:
    """Fixed-width rows (ELLPACK): every row padded to `width` slots, column -1 for padding.

    Regular loads with no indptr indirection; wins when row lengths are nearly equal (e.g. row-wise
    pruning to a fixed count), loses to padding when they are skewed.
    """

    cols: np.ndarray    # int32 [M, width], -1 = padding
    values: np.ndarray  # [M, width], 0 at padding
    shape: tuple[int, int]

    name: ClassVar[str] = "ell"

    @classmethod
    def from_matrix(cls, A: SparseMatrix, width: int | None = None) -> "ELL":
        A = _check_matrix(A)
        M, K = A.shape
        lengths = A.row_lengths()
        longest = int(lengths.max()) if M else 0
        if width is None:
            width = longest
        if not isinstance(width, (int, np.integer)) or width < longest:
            raise ValueError(
                f"width must be an integer >= the longest row ({longest} stored entries), got width = {width!r}.")
        width = int(width)
        _check_int32_extent("M * width", M * width)
        rows = A.row_ids()
        slot = np.arange(A.nnz, dtype=np.int64) - A.indptr[rows]
        cols = np.full((M, width), -1, dtype=np.int32)
        values = np.zeros((M, width), dtype=_value_dtype(A))
        cols[rows, slot] = A.indices
        values[rows, slot] = _values(A)
        return cls(cols=cols, values=values, shape=(M, K))

    @property
    def width(self) -> int:
        return int(self.cols.shape[1])

    def to_dense(self) -> np.ndarray:
        out = np.zeros(self.shape, dtype=np.float64)
        stored = self.cols >= 0
        r = np.broadcast_to(np.arange(self.shape[0])[:, None], self.cols.shape)
        out[r[stored], self.cols[stored]] = self.values[stored]
        return out

    def nbytes(self, value_bytes: int = 2) -> int:
        """M*width*4 [cols] + M*width*value_bytes [values]."""
        vb = _check_value_bytes(value_bytes)
        return int(self.cols.size * (4 + vb))

    def to_torch(self, device="cpu", dtype=None) -> dict:
        """{'cols': int32 [M, width], 'values': dtype [M, width]}."""
        dtype = dtype if dtype is not None else _torch_dtype("float16")
        return {"cols": _tensor(self.cols, device), "values": _tensor(self.values, device, dtype)}


# ---- Blocked ELL ------------------------------------------------------------------------------

@dataclass(eq=False)
class BlockedELL:
    """ELL over blocks: every block row holds `width` (bm x bk) blocks, block column -1 = padding.

    The cuSPARSE Blocked-ELL idea: block-sparse with uniform per-block-row work, so one program per
    block row runs a fixed-trip loop of dense dots. Padding blocks are all-zero.
    """

    block_shape: tuple[int, int]
    col_blocks: np.ndarray  # int32 [Mb, width], -1 = padding
    blocks: np.ndarray      # [Mb, width, bm, bk]
    shape: tuple[int, int]
    padded_shape: tuple[int, int]

    name: ClassVar[str] = "blocked_ell"

    @classmethod
    def from_matrix(cls, A: SparseMatrix, block_shape=(16, 16), width: int | None = None) -> "BlockedELL":
        bsr = BSR.from_matrix(A, block_shape=block_shape)
        Mb = bsr.indptr.shape[0] - 1
        per_row = np.diff(bsr.indptr).astype(np.int64)
        longest = int(per_row.max()) if Mb else 0
        if width is None:
            width = longest
        if not isinstance(width, (int, np.integer)) or width < longest:
            raise ValueError(
                f"width must be an integer >= the most blocks in a block row ({longest}), got width = {width!r}.")
        width = int(width)
        bm, bk = bsr.block_shape
        brow = np.repeat(np.arange(Mb, dtype=np.int64), per_row)
        slot = np.arange(bsr.nblocks, dtype=np.int64) - bsr.indptr[brow]
        col_blocks = np.full((Mb, width), -1, dtype=np.int32)
        blocks = np.zeros((Mb, width, bm, bk), dtype=bsr.blocks.dtype)
        col_blocks[brow, slot] = bsr.indices
        blocks[brow, slot] = bsr.blocks
        return cls(block_shape=(bm, bk), col_blocks=col_blocks, blocks=blocks,
                   shape=bsr.shape, padded_shape=bsr.padded_shape)

    @property
    def width(self) -> int:
        return int(self.col_blocks.shape[1])

    def to_dense(self) -> np.ndarray:
        bm, bk = self.block_shape
        Mb = self.col_blocks.shape[0]
        Kb = self.padded_shape[1] // bk
        stored = self.col_blocks >= 0
        brow = np.broadcast_to(np.arange(Mb)[:, None], self.col_blocks.shape)
        tiles = np.zeros((Mb, Kb, bm, bk), dtype=np.float64)
        tiles[brow[stored], self.col_blocks[stored]] = self.blocks[stored]
        dense = tiles.transpose(0, 2, 1, 3).reshape(self.padded_shape)
        return np.ascontiguousarray(dense[: self.shape[0], : self.shape[1]])

    def nbytes(self, value_bytes: int = 2) -> int:
        """Mb*width*4 [col_blocks] + Mb*width*bm*bk*value_bytes [blocks, padding included]."""
        vb = _check_value_bytes(value_bytes)
        bm, bk = self.block_shape
        return int(self.col_blocks.size * 4 + self.col_blocks.size * bm * bk * vb)

    def to_torch(self, device="cpu", dtype=None) -> dict:
        """{'col_blocks': int32 [Mb, width], 'blocks': dtype [Mb, width, bm, bk]}."""
        dtype = dtype if dtype is not None else _torch_dtype("float16")
        return {"col_blocks": _tensor(self.col_blocks, device), "blocks": _tensor(self.blocks, device, dtype)}


# ---- Compacted --------------------------------------------------------------------------------

@dataclass(eq=False)
class Compacted:
    """Dense sub-matrix of the non-empty rows and columns (structured / channel pruning).

    C[rows] = dense @ B[cols]; every other row of C is zero. A dense GEMM on the kept part wins when
    whole rows/columns were pruned and what remains is (nearly) dense.
    """

    rows: np.ndarray   # int32 [r], ascending ids of rows with a stored entry
    cols: np.ndarray   # int32 [c], ascending ids of columns with a stored entry
    dense: np.ndarray  # [r, c]
    shape: tuple[int, int]

    name: ClassVar[str] = "compact"

    @classmethod
    def from_matrix(cls, A: SparseMatrix) -> "Compacted":
        A = _check_matrix(A)
        row_ids = A.row_ids()
        kept_rows = np.flatnonzero(A.row_lengths() > 0)
        kept_cols = np.unique(A.indices)
        _check_int32_extent("compacted elements", kept_rows.size * kept_cols.size)
        dense = np.zeros((kept_rows.size, kept_cols.size), dtype=_value_dtype(A))
        dense[np.searchsorted(kept_rows, row_ids), np.searchsorted(kept_cols, A.indices)] = _values(A)
        return cls(rows=kept_rows.astype(np.int32), cols=kept_cols.astype(np.int32), dense=dense,
                   shape=(A.rows, A.cols))

    def to_dense(self) -> np.ndarray:
        out = np.zeros(self.shape, dtype=np.float64)
        out[np.ix_(self.rows.astype(np.int64), self.cols.astype(np.int64))] = self.dense
        return out

    def nbytes(self, value_bytes: int = 2) -> int:
        """r*4 [rows] + c*4 [cols] + r*c*value_bytes [dense]."""
        vb = _check_value_bytes(value_bytes)
        return int(self.rows.size * 4 + self.cols.size * 4 + self.dense.size * vb)

    def to_torch(self, device="cpu", dtype=None) -> dict:
        """{'rows': int32 [r], 'cols': int32 [c], 'dense': dtype [r, c]}."""
        dtype = dtype if dtype is not None else _torch_dtype("float16")
        return {"rows": _tensor(self.rows, device), "cols": _tensor(self.cols, device),
                "dense": _tensor(self.dense, device, dtype)}


# ---- registry ---------------------------------------------------------------------------------

FORMATS: dict[str, type] = {
    "csr": CSR,
    "bsr": BSR,
    "nm": NMCompressed,
    "bitmap": BitmapTiles,
    "ell": ELL,
    "blocked_ell": BlockedELL,
    "compact": Compacted,
}


def convert(A: SparseMatrix, fmt: str, **params):
    """Build format `fmt` (a key of FORMATS) from A, passing `params` to its from_matrix."""
    try:
        cls = FORMATS[fmt]
    except (KeyError, TypeError):
        raise ValueError(f"Unknown format {fmt!r}; expected one of {sorted(FORMATS)}.") from None
    return cls.from_matrix(A, **params)


__all__ = ["occupied_blocks", "CSR", "BSR", "NMCompressed", "BitmapTiles", "ELL", "BlockedELL", "Compacted",
           "FORMATS", "convert", "INT16_COLUMN_LIMIT"]
