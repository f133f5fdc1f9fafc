"""Storage formats: exact round trips on awkward shapes, N:M semantics, metadata packing, byte counts."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparseditto.formats import (
    BSR, CSR, ELL, FORMATS, BitmapTiles, BlockedELL, Compacted, NMCompressed, convert,
)
from sparseditto.matrix import SparseMatrix

ODD_SHAPES = [(1, 1), (1, 37), (37, 1), (7, 13), (97, 3), (3, 97), (16, 16), (5, 64), (33, 65)]
SETTINGS = settings(max_examples=100, deadline=None)


def matrix_from_mask(mask: np.ndarray, values: np.ndarray, dtype: str = "float32") -> SparseMatrix:
    """SparseMatrix storing exactly the entries where `mask` is set (stored zeros included)."""
    r, c = np.nonzero(mask)
    coo = sp.coo_array((values[r, c], (r, c)), shape=mask.shape)
    A = SparseMatrix.from_scipy(coo, dtype=dtype)
    assert A.nnz == int(mask.sum())  # explicit zeros must survive canonicalization
    return A


@st.composite
def sparse_matrices(draw, max_side: int = 40):
    """Odd shapes, empty / dense / single-line matrices, all-zero rows and columns, value ties."""
    if draw(st.booleans()):
        shape = draw(st.sampled_from(ODD_SHAPES))
    else:
        shape = (draw(st.integers(1, max_side)), draw(st.integers(1, max_side)))
    density = draw(st.sampled_from([0.0, 0.05, 0.3, 0.6, 1.0]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    mask = rng.random(shape) < density
    if draw(st.booleans()):  # knock out whole rows and columns
        mask[rng.random(shape[0]) < 0.3, :] = False
        mask[:, rng.random(shape[1]) < 0.3] = False
    if draw(st.booleans()):  # small integers: many magnitude ties and stored zeros
        values = rng.integers(-2, 3, size=shape).astype(np.float64)
    else:
        values = rng.standard_normal(shape)
    dtype = draw(st.sampled_from(["float32", "float64"]))
    return matrix_from_mask(mask, values, dtype)


FORMAT_PARAMS = {
    "csr": [{}, {"index_dtype": "int16"}],
    "bsr": [{"block_shape": (1, 1)}, {"block_shape": (2, 3)}, {"block_shape": (16, 16)},
            {"block_shape": (4, 1)}, {"block_shape": (128, 64)}],
    "nm": [{"n": 1, "m": 2}, {"n": 2, "m": 4}, {"n": 4, "m": 8}, {"n": 3, "m": 8}],
    "bitmap": [{"tile_k": 32}, {"tile_k": 16}, {"tile_k": 64}],
    "ell": [{}],
    "blocked_ell": [{"block_shape": (2, 2)}, {"block_shape": (3, 8)}, {"block_shape": (64, 64)}],
    "compact": [{}],
}


@pytest.mark.parametrize("fmt", sorted(FORMAT_PARAMS))
@SETTINGS
@given(A=sparse_matrices(), data=st.data())
def test_round_trip_is_exact(fmt, A, data):
    params = data.draw(st.sampled_from(FORMAT_PARAMS[fmt]))
    f = convert(A, fmt, **params)
    dense = f.to_dense()
    assert dense.dtype == np.float64 and dense.shape == A.shape
    np.testing.assert_array_equal(dense, A.to_dense())
    assert f.shape == A.shape
    value_arrays = [v for k, v in vars(f).items() if k in ("values", "blocks", "dense")]
    assert value_arrays and all(v.dtype == A.data.dtype for v in value_arrays)


def test_formats_registry_and_unknown_name():
    assert set(FORMATS) == {"csr", "bsr", "nm", "bitmap", "ell", "blocked_ell", "compact"}
    A = matrix_from_mask(np.eye(3, dtype=bool), np.ones((3, 3)))
    for name, cls in FORMATS.items():
        assert isinstance(convert(A, name), cls)
    with pytest.raises(ValueError, match="Unknown format 'coo'.*blocked_ell"):
        convert(A, "coo")
    with pytest.raises(ValueError, match="SparseMatrix, got ndarray"):
        CSR.from_matrix(np.eye(3))


# ---- N:M ----------------------------------------------------------------------------------------

@st.composite
def nm_conforming(draw):
    """Matrices with at most n stored entries in every group of m consecutive columns."""
    n, m = draw(st.sampled_from([(1, 2), (2, 4), (4, 8), (1, 4)]))
    M, K = draw(st.integers(1, 30)), draw(st.integers(1, 40))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    G = -(-K // m)
    score = rng.random((M, G * m))
    score[:, K:] = 2.0  # columns past K (padding) rank last; any picked there are cut off below
    keep_count = rng.integers(0, n + 1, size=(M, G, 1))
    ranks = np.argsort(np.argsort(score.reshape(M, G, m), axis=2), axis=2)
    mask = (ranks < keep_count).reshape(M, G * m)[:, :K]
    return matrix_from_mask(mask, rng.standard_normal((M, K))), n, m


def group_counts(A: SparseMatrix, m: int) -> np.ndarray:
    M, K = A.shape
    G = -(-K // m)
    padded = np.zeros((M, G * m), dtype=np.int64)
    padded[:, :K] = A.mask()
    return padded.reshape(M, G, m).sum(axis=2)


def decode_metadata(words: np.ndarray, slots: int, m: int) -> np.ndarray:
    """Reference decoder for NMCompressed.packed_metadata (independent of the encoder's code)."""
    bits = 2 if m <= 4 else 4
    per_word = 32 // bits
    u = words.view(np.uint32)
    out = np.zeros((words.shape[0], slots), dtype=np.int64)
    for j in range(slots):
        out[:, j] = (u[:, j // per_word] >> (bits * (j % per_word))) & ((1 << bits) - 1)
    return out


@SETTINGS
@given(case=nm_conforming())
def test_nm_conforming_has_no_residual(case):
    A, n, m = case
    nm = NMCompressed.from_matrix(A, n=n, m=m, strict=True)
    assert nm.residual is None and nm.violations == 0
    G = -(-A.cols // m)
    assert nm.values.shape == (A.rows, G * n) and nm.positions.shape == (A.rows, G * n)
    assert nm.positions.dtype == np.uint8
    np.testing.assert_array_equal(nm.to_dense(), A.to_dense())


@SETTINGS
@given(A=sparse_matrices(), nm_shape=st.sampled_from([(1, 2), (2, 4), (4, 8), (2, 8)]))
def test_nm_positions_violations_and_metadata(A, nm_shape):
    n, m = nm_shape
    nm = NMCompressed.from_matrix(A, n=n, m=m)
    counts = group_counts(A, m)
    expected_violations = int((counts > n).sum())
    assert nm.violations == expected_violations
    assert (nm.residual is None) == (expected_violations == 0)
    if nm.residual is not None:
        assert nm.residual.nnz == int(np.maximum(counts - n, 0).sum())
    M, S = nm.positions.shape
    pos = nm.positions.reshape(M, S // n, n).astype(np.int64)
    assert (pos < m).all()
    assert (np.diff(pos, axis=2) > 0).all(), "positions must strictly increase within each group"
    slot_cols = np.arange(S // n)[None, :, None] * m + pos
    inside = np.minimum(A.cols - np.arange(S // n) * m, m) >= n  # groups with >= n columns inside K
    assert (slot_cols[:, inside] < A.cols).all(), "padding slots must not leave K when they can fit"
    words = nm.packed_metadata()
    per_word = 16 if m <= 4 else 8
    assert words.dtype == np.int32 and words.shape == (M, -(-S // per_word))
    np.testing.assert_array_equal(decode_metadata(words, S, m), nm.positions)
    # The compressed part keeps the n largest magnitudes of each group.
    if nm.residual is not None:
        comp_abs = np.abs(nm.values.reshape(M, S // n, n)).astype(np.float64)
        g = nm.residual.indices.astype(np.int64) // m
        r = nm.residual.row_ids()
        assert (np.abs(nm.residual.values) <= comp_abs[r, g].min(axis=1)).all()


def test_nm_strict_reports_violations():
    mask = np.zeros((3, 9), dtype=bool)
    mask[1, 4:7] = True          # row 1, group 1: three entries for 2:4
    mask[2, :4] = True           # row 2, group 0: four entries
    A = matrix_from_mask(mask, np.arange(1.0, 28.0).reshape(3, 9))
    with pytest.raises(ValueError, match=r"2 of 9 groups violate 2:4.*row 1, group 1 \(columns 4..7\)"):
        NMCompressed.from_matrix(A, n=2, m=4, strict=True)
    nm = NMCompressed.from_matrix(A, n=2, m=4)
    assert nm.violations == 2
    # row 1 group 1 keeps the two largest (columns 5, 6 -> values 15, 16) and spills column 4 (14)
    np.testing.assert_array_equal(nm.residual.to_dense()[1], np.eye(9)[4] * 14.0)
    np.testing.assert_array_equal(nm.to_dense(), A.to_dense())


def test_nm_padding_positions_are_lowest_free_and_values_zero():
    mask = np.zeros((1, 8), dtype=bool)
    mask[0, 2] = True            # group 0: one entry at position 2 -> slots at positions (0, 2)
    A = matrix_from_mask(mask, np.full((1, 8), 5.0))
    nm = NMCompressed.from_matrix(A, n=2, m=4)
    np.testing.assert_array_equal(nm.positions, [[0, 2, 0, 1]])
    np.testing.assert_array_equal(nm.values, [[0.0, 5.0, 0.0, 0.0]])
    # K = 6: the last group has columns 4, 5 inside K, so its fillers must stay there
    tail = matrix_from_mask(np.array([[0, 0, 0, 0, 0, 1]], dtype=bool), np.full((1, 6), 3.0))
    nm_tail = NMCompressed.from_matrix(tail, n=2, m=4)
    np.testing.assert_array_equal(nm_tail.positions, [[0, 1, 0, 1]])
    np.testing.assert_array_equal(nm_tail.values, [[0.0, 0.0, 0.0, 3.0]])


@pytest.mark.parametrize("n, m", [(2, 2), (4, 4), (0, 4), (5, 4), (1, 1), (2, 17)])
def test_nm_bad_parameters(n, m):
    A = matrix_from_mask(np.ones((2, 8), dtype=bool), np.ones((2, 8)))
    with pytest.raises(ValueError, match=r"\b[nm]\b"):
        NMCompressed.from_matrix(A, n=n, m=m)


def test_nm_metadata_bit_order_by_hand():
    # 1 x 8 matrix, 2:4: group 0 keeps positions (1, 3), group 1 keeps (0, 2)
    mask = np.array([[0, 1, 0, 1, 1, 0, 1, 0]], dtype=bool)
    A = matrix_from_mask(mask, np.ones((1, 8)))
    nm = NMCompressed.from_matrix(A, n=2, m=4)
    # slot j occupies bits [2j, 2j+2): 1 | 3<<2 | 0<<4 | 2<<6
    assert nm.packed_metadata().tolist() == [[1 | (3 << 2) | (0 << 4) | (2 << 6)]]
    nm48 = NMCompressed.from_matrix(A, n=4, m=8)  # one group, nibbles: positions 1, 3, 4, 6
    assert nm48.packed_metadata().tolist() == [[1 | (3 << 4) | (4 << 8) | (6 << 12)]]


# ---- bitmap, BSR, ELL, compaction specifics ------------------------------------------------------

@SETTINGS
@given(A=sparse_matrices(max_side=70), tile_k=st.sampled_from([16, 32, 64]))
def test_bitmap_bits_and_offsets(A, tile_k):
    bt = BitmapTiles.from_matrix(A, tile_k=tile_k)
    M, K = A.shape
    T = -(-K // tile_k)
    assert bt.masks.shape == (M, T) and bt.masks.dtype == {16: np.int16, 32: np.int32, 64: np.int64}[tile_k]
    u = bt.masks.view(bt.masks.dtype.str.replace("i", "u")).astype(np.uint64)
    bits = ((u[:, :, None] >> np.arange(tile_k, dtype=np.uint64)) & np.uint64(1)).astype(bool)
    padded = np.zeros((M, T * tile_k), dtype=bool)
    padded[:, :K] = A.mask()
    np.testing.assert_array_equal(bits.reshape(M, T * tile_k), padded)
    # tile offsets = row offset + stored entries in earlier segments of the row (the popcount rule)
    seg_counts = bits.sum(axis=2)
    expected = A.indptr[:-1, None] + np.cumsum(seg_counts, axis=1) - seg_counts
    np.testing.assert_array_equal(bt.tile_offsets, expected)
    np.testing.assert_array_equal(bt.row_offsets, A.indptr)
    np.testing.assert_array_equal(bt.values, A.data)


@SETTINGS
@given(A=sparse_matrices(), bs=st.sampled_from([(1, 1), (2, 3), (5, 2), (8, 8), (64, 128)]))
def test_bsr_keeps_exactly_the_touched_blocks(A, bs):
    bsr = BSR.from_matrix(A, block_shape=bs)
    bm, bk = bs
    Mb, Kb = -(-A.rows // bm), -(-A.cols // bk)
    assert bsr.padded_shape == (Mb * bm, Kb * bk)
    touched = np.zeros((Mb * bm, Kb * bk), dtype=bool)
    touched[: A.rows, : A.cols] = A.mask()
    occupied = touched.reshape(Mb, bm, Kb, bk).any(axis=(1, 3))
    assert bsr.nblocks == int(occupied.sum())
    assert bsr.indptr.dtype == np.int32 and bsr.indices.dtype == np.int32
    for br in range(Mb):
        ids = bsr.indices[bsr.indptr[br]: bsr.indptr[br + 1]]
        np.testing.assert_array_equal(ids, np.flatnonzero(occupied[br]))


def test_bsr_keeps_block_holding_only_a_stored_zero():
    mask = np.zeros((4, 4), dtype=bool)
    mask[3, 3] = True
    A = matrix_from_mask(mask, np.zeros((4, 4)))
    assert A.nnz == 1
    bsr = BSR.from_matrix(A, block_shape=(2, 2))
    assert bsr.nblocks == 1 and bsr.indices.tolist() == [1] and bsr.indptr.tolist() == [0, 0, 1]


def test_ell_width_rules():
    mask = np.array([[1, 1, 0], [0, 0, 0], [1, 0, 1]], dtype=bool)
    A = matrix_from_mask(mask, np.arange(1.0, 10.0).reshape(3, 3))
    ell = ELL.from_matrix(A)
    assert ell.cols.tolist() == [[0, 1], [-1, -1], [0, 2]]
    assert ell.values.tolist() == [[1, 2], [0, 0], [7, 9]]
    wide = ELL.from_matrix(A, width=5)
    assert wide.width == 5 and np.array_equal(wide.to_dense(), A.to_dense())
    with pytest.raises(ValueError, match="width.*longest row \\(2"):
        ELL.from_matrix(A, width=1)
    bell = BlockedELL.from_matrix(A, block_shape=(2, 2))
    assert bell.col_blocks.tolist() == [[0, -1], [0, 1]] and bell.blocks.shape == (2, 2, 2, 2)
    with pytest.raises(ValueError, match="width"):
        BlockedELL.from_matrix(A, block_shape=(2, 2), width=1)


def test_compacted_drops_empty_rows_and_columns():
    mask = np.zeros((5, 6), dtype=bool)
    mask[[1, 1, 3], [0, 4, 4]] = True
    A = matrix_from_mask(mask, np.arange(30.0).reshape(5, 6))
    c = Compacted.from_matrix(A)
    assert c.rows.tolist() == [1, 3] and c.cols.tolist() == [0, 4]
    assert c.dense.tolist() == [[6.0, 10.0], [0.0, 22.0]]
    empty = Compacted.from_matrix(matrix_from_mask(np.zeros((3, 2), dtype=bool), np.zeros((3, 2))))
    assert empty.dense.shape == (0, 0) and not empty.to_dense().any()


# ---- bytes, tensors, parameter errors ------------------------------------------------------------

def small_example() -> SparseMatrix:
    """4 x 8, nnz = 6, rows 2 and 3 empty, columns 3 and 6 empty, every 2:4 group conforms."""
    mask = np.array([
        [1, 0, 1, 0, 0, 0, 0, 1],
        [0, 1, 0, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0, 0, 0],
    ], dtype=bool)
    return matrix_from_mask(mask, np.arange(1.0, 33.0).reshape(4, 8))


def test_nbytes_match_hand_formulas():
    A = small_example()  # M=4, K=8, nnz=6
    vb = 2
    assert CSR.from_matrix(A).nbytes(vb) == 5 * 4 + 6 * 4 + 6 * 2
    assert CSR.from_matrix(A, index_dtype="int16").nbytes(vb) == 5 * 4 + 6 * 2 + 6 * 2
    # 2x4 blocks: block row 0 touches block cols 0 and 1; block row 1 empty -> 2 blocks
    assert BSR.from_matrix(A, block_shape=(2, 4)).nbytes(vb) == 3 * 4 + 2 * 4 + 2 * 8 * 2
    # 2:4 -> G = 2 groups, 4 slots per row; packed metadata: 1 int32 word per row
    nm = NMCompressed.from_matrix(A, n=2, m=4)
    assert nm.nbytes(vb) == 4 * 4 * 2 + 4 * 1 * 4
    assert nm.nbytes(vb, metadata="positions") == 4 * 4 * 2 + 4 * 4 * 1
    assert nm.nbytes(vb, metadata="both") == 4 * 4 * 2 + 4 * 4 + 4 * 4
    # bitmap tile 32: T = 1; masks 4 B + tile_offsets 4 B per (row, tile), row_offsets, values
    assert BitmapTiles.from_matrix(A).nbytes(vb) == 4 * 1 * 4 + 4 * 1 * 4 + 5 * 4 + 6 * 2
    assert BitmapTiles.from_matrix(A, tile_k=16).nbytes(vb) == 4 * 2 + 4 * 4 + 5 * 4 + 6 * 2
    assert ELL.from_matrix(A).nbytes(vb) == 4 * 3 * (4 + 2)
    assert BlockedELL.from_matrix(A, block_shape=(2, 4)).nbytes(vb) == 2 * 2 * 4 + 2 * 2 * 8 * 2
    assert Compacted.from_matrix(A).nbytes(vb) == 2 * 4 + 6 * 4 + 2 * 6 * 2
    assert CSR.from_matrix(A).nbytes(4) == 5 * 4 + 6 * 4 + 6 * 4


def test_nbytes_counts_what_to_torch_ships():
    A = small_example()
    for name in FORMATS:
        f = convert(A, name)
        shipped = sum(t.numel() * t.element_size() for t in f.to_torch(dtype=torch.float16).values())
        assert f.nbytes(2) == shipped, name
    bt = BitmapTiles.from_matrix(A)
    lean = bt.to_torch(tile_offsets=False)
    assert "tile_offsets" not in lean
    assert bt.nbytes(2, tile_offsets=False) == sum(t.numel() * t.element_size() for t in lean.values())
    assert bt.nbytes(2) - bt.nbytes(2, tile_offsets=False) == 4 * 1 * 4
    nm = NMCompressed.from_matrix(A)
    for md in ("packed", "positions", "both"):
        shipped = sum(t.numel() * t.element_size() for t in nm.to_torch(metadata=md).values())
        assert nm.nbytes(2, metadata=md) == shipped


EXPECTED_TENSORS = {
    "csr": {"indptr": torch.int32, "indices": torch.int32, "values": None},
    "bsr": {"indptr": torch.int32, "indices": torch.int32, "blocks": None},
    "nm": {"values": None, "metadata": torch.int32},
    "bitmap": {"masks": torch.int32, "tile_offsets": torch.int32, "row_offsets": torch.int32, "values": None},
    "ell": {"cols": torch.int32, "values": None},
    "blocked_ell": {"col_blocks": torch.int32, "blocks": None},
    "compact": {"rows": torch.int32, "cols": torch.int32, "dense": None},
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_to_torch_dtypes_and_shapes(fmt, dtype):
    A = small_example()
    f = convert(A, fmt)
    tensors = f.to_torch(device="cpu", dtype=dtype)
    assert set(tensors) == set(EXPECTED_TENSORS[fmt])
    for key, t in tensors.items():
        assert t.dtype == (EXPECTED_TENSORS[fmt][key] or dtype), (fmt, key)
        assert t.is_contiguous() and t.device.type == "cpu"
        source = f.packed_metadata() if key == "metadata" else getattr(f, key)
        assert tuple(t.shape) == source.shape
        np.testing.assert_array_equal(t.float().numpy(), source.astype(np.float32))


def test_to_torch_special_index_dtypes_and_residual():
    A = small_example()
    assert CSR.from_matrix(A, index_dtype="int16").to_torch()["indices"].dtype == torch.int16
    assert BitmapTiles.from_matrix(A, tile_k=64).to_torch()["masks"].dtype == torch.int64
    assert BitmapTiles.from_matrix(A, tile_k=16).to_torch()["masks"].dtype == torch.int16
    t = NMCompressed.from_matrix(A, n=1, m=4).to_torch(metadata="both")
    assert t["positions"].dtype == torch.uint8
    assert {"residual_indptr", "residual_indices", "residual_values"} <= set(t)
    assert t["residual_indptr"].dtype == torch.int32 and t["residual_values"].dtype == torch.float16


def test_int16_index_limit():
    limit_ok = SparseMatrix.from_scipy(sp.coo_array(([1.0], ([0], [32767])), shape=(1, 32768)))
    csr = CSR.from_matrix(limit_ok, index_dtype="int16")
    assert csr.indices.dtype == np.int16 and csr.indices.tolist() == [32767]
    too_wide = SparseMatrix.from_scipy(sp.coo_array(([1.0], ([0], [0])), shape=(1, 32769)))
    with pytest.raises(ValueError, match="K <= 32768.*K = 32769"):
        CSR.from_matrix(too_wide, index_dtype="int16")
    with pytest.raises(ValueError, match="index_dtype"):
        CSR.from_matrix(limit_ok, index_dtype="int8")


@pytest.mark.parametrize("fmt, params, message", [
    ("bsr", {"block_shape": (0, 4)}, "block_shape"),
    ("bsr", {"block_shape": (4,)}, "block_shape"),
    ("bsr", {"block_shape": (2.5, 2)}, "block_shape"),
    ("blocked_ell", {"block_shape": (-1, 2)}, "block_shape"),
    ("bitmap", {"tile_k": 8}, "tile_k"),
    ("bitmap", {"tile_k": 128}, "tile_k"),
    ("nm", {"n": 4, "m": 4}, "n must be"),
    ("nm", {"n": 2, "m": 32}, "m must be"),
    ("ell", {"width": -1}, "width"),
])
def test_bad_parameters_raise_value_error(fmt, params, message):
    with pytest.raises(ValueError, match=message):
        convert(small_example(), fmt, **params)


def test_nbytes_rejects_bad_value_bytes():
    with pytest.raises(ValueError, match="value_bytes"):
        CSR.from_matrix(small_example()).nbytes(0)


def test_float64_values_stay_float64():
    A = SparseMatrix.from_scipy(sp.random(9, 11, density=0.4, random_state=1, dtype=np.float64))
    assert A.data.dtype == np.float64
    for name in FORMATS:
        np.testing.assert_array_equal(convert(A, name).to_dense(), A.to_dense())


def test_bsr_on_a_huge_sparse_grid_without_densifying():
    """A 10^5 x 10^5 matrix with a handful of entries takes the sort path (block grid >> nnz)."""
    rows = np.array([0, 0, 5, 70000, 99999])
    cols = np.array([99998, 3, 3, 12, 0])
    A = SparseMatrix.from_scipy(sp.coo_array((np.arange(1.0, 6.0), (rows, cols)), shape=(100000, 100000)))
    bsr = BSR.from_matrix(A, block_shape=(8, 4))
    assert bsr.padded_shape == (100000, 100000) and bsr.nblocks == 4   # (0,3) and (5,3) share a block
    starts = bsr.indptr[[0, 8750, 12499]]
    assert bsr.indices[starts[0]: starts[0] + 2].tolist() == [0, 24999]
    assert bsr.indices[starts[1]] == 3 and bsr.indices[starts[2]] == 0
    np.testing.assert_array_equal(bsr.blocks[0][[0, 5], [3, 3]], [2.0, 3.0])
    assert bsr.blocks[1][0, 2] == 1.0 and bsr.blocks[2][0, 0] == 4.0 and bsr.blocks[3][7, 0] == 5.0
    assert bsr.blocks.sum() == 15.0
