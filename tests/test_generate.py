"""The synthetic generators produce exactly the pattern they claim, reproducibly.

The classifier accuracy tests trust these generators for ground truth, so each structural promise
(exact N:M groups, whole pruned rows, blocks on the grid, a band, a Laplacian) is checked here
against a dense reference mask.
"""
from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp

from sparseditto import generate as gen
from sparseditto.matrix import SparseMatrix

EXAMPLE = Path(gen.__file__).resolve().parent / "examples" / "pruned_2of4_256x256.mtx.gz"


def assert_canonical(A: SparseMatrix, shape) -> None:
    assert isinstance(A, SparseMatrix)
    assert A.shape == tuple(shape)
    assert A.indptr.dtype == np.int64 and A.indices.dtype == np.int32
    csr = A.to_scipy()
    csr.check_format(full_check=True)
    assert csr.has_canonical_format, "indices must be sorted and unique within each row"


CASES = [
    ("unstructured", dict(m=130, k=70, sparsity=0.8)),
    ("dense", dict(m=40, k=33, sparsity=0.05)),
    ("block", dict(m=100, k=130, block=(16, 32), block_density=0.3, occupancy=0.6)),
    ("nm", dict(m=64, k=30, n=2, m_group=4)),
    ("nm", dict(m=30, k=64, n=1, m_group=2, axis="col", violations=0.1)),
    ("row_pruned", dict(m=90, k=50, prune_fraction=0.4, density=0.5)),
    ("column_pruned", dict(m=50, k=90, prune_fraction=0.4, density=0.5)),
    ("banded", dict(m=100, k=80, bandwidth=4, fill=0.5)),
    ("rmat", dict(scale=8)),
    ("magnitude_pruned", dict(m=50, k=70, sparsity=0.7)),
    ("nm_magnitude_pruned", dict(m=40, k=30, n=2, m_group=4)),
]


@pytest.mark.parametrize("kind,kw", CASES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(CASES)])
def test_generators_are_canonical_seeded_and_named(kind, kw):
    A = gen.make(kind, **kw)
    shape = (1 << kw["scale"],) * 2 if kind == "rmat" else (kw["m"], kw["k"])
    assert_canonical(A, shape)
    B = gen.make(kind, **kw)
    assert np.array_equal(A.indptr, B.indptr) and np.array_equal(A.indices, B.indices)
    assert np.array_equal(A.data, B.data), "same seed must give the same values"
    C = gen.make(kind, **dict(kw, seed=12345))
    assert not (np.array_equal(A.indices, C.indices) and np.array_equal(A.data, C.data))
    assert A.name and A.name != "matrix" and "seed" in A.name
    assert A.meta["generator"]["kind"] in gen.SUITE_CLASSES


def test_values_are_standard_normal_and_dtype_rounded():
    A = gen.unstructured(400, 400, 0.5, seed=3)
    assert abs(A.data.mean()) < 0.02 and abs(A.data.std() - 1.0) < 0.02
    assert A.dtype == "float32" and A.data.dtype == np.float32
    H = gen.unstructured(50, 50, 0.5, seed=3, dtype="float16")
    assert H.dtype == "float16"
    assert np.array_equal(H.data.astype(np.float16).astype(np.float32), H.data)
    Bf = gen.unstructured(50, 50, 0.5, seed=3, dtype="bfloat16")
    assert np.all(Bf.data.view(np.uint32) & 0xFFFF == 0), "bfloat16 values keep only the top 16 bits"
    D = gen.unstructured(20, 20, 0.5, dtype="float64")
    assert D.data.dtype == np.float64


def test_unstructured_and_dense_density():
    A = gen.unstructured(500, 400, 0.9, seed=1)
    expected = 0.1 * 500 * 400
    assert abs(A.nnz - expected) < 5 * np.sqrt(expected)
    full = gen.dense(30, 20)
    assert full.nnz == 600 and np.array_equal(full.mask(), np.ones((30, 20), bool))
    assert gen.unstructured(10, 10, 1.0).nnz == 0
    assert gen.unstructured(10, 10, 0.0).nnz == 100


