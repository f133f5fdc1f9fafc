"""Row reorderings that make a sparse matrix friendlier to a kernel, and the contract for undoing them.

Why: permuting the rows of A (and, to match, the rows of C) changes nothing numerically but can
change a lot for a kernel. Sorting rows by length balances row-split kernels on skewed matrices;
grouping rows that touch the same column blocks turns scattered nonzeros into denser blocks, so a
block (BSR / tensor-core) kernel stores fewer zeros.

Contract with kernels: with `perm = row_permutation(A, ...)` and `Ap = permute_rows(A, perm)`,
row i of Ap is row perm[i] of A (Ap = P A). A kernel computes C' = Ap @ B = P A B and must write
row i of C' to row perm[i] of C (equivalently C = C'[inverse_permutation(perm)]). The permutation
is part of the kernel: it is never dropped silently.
"""
from __future__ import annotations

import numpy as np

from sparseditto.formats import occupied_blocks
from sparseditto.matrix import SparseMatrix

ROW_PERMUTATION_METHODS = ("length", "cluster")

# Fixed odd 64-bit multipliers (splitmix64 constants) for the column-set hash: deterministic across
# runs and platforms, so the same matrix always gets the same permutation.
_HASH_MUL = np.uint64(0x9E3779B97F4A7C15)
_HASH_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_HASH_MIX2 = np.uint64(0x94D049BB133111EB)


