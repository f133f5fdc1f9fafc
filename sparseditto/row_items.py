"""Row decomposition of a CSR matrix into bounded work items: the format of the csr_rowdecomp kernel.

Why: on power-law graphs a few rows hold thousands of nonzeros while most hold a handful. A kernel
that gives each row to one warp waits on its longest row (the R-MAT case in issue 11 ran 5x slower
than cuSPARSE); one that gives every warp the same number of nonzeros (merge path) pays a search and
a reduction everywhere. Here rows are cut, once at `prepare` time, into *items* of at most `chunk`
nonzeros: a short row is one item, a long row several. Items are then ordered (longest first, so
the big ones start early and the warps sharing a launch wave have similar work; or in row order,
which keeps neighbouring rows of a mesh, which share columns of B, together in time).

Every item is (row, start, end, slot): its nonzeros are ``indices[start:end]`` of the CSR arrays
(which stay as they are), and ``slot`` is -1 when the item is its row's only one (the kernel writes
the row of C directly, zeros for an empty row) or the index of its fp32 partial row in a workspace.
A split row's slots are consecutive and in nonzero order; a second, small pass sums them in that
fixed order and writes C: the result does not depend on scheduling (no atomics).

tests/test_csr_rowdecomp.py restates the kernels' walk over these arrays in numpy, so the CPU tests
check the decomposition and the reduction order without a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ITEM_ORDERS = ("length", "row")
MAX_CHUNK = 1 << 20


@dataclass(frozen=True)
class RowItems:
    """Work items over a CSR matrix's nonzeros, and the fixup that sums the split rows."""

    items: np.ndarray      # int32 [n_items, 4]: row, start, end, slot (-1: written directly)
    fix_rows: np.ndarray   # int32 [n_split]: rows cut into several items
    fix_ptr: np.ndarray    # int32 [n_split + 1]: slots fix_ptr[i]:fix_ptr[i+1] belong to fix_rows[i]
    shape: tuple[int, int]
    chunk: int
    order: str

    @property
    def n_items(self) -> int:
        return int(self.items.shape[0])

    @property
    def n_slots(self) -> int:
        return int(self.fix_ptr[-1])

    @classmethod
    def from_indptr(cls, indptr: np.ndarray, shape: tuple[int, int], chunk: int, order: str = "length") -> "RowItems":
        """Cut each row of a CSR row pointer into items of at most ``chunk`` nonzeros, ordered by ``order``."""
        indptr = np.asarray(indptr)
        m = int(shape[0])
        if indptr.ndim != 1 or indptr.shape[0] != m + 1:
            raise ValueError(f"Expected a row pointer of length M + 1 = {m + 1}, got shape {indptr.shape}.")
        if m and (indptr[0] != 0 or np.any(np.diff(indptr) < 0)):
            raise ValueError("Expected a CSR row pointer starting at 0 and non-decreasing.")
        if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or not 1 <= int(chunk) <= MAX_CHUNK:
            raise ValueError(f"chunk must be an integer in [1, {MAX_CHUNK}] (nonzeros per item), got {chunk!r}.")
        if order not in ITEM_ORDERS:
            raise ValueError(f"order must be one of {ITEM_ORDERS}, got {order!r}.")
        if int(indptr[-1]) >= 2**31:
            raise ValueError(f"{int(indptr[-1])} nonzeros do not fit the kernel's int32 offsets.")
        chunk = int(chunk)
        lengths = np.diff(indptr.astype(np.int64))
        pieces = np.maximum(1, -(-lengths // chunk))          # an empty row is one (empty) item
        rows = np.repeat(np.arange(m, dtype=np.int64), pieces)
        first = np.repeat(np.cumsum(pieces) - pieces, pieces)  # index of the row's first item
        k = np.arange(rows.shape[0], dtype=np.int64) - first   # item number inside its row
        start = indptr[rows].astype(np.int64) + k * chunk
        end = np.minimum(start + chunk, indptr[rows + 1].astype(np.int64))
        split = pieces[rows] > 1
        slot = np.full(rows.shape[0], -1, dtype=np.int64)
        slot[split] = np.arange(int(split.sum()), dtype=np.int64)   # row order, then nonzero order
        split_rows = np.flatnonzero(pieces > 1)
        fix_ptr = np.concatenate([[0], np.cumsum(pieces[split_rows])])
        items = np.stack([rows, start, end, slot], axis=1)
        if order == "length":
            # longest first; ties keep row order (stable), so the layout is deterministic
            items = items[np.argsort(-(end - start), kind="stable")]
        return cls(items=np.ascontiguousarray(items, dtype=np.int32), fix_rows=split_rows.astype(np.int32),
                   fix_ptr=fix_ptr.astype(np.int32), shape=(m, int(shape[1])), chunk=chunk, order=order)

    def covers(self, indptr: np.ndarray) -> bool:
        """Whether the layout is one the kernels compute A @ B with: every nonzero of ``indptr`` in
        exactly one item, inside its row; every row written exactly once (one direct item, or split
        with its slots owned by it in the fixup); slots numbered 0..n_slots-1 once each."""
        indptr = np.asarray(indptr, dtype=np.int64)
        rows, start, end, slot = (self.items[:, i].astype(np.int64) for i in range(4))
        if np.any(start > end) or np.any(end - start > self.chunk):
            return False
        if np.any(start < indptr[rows]) or np.any(end > indptr[rows + 1]):
            return False
        hits = np.zeros(int(indptr[-1]) + 1, dtype=np.int64)
        np.add.at(hits, start, 1)
        np.add.at(hits, end, -1)
        if not np.all(np.cumsum(hits)[:-1] == 1):
            return False
        direct, split = rows[slot < 0], slot[slot >= 0]
        fix_rows = self.fix_rows.astype(np.int64)
        if np.unique(direct).shape[0] != direct.shape[0] or np.intersect1d(direct, fix_rows).size:
            return False
        if direct.shape[0] + np.unique(fix_rows).shape[0] != self.shape[0] or fix_rows.shape[0] != np.unique(fix_rows).shape[0]:
            return False
        if not np.array_equal(np.sort(split), np.arange(self.n_slots)):
            return False
        owner = np.searchsorted(self.fix_ptr, split, side="right") - 1
        return bool(np.array_equal(fix_rows[owner], rows[slot >= 0]))


def auto_chunk(row_mean: float) -> int:
    """Nonzeros per item when the template leaves CHUNK to prepare: 4 mean rows, a power of two in
    [32, 512], so that a typical row is one item (no fixup traffic) and a hub row of a power-law
    graph is cut into pieces a warp finishes in about the time of a few ordinary rows."""
    want = max(32.0, 4.0 * float(row_mean))
    chunk = 32
    while chunk < want and chunk < 512:
        chunk *= 2
    return chunk