def test_block_sparse_keeps_whole_grid_blocks():
    m, k, bm, bk = 100, 130, 16, 32
    A = gen.block_sparse(m, k, (bm, bk), block_density=0.3, occupancy=1.0, seed=4)
    M = np.pad(A.mask(), ((0, -m % bm), (0, -k % bk))).reshape(-(-m // bm), bm, -(-k // bk), bk)
    counts = M.sum(axis=(1, 3))
    gm, gk = counts.shape
    assert np.count_nonzero(counts) == round(0.3 * gm * gk)
    # every kept block is full (clipped at the matrix edge)
    row_ext = np.minimum(bm, m - np.arange(gm) * bm)[:, None]
    col_ext = np.minimum(bk, k - np.arange(gk) * bk)[None, :]
    kept = counts > 0
    assert np.array_equal(counts[kept], (row_ext * col_ext)[np.broadcast_to(kept, counts.shape)])
    P = gen.block_sparse(512, 512, (32, 32), block_density=0.25, occupancy=0.4, seed=5)
    occ = P.nnz / (round(0.25 * 256) * 32 * 32)
    assert abs(occ - 0.4) < 0.03


@pytest.mark.parametrize("n,g,axis", [(2, 4, "row"), (1, 2, "col"), (4, 8, "row"), (2, 4, "col")])
def test_nm_sparse_groups_are_exact(n, g, axis):
    m, k = 67, 45           # neither a multiple of the group: the tail is cut from a full group
    A = gen.nm_sparse(m, k, n=n, m_group=g, axis=axis, seed=2)
    M = A.mask() if axis == "row" else A.mask().T
    rows, cols = M.shape
    full = cols // g
    groups = M[:, : full * g].reshape(rows, full, g).sum(-1)
    assert np.all(groups == n)
    assert np.all(M[:, full * g:].sum(-1) <= n)


def test_nm_violations_add_one_nonzero_to_that_fraction_of_groups():
    A = gen.nm_sparse(512, 512, n=2, m_group=4, violations=0.05, seed=8)
    groups = A.mask().reshape(512, 128, 4).sum(-1)
    assert set(np.unique(groups)) <= {2, 3}
    assert abs((groups == 3).mean() - 0.05) < 0.01


def test_pruned_rows_and_columns():
    A = gen.row_pruned(200, 64, prune_fraction=0.35, density=1.0, seed=1)
    lengths = A.row_lengths()
    assert np.count_nonzero(lengths == 0) == 70 and np.all((lengths == 0) | (lengths == 64))
    assert A.meta["generator"]["kept_rows"] == 130
    B = gen.column_pruned(64, 200, prune_fraction=0.6, density=0.5, seed=1)
    col_len = B.mask().sum(axis=0)
    assert np.count_nonzero(col_len == 0) == 120
    assert abs(B.nnz / (80 * 64) - 0.5) < 0.05


def test_banded_and_laplacian():
    A = gen.banded(120, 100, bandwidth=5, fill=1.0)
    i, j = np.nonzero(A.mask())
    assert np.abs(i - j).max() == 5
    expected = sum(1 for r in range(120) for c in range(100) if abs(r - c) <= 5)
    assert A.nnz == expected
    F = gen.banded(300, 300, bandwidth=7, fill=0.3, seed=2)
    d = F.mask()
    assert np.all(np.diag(d)), "the diagonal is always kept"
    i, j = np.nonzero(d)
    assert np.abs(i - j).max() <= 7
    L = gen.laplacian_2d(7, 5)
    dense = L.to_dense()
    n = 35
    assert L.shape == (n, n) and L.nnz == 5 * n - 2 * 7 - 2 * 5
    assert np.array_equal(dense, dense.T) and np.all(np.diag(dense) == 4.0)
    assert np.linalg.eigvalsh(dense).min() > 0, "the Dirichlet Laplacian is positive definite"
    interior = 7 * 2 + 3       # grid point (3, 2): all four neighbours inside
    assert dense[interior].sum() == 0.0


def test_laplacian_3d_is_the_seven_point_stencil():
    nx, ny, nz = 4, 3, 5
    L = gen.laplacian_3d(nx, ny, nz)
    n = nx * ny * nz
    dense = L.to_dense()
    assert_canonical(L, (n, n))
    assert L.nnz == 7 * n - 2 * (ny * nz + nx * nz + nx * ny)
    assert np.array_equal(dense, dense.T) and np.all(np.diag(dense) == 6.0)
    assert np.linalg.eigvalsh(dense).min() > 0
    interior = (2 * ny + 1) * nx + 1          # grid point (1, 1, 2): all six neighbours inside
    assert dense[interior].sum() == 0.0 and np.count_nonzero(dense[interior]) == 7
    i, j = np.nonzero(dense)
    assert np.abs(i - j).max() == nx * ny


def _gaussian_weights(m, k, seed):
    """The dense weights the magnitude generators draw (one chunk of rows at these sizes)."""
    return np.random.default_rng(seed).standard_normal((m, k), dtype=np.float32)


@pytest.mark.parametrize("sparsity", [0.0, 0.5, 0.7, 0.9, 1.0])
def test_magnitude_pruning_keeps_the_largest_weights_of_every_row(sparsity):
    m, k = 37, 51
    A = gen.magnitude_pruned(m, k, sparsity, seed=5)
    W = _gaussian_weights(m, k, 5)
    keep = k - round(sparsity * k)
    assert np.all(A.row_lengths() == keep), "every row holds the same nnz"
    mask = A.mask()
    for r in range(m):
        kept, dropped = np.abs(W[r][mask[r]]), np.abs(W[r][~mask[r]])
        if kept.size and dropped.size:
            assert kept.min() >= dropped.max()
    assert np.array_equal(A.to_dense()[mask], W[mask]), "the kept values are the weights themselves"
    H = gen.magnitude_pruned(m, k, sparsity, seed=5, dtype="float16")
    assert np.array_equal(H.data, W[mask].astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("n,g,k", [(2, 4, 64), (4, 8, 64), (2, 4, 30), (1, 2, 9)])
def test_nm_magnitude_pruning_keeps_the_n_largest_of_every_group(n, g, k):
    m = 20
    A = gen.nm_magnitude_pruned(m, k, n=n, m_group=g, seed=2)
    W = np.abs(_gaussian_weights(m, k, 2))
    mask = A.mask()
    for r in range(m):
        for c0 in range(0, k, g):
            group, kept = W[r, c0:c0 + g], mask[r, c0:c0 + g]
            assert kept.sum() == min(n, group.size)
            if (~kept).any():
                assert group[kept].min() >= group[~kept].max()
    from sparseditto.analysis import analyze

    assert analyze(A).pattern == "nm"


def test_rmat_is_heavy_tailed_and_merges_duplicates():
    A = gen.rmat(11, edge_factor=16, seed=0, permute=False)
    assert A.shape == (2048, 2048)
    assert A.nnz < 16 * 2048, "duplicate edges are merged"
    deg = A.row_lengths()
    assert deg.max() > 10 * deg.mean()
    assert deg[:64].sum() > deg[-64:].sum() * 20, "without permutation the hubs sit at low indices"
    P = gen.rmat(11, edge_factor=16, seed=0, permute=True)
    assert P.nnz == A.nnz and np.array_equal(np.sort(P.row_lengths()), np.sort(deg))


@pytest.mark.parametrize("call,match", [
    (lambda: gen.unstructured(0, 5, 0.5), "positive integer"),
    (lambda: gen.unstructured(5, 5, 1.5), "sparsity"),
    (lambda: gen.block_sparse(8, 8, (4,), 0.5), "block=\\(bm, bk\\)"),
    (lambda: gen.block_sparse(8, 8, (4, 4), 0.0), "block_density"),
    (lambda: gen.nm_sparse(8, 8, n=5, m_group=4), "n <= m_group"),
    (lambda: gen.nm_sparse(8, 8, axis="diag"), "axis"),
    (lambda: gen.banded(8, 8, bandwidth=-1), "bandwidth"),
    (lambda: gen.rmat(10, a=0.6, b=0.3, c=0.3), "a \\+ b \\+ c"),
    (lambda: gen.unstructured(5, 5, 0.5, dtype="int8"), "dtype"),
    (lambda: gen.magnitude_pruned(5, 5, -0.1), "sparsity"),
    (lambda: gen.nm_magnitude_pruned(8, 8, n=3, m_group=2), "n <= m_group"),
    (lambda: gen.laplacian_3d(4, 0, 4), "positive integer"),
    (lambda: gen.make("spiral", m=4), "Unknown generator kind 'spiral'"),
    (lambda: gen.make("banded", m=4, k=4, width=2), "Bad arguments for generator 'banded'"),
])
def test_bad_input_raises_value_error_naming_the_problem(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_make_dispatches_class_and_function_names():
    assert gen.make("block", m=32, k=32, block=(8, 8), block_density=0.5).meta["generator"]["kind"] == "block"
    assert gen.make("power_law", scale=6).shape == (64, 64)
    assert gen.make("laplacian_2d", nx=3, ny=3).shape == (9, 9)


def test_labelled_suite_is_deterministic_and_covers_every_class():
    a = gen.labelled_suite(4, seed=1)
    assert a == gen.labelled_suite(4, seed=1)
    assert a != gen.labelled_suite(4, seed=2)
    assert {label for label, _, _ in a} == set(gen.SUITE_CLASSES)
    assert len(a) == 4 * len(gen.SUITE_CLASSES)
    for _, kind, kw in a:
        shape = gen.make(kind, **kw).shape
        assert shape[0] * shape[1] <= 4096 * 4096


def test_bundled_example_is_the_documented_2of4_matrix():
    """Regenerate with: nm_sparse(256, 256, n=2, m_group=4, axis='row', seed=0, dtype='float16'),
    written by scipy.io.mmwrite (comment line 'sparseditto: name=pruned_2of4_256x256 dtype=float16')
    and gzip (mtime=0)."""
    with gzip.open(EXAMPLE, "rb") as fh:
        head = fh.read(200).decode()
    assert head.startswith("%%MatrixMarket matrix coordinate real general")
    assert "dtype=float16" in head
    stored = sp.csr_array(scipy.io.mmread(EXAMPLE))
    expected = gen.nm_sparse(256, 256, n=2, m_group=4, axis="row", seed=0, dtype="float16")
    assert stored.shape == (256, 256) and stored.nnz == expected.nnz == 256 * 128
    assert np.array_equal(stored.toarray(), expected.to_dense())
    assert np.array_equal(stored.data.astype(np.float16).astype(np.float64), stored.data)


def test_bundled_demo_weight_is_the_documented_block_pruned_matrix():
    """The demo's weight: sparseditto.generate.block_sparse(1024, 4096, (64, 64), 0.05, seed=7,
    dtype="float16") stored dense as the safetensors tensor 'mlp.down_proj.weight', gzipped (mtime=0).
    It is the demo's because the roofline model honestly puts a sparse kernel (bsr_tc) well ahead of
    dense cuBLAS on the default A100 target."""
    from sparseditto.agents.costing import template_table
    from sparseditto.analysis import analyze
    from sparseditto.cli.commands import DEMO_EXAMPLE
    from sparseditto.io import list_tensors, load_matrix
    from sparseditto.targets import get_target

    assert list_tensors(DEMO_EXAMPLE) == {"mlp.down_proj.weight": "(1024, 4096) float16"}
    stored = load_matrix(DEMO_EXAMPLE)
    expected = gen.block_sparse(1024, 4096, (64, 64), 0.05, seed=7, dtype="float16")
    assert stored.dtype == "float16" and stored.nnz == expected.nnz
    np.testing.assert_array_equal(stored.indptr, expected.indptr)
    np.testing.assert_array_equal(stored.indices, expected.indices)
    np.testing.assert_array_equal(stored.data, expected.data)
    report = analyze(stored)
    assert report.pattern == "block" and tuple(report.best_block_shape) == (64, 64)
    table, _ = template_table(report.model_dump(mode="json"), 16, "float16", get_target("A100"),
                              exec_backend="interpret")
    best = min(table, key=lambda t: t["estimate_ms"])
    dense = next(t for t in table if t["name"] == "dense")
    assert best["name"] == "bsr_tc" and dense["estimate_ms"] / best["estimate_ms"] > 2.0