def _check_matrix(A) -> SparseMatrix:
    if not isinstance(A, SparseMatrix):
        raise ValueError(f"Expected a sparseditto.matrix.SparseMatrix, got {type(A).__name__}.")
    return A


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer: spreads block-column ids into well-mixed 64-bit words."""
    x = x.astype(np.uint64) * _HASH_MUL
    x = (x ^ (x >> np.uint64(30))) * _HASH_MIX1
    x = (x ^ (x >> np.uint64(27))) * _HASH_MIX2
    return x ^ (x >> np.uint64(31))


def row_permutation(A: SparseMatrix, method: str = "length", block_k: int = 32) -> np.ndarray:
    """Permutation (int64; new row i is old row perm[i]) that reorders A's rows for a kernel.

    method="length": rows by stored-entry count, longest first; stable, so equal rows keep their
        order. Balances row-split kernels and lets a kernel bin rows by length.
    method="cluster": rows that touch the same set of block-columns (width `block_k`) become
        neighbours, so (bm x bk) blocks of the permuted matrix hold more nonzeros. Each row's
        signature is the set of block-columns it touches; rows are sorted by (first block-column,
        second block-column, a 64-bit hash of the whole set, length descending, original index).
        Identical sets land together; sets that share their leading blocks land nearby. Empty rows
        go last. O(nnz log nnz), no dense intermediate.
    """
    A = _check_matrix(A)
    if method not in ROW_PERMUTATION_METHODS:
        raise ValueError(f"Unknown row permutation method {method!r}; expected one of {ROW_PERMUTATION_METHODS}.")
    if not isinstance(block_k, (int, np.integer)) or block_k <= 0:
        raise ValueError(f"block_k must be a positive integer, got block_k = {block_k!r}.")
    lengths = A.row_lengths().astype(np.int64)
    if method == "length":
        return np.argsort(-lengths, kind="stable").astype(np.int64)

    M = A.rows
    Kb = -(-A.cols // int(block_k))
    # Distinct (row, block-column) pairs: CSR order makes the keys non-decreasing, so distinct
    # pairs are the starts of runs (no sort needed).
    keys = A.row_ids() * Kb + A.indices.astype(np.int64) // int(block_k)
    if keys.size:
        pairs = keys[np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))]
    else:
        pairs = keys
    prow, pcol = pairs // Kb, pairs % Kb
    per_row = np.bincount(prow, minlength=M)
    first_at = np.concatenate(([0], np.cumsum(per_row)[:-1]))
    nonempty = per_row > 0
    first = np.full(M, Kb, dtype=np.int64)        # empty rows sort last
    second = np.full(M, Kb, dtype=np.int64)
    first[nonempty] = pcol[first_at[nonempty]]
    two = per_row > 1
    second[two] = pcol[first_at[two] + 1]
    set_hash = np.zeros(M, dtype=np.uint64)
    if pairs.size:
        # Sum of mixed ids (wrapping uint64) is order-free and equal for equal sets.
        set_hash[nonempty] = np.add.reduceat(_mix64(pcol), first_at[nonempty])
    # np.lexsort sorts by the last key first.
    order = np.lexsort((np.arange(M), -lengths, set_hash, second, first))
    return order.astype(np.int64)


def _check_permutation(perm, n: int) -> np.ndarray:
    perm = np.asarray(perm)
    if perm.ndim != 1 or perm.shape[0] != n:
        raise ValueError(f"Expected a permutation of length {n}, got shape {perm.shape}.")
    if not np.issubdtype(perm.dtype, np.integer):
        raise ValueError(f"Expected an integer permutation, got dtype {perm.dtype}.")
    perm = perm.astype(np.int64, copy=False)
    seen = np.zeros(n, dtype=bool)
    in_range = (perm >= 0) & (perm < n)
    if not in_range.all():
        bad = perm[~in_range][0]
        raise ValueError(f"Permutation entry {int(bad)} is outside 0..{n - 1}.")
    seen[perm] = True
    if not seen.all():
        raise ValueError(f"Not a permutation of 0..{n - 1}: {int(n - seen.sum())} ids missing (repeated ids).")
    return perm


def inverse_permutation(perm) -> np.ndarray:
    """inv with inv[perm[i]] = i: old row j sits at new row inv[j]."""
    perm = np.asarray(perm)
    if perm.ndim != 1:
        raise ValueError(f"Expected a 1-D permutation, got shape {perm.shape}.")
    perm = _check_permutation(perm, perm.shape[0])
    inv = np.empty_like(perm)
    inv[perm] = np.arange(perm.shape[0], dtype=np.int64)
    return inv


def permute_rows(A: SparseMatrix, perm) -> SparseMatrix:
    """P A: row i of the result is row perm[i] of A (same values, same column order)."""
    A = _check_matrix(A)
    perm = _check_permutation(perm, A.rows)
    lengths = A.row_lengths()[perm]
    indptr = np.zeros(A.rows + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    # Entry e of new row i comes from A.indptr[perm[i]] + (e - indptr[i]).
    src = np.arange(A.nnz, dtype=np.int64) + np.repeat(A.indptr[perm] - indptr[:-1], lengths)
    return SparseMatrix(indptr=indptr, indices=A.indices[src], data=A.data[src], shape=A.shape,
                        dtype=A.dtype, name=A.name, meta=dict(A.meta))


def unpermute_rows(C_perm, perm):
    """C from C' = P A B: row perm[i] of C is row i of C' (numpy array or torch tensor)."""
    perm = np.asarray(perm)
    inv = inverse_permutation(perm)
    if hasattr(C_perm, "index_select"):  # torch tensor: index on its own device
        import torch

        return C_perm.index_select(0, torch.as_tensor(inv, device=C_perm.device))
    return np.asarray(C_perm)[inv]


def block_occupancy(A: SparseMatrix, block_shape=(16, 16)) -> float:
    """nnz / (number of (bm x bk) blocks holding a stored entry * bm * bk); 0.0 for an empty matrix.

    The fraction of a block kernel's stored values that are real nonzeros: what "cluster" raises.
    """
    A = _check_matrix(A)
    bm, bk = (int(x) for x in block_shape)
    if bm <= 0 or bk <= 0:
        raise ValueError(f"block_shape must be two positive integers, got {block_shape!r}.")
    if A.nnz == 0:
        return 0.0
    blocks = occupied_blocks(A, (bm, bk))[0].size
    return A.nnz / float(blocks * bm * bk)


__all__ = ["row_permutation", "permute_rows", "inverse_permutation", "unpermute_rows", "block_occupancy",
           "ROW_PERMUTATION_METHODS"]
