"""Row reorderings: valid permutations, the C' = P A B contract, and denser blocks after clustering."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparseditto.matrix import SparseMatrix
from sparseditto.reorder import (
    block_occupancy, inverse_permutation, permute_rows, row_permutation, unpermute_rows,
)


@st.composite
def sparse_matrices(draw):
    shape = (draw(st.integers(1, 50)), draw(st.integers(1, 50)))
    density = draw(st.sampled_from([0.0, 0.05, 0.3, 1.0]))
    seed = draw(st.integers(0, 2**32 - 1))
    return SparseMatrix.from_scipy(sp.random(*shape, density=density, random_state=seed, format="csr"))


def shuffled_block_sparse(block_density: float, seed: int = 0):
    """64 x 64 grid of 16 x 16 blocks (10% occupied), entries inside blocks at `block_density`,
    then rows shuffled: the structure a pruning method leaves before anyone reorders it."""
    rng = np.random.default_rng(seed)
    grid = rng.random((64, 64)) < 0.1
    mask = np.kron(grid, np.ones((16, 16), dtype=bool)) & (rng.random((1024, 1024)) < block_density)
    dense = np.where(mask, rng.standard_normal(mask.shape), 0.0)
    A = SparseMatrix.from_scipy(sp.csr_array(dense))
    return A, permute_rows(A, rng.permutation(A.rows))


@settings(max_examples=60, deadline=None)
@given(A=sparse_matrices(), method=st.sampled_from(["length", "cluster"]), block_k=st.sampled_from([1, 7, 32]))
def test_row_permutation_is_a_permutation_and_contract_holds(A, method, block_k):
    perm = row_permutation(A, method=method, block_k=block_k)
    assert perm.dtype == np.int64
    np.testing.assert_array_equal(np.sort(perm), np.arange(A.rows))
    Ap = permute_rows(A, perm)
    np.testing.assert_array_equal(Ap.to_dense(), A.to_dense()[perm])   # row i of P A is row perm[i] of A
    B = np.random.default_rng(0).standard_normal((A.cols, 3))
    C_perm = Ap.to_dense() @ B                                            # what a kernel computes
    np.testing.assert_allclose(unpermute_rows(C_perm, perm), A.to_dense() @ B, rtol=1e-12, atol=1e-12)
    back = permute_rows(Ap, inverse_permutation(perm))
    np.testing.assert_array_equal(back.indptr, A.indptr)
    np.testing.assert_array_equal(back.indices, A.indices)
    np.testing.assert_array_equal(back.data, A.data)


def test_length_order_is_descending_and_stable():
    lengths = [2, 0, 3, 2, 3, 1]
    rows = np.repeat(np.arange(6), lengths)
    cols = np.concatenate([np.arange(n) for n in lengths])
    A = SparseMatrix.from_scipy(sp.coo_array((np.ones(rows.size), (rows, cols)), shape=(6, 4)))
    assert row_permutation(A, "length").tolist() == [2, 4, 0, 3, 5, 1]


def test_cluster_raises_block_occupancy_on_shuffled_block_sparse():
    for block_density, floor in [(1.0, 0.99), (0.5, 0.45), (0.2, 0.08)]:
        original, shuffled = shuffled_block_sparse(block_density)
        before = block_occupancy(shuffled, (16, 16))
        perm = row_permutation(shuffled, method="cluster", block_k=16)
        after = block_occupancy(permute_rows(shuffled, perm), (16, 16))
        # shuffling spreads each block over ~16 block rows; clustering must gather them again
        assert before < block_occupancy(original, (16, 16)) / 4
        assert after > 3 * before and after >= floor, (block_density, before, after)
    # the default block_k=32 also recovers fully dense blocks
    _, shuffled = shuffled_block_sparse(1.0, seed=3)
    perm = row_permutation(shuffled, method="cluster")
    assert block_occupancy(permute_rows(shuffled, perm), (16, 16)) > 0.9


def test_cluster_puts_identical_column_sets_together_and_empty_rows_last():
    dense = np.zeros((6, 8))
    dense[[0, 3], 5] = 1.0   # rows 0 and 3 touch block column 1 only (block_k=4)
    dense[[1, 4], 0] = 1.0   # rows 1 and 4 touch block column 0 only
    A = SparseMatrix.from_scipy(sp.csr_array(dense))
    assert row_permutation(A, "cluster", block_k=4).tolist() == [1, 4, 0, 3, 2, 5]


def test_unpermute_rows_on_torch_tensor():
    perm = np.array([2, 0, 1])
    C = torch.arange(6.0).reshape(3, 2)
    C_perm = C[torch.from_numpy(perm)]
    assert torch.equal(unpermute_rows(C_perm, perm), C)


def test_inverse_permutation():
    perm = np.array([3, 0, 2, 1])
    inv = inverse_permutation(perm)
    np.testing.assert_array_equal(perm[inv], np.arange(4))
    np.testing.assert_array_equal(inv[perm], np.arange(4))


def test_bad_inputs_raise_value_error():
    A = SparseMatrix.from_scipy(sp.eye(4, format="csr"))
    with pytest.raises(ValueError, match="method 'random'"):
        row_permutation(A, method="random")
    with pytest.raises(ValueError, match="block_k"):
        row_permutation(A, method="cluster", block_k=0)
    with pytest.raises(ValueError, match="length 4, got shape \\(3,\\)"):
        permute_rows(A, [0, 1, 2])
    with pytest.raises(ValueError, match="repeated"):
        permute_rows(A, [0, 1, 1, 2])
    with pytest.raises(ValueError, match="outside 0..3"):
        permute_rows(A, [0, 1, 2, 4])
    with pytest.raises(ValueError, match="integer"):
        permute_rows(A, [0.0, 1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="1-D"):
        inverse_permutation(np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(ValueError, match="SparseMatrix"):
        row_permutation(np.eye(3))
    with pytest.raises(ValueError, match="block_shape"):
        block_occupancy(A, (0, 16))
