"""load_matrix / save_matrix / list_tensors: every input kind, every file format, every error.

A known 6x5 matrix (values exactly representable in float16 and bfloat16) goes through each
path; the loaded SparseMatrix must reproduce it exactly. Real DLMC and SuiteSparse files are
loaded and their counts checked against numbers computed here independently of the parser.
"""
from __future__ import annotations

import gzip
import re

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp
import torch

from sparseditto.analysis import analyze
from sparseditto.io import list_tensors, load_matrix, save_matrix
from sparseditto.matrix import SparseMatrix

pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state")

# 6 x 5, 11 nonzeros, one empty row (3) and one empty column (4); all values exact in fp16/bf16.
KNOWN = np.array([
    [1.5, 0.0, -2.0, 0.0, 0.0],
    [0.0, 0.25, 0.0, 3.0, 0.0],
    [4.0, 0.0, 0.0, 0.0, 0.0],
    [0.0, 0.0, 0.0, 0.0, 0.0],
    [-0.5, 0.75, 2.5, 1.0, 0.0],
    [0.0, 0.0, -1.25, 0.0, 0.0],
])


def check_known(m: SparseMatrix, dtype: str | None = None) -> None:
    assert isinstance(m, SparseMatrix)
    assert m.shape == KNOWN.shape
    assert m.nnz == int((KNOWN != 0).sum())
    np.testing.assert_array_equal(m.to_dense(), KNOWN)
    if dtype is not None:
        assert m.dtype == dtype


def gz(path, data: bytes):
    path.write_bytes(gzip.compress(data))
    return path


# ---- in-memory inputs -------------------------------------------------------------------------
@pytest.mark.parametrize("np_dtype,name", [(np.float16, "float16"), (np.float32, "float32"),
                                           (np.float64, "float64"), (np.int32, "float32"),
                                           (np.uint8, "float32")])
def test_numpy_dense(np_dtype, name):
    src = KNOWN if np.dtype(np_dtype).kind == "f" else np.abs(KNOWN * 4)
    m = load_matrix(src.astype(np_dtype))
    assert m.dtype == name and m.name == "matrix"
    np.testing.assert_array_equal(m.to_dense(), src)
    assert m.data.dtype == (np.float64 if name == "float64" else np.float32)


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo", "bsr", "dia", "lil", "dok"])
def test_scipy_every_format(fmt):
    check_known(load_matrix(sp.csr_array(KNOWN).asformat(fmt)), "float64")
    check_known(load_matrix(sp.csr_matrix(KNOWN.astype(np.float32)).asformat(fmt)), "float32")


def test_scipy_drops_explicit_zero_and_sums_duplicates():
    coo = sp.coo_array((np.array([1.0, 0.0, 2.0, 3.0]), (np.array([0, 1, 2, 2]), np.array([0, 1, 2, 2]))),
                       shape=(3, 3))
    m = load_matrix(coo)
    assert m.nnz == 2  # the stored zero at (1, 1) is no nonzero; (2, 2) appears twice and is summed
    assert not m.mask()[1, 1] and m.to_dense()[2, 2] == 5.0
    assert m.meta["duplicates_summed"] == 1 and m.meta["explicit_zeros_dropped"] == 1
    assert analyze(coo).explicit_zeros_dropped == 1


def test_duplicates_summing_to_zero_are_dropped_too():
    coo = sp.coo_array((np.array([1.5, -1.5, 2.0]), (np.array([0, 0, 1]), np.array([0, 0, 1]))), shape=(2, 2))
    m = load_matrix(coo)
    assert m.nnz == 1 and m.meta["explicit_zeros_dropped"] == 1


def test_only_stored_zeros_is_no_pattern():
    with pytest.raises(ValueError, match="all 3 stored value"):
        load_matrix(sp.csr_array((np.zeros(3), np.array([0, 1, 2]), np.array([0, 1, 2, 3])), shape=(3, 3)))


def test_sparse_matrix_with_stored_zeros_is_cleaned_on_load_and_in_analysis():
    stored = SparseMatrix.from_scipy(sp.coo_array((np.array([1.0, 0.0, 2.0]), ([0, 1, 2], [0, 1, 2])), shape=(3, 3)))
    assert stored.nnz == 3 and stored.explicit_zeros() == 1   # SparseMatrix itself keeps what it is given
    loaded = load_matrix(stored)
    assert loaded.nnz == 2 and loaded.meta["explicit_zeros_dropped"] == 1
    report = analyze(stored)
    assert report.nnz == 2 and report.explicit_zeros_dropped == 1
    assert report.signature == analyze(sp.csr_array(stored.to_dense())).signature


def test_scipy_input_not_modified():
    csr = sp.csr_array((np.array([2.0, 1.0]), np.array([1, 0]), np.array([0, 2])), shape=(1, 2))
    load_matrix(csr)
    np.testing.assert_array_equal(csr.indices, [1, 0])  # unsorted input stays as the caller left it


@pytest.mark.parametrize("tdtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_torch_dense_dtypes(tdtype):
    t = torch.tensor(KNOWN).to(tdtype).requires_grad_(True)
    m = load_matrix(t)
    check_known(m, str(tdtype).replace("torch.", ""))
    assert m.meta["format"] == "torch_dense" and m.meta["device"] == "cpu"


def test_torch_integer_dense_is_float32():
    m = load_matrix(torch.tensor((KNOWN * 4).astype(np.int64)))
    assert m.dtype == "float32"
    np.testing.assert_array_equal(m.to_dense(), KNOWN * 4)


@pytest.mark.parametrize("layout", ["coo", "csr", "csc"])
@pytest.mark.parametrize("tdtype", [torch.float16, torch.bfloat16, torch.float32])
def test_torch_sparse_layouts(layout, tdtype):
    dense = torch.tensor(KNOWN, dtype=tdtype)
    t = {"coo": dense.to_sparse_coo, "csr": dense.to_sparse_csr, "csc": dense.to_sparse_csc}[layout]()
    m = load_matrix(t)
    check_known(m, str(tdtype).replace("torch.", ""))
    assert m.meta["format"] == f"torch_sparse_{layout}"


@pytest.mark.parametrize("layout", ["bsr", "bsc"])
def test_torch_block_layouts_drop_the_zeros_inside_blocks(layout):
    dense = torch.zeros(4, 6)
    dense[0:2, 2:4] = torch.tensor([[1.0, 0.0], [2.0, 3.0]])  # block with a stored zero
    dense[2:4, 4:6] = torch.tensor([[4.0, 5.0], [6.0, 7.0]])
    t = dense.to_sparse_bsr((2, 2)) if layout == "bsr" else dense.to_sparse_bsc((2, 2))
    m = load_matrix(t)
    assert m.nnz == 7  # both 2x2 blocks, without the stored zero at (0, 3)
    np.testing.assert_array_equal(m.to_dense(), dense.numpy())
    assert not m.mask()[0, 3] and m.meta["block_size"] == [2, 2] and m.meta["explicit_zeros_dropped"] == 1


def test_bsr_tensor_of_a_90_percent_sparse_weight_analyzes_like_its_dense_form():
    """A torch BSR tensor stores every entry of a kept block; an unstructured 90%-sparse weight
    stored that way holds mostly zeros. Its analysis must be that of the dense weight."""
    from sparseditto import generate

    A = generate.unstructured(128, 96, 0.9, seed=3)
    dense = A.to_torch(dtype=torch.float16)
    bsr = dense.to_sparse_bsr((16, 16))
    assert bsr.values().numel() > 5 * A.nnz          # what "analyzed as dense" looked like
    from_bsr, from_dense = analyze(bsr), analyze(dense)
    assert from_bsr.explicit_zeros_dropped == bsr.values().numel() - A.nnz
    assert from_dense.explicit_zeros_dropped == 0
    skip = {"analysis_seconds", "explicit_zeros_dropped"}
    assert from_bsr.model_dump(exclude=skip) == from_dense.model_dump(exclude=skip)
    assert from_bsr.pattern == "unstructured" and from_bsr.nnz == A.nnz


def test_torch_sparse_int64_values_are_float32():
    t = torch.sparse_coo_tensor(torch.tensor([[0, 2], [1, 0]]), torch.tensor([3, 7]), (3, 2), check_invariants=True)
    m = load_matrix(t)
    assert m.dtype == "float32" and m.data.dtype == np.float32
    np.testing.assert_array_equal(m.to_dense(), [[0, 3], [0, 0], [7, 0]])


def test_sparse_matrix_passthrough_and_overrides():
    m = load_matrix(KNOWN)
    assert load_matrix(m) is m
    renamed = load_matrix(m, name="w", dtype="float64")
    assert renamed.name == "w" and renamed.dtype == "float64" and renamed.data.dtype == np.float64
    assert load_matrix(KNOWN, dtype=torch.bfloat16).dtype == "bfloat16"
    assert load_matrix(KNOWN, name="layer0").name == "layer0"


@pytest.mark.gpu
def test_torch_cuda_tensor_moves_to_cpu():
    t = torch.tensor(KNOWN, dtype=torch.float16, device="cuda")
    for src in (t, t.to_sparse_csr()):
        m = load_matrix(src)
        check_known(m, "float16")
        assert m.meta["device"].startswith("cuda")


# ---- files ------------------------------------------------------------------------------------
def test_mtx_scipy_written_plain_gz_and_gz_without_suffix(tmp_path):
    scipy.io.mmwrite(tmp_path / "known.mtx", sp.coo_array(KNOWN))
    m = load_matrix(tmp_path / "known.mtx")
    check_known(m, "float64")
    assert m.name == "known" and m.meta["format"] == "mtx" and m.meta["gzip"] is False
    raw = (tmp_path / "known.mtx").read_bytes()
    for target in (tmp_path / "z.mtx.gz", tmp_path / "hidden_gzip.mtx"):  # magic bytes, not suffix
        m = load_matrix(str(gz(target, raw)))
        check_known(m)
        assert m.meta["gzip"] is True
    assert load_matrix(tmp_path / "z.mtx.gz").name == "z"


def test_mtx_symmetric_expansion_exact(tmp_path):
    text = ("%%MatrixMarket matrix coordinate real symmetric\n% comment\n%another\n\n"
            "4 4 5\n1 1 2.0\n2 1 -1.0\n3 2 0.5\n4 4 7\n4 1 3\n")
    m = load_matrix(gz(tmp_path / "sym.mtx.gz", text.encode()))
    expected = np.array([[2.0, -1.0, 0, 3], [-1.0, 0, 0.5, 0], [0, 0.5, 0, 0], [3, 0, 0, 7]])
    np.testing.assert_array_equal(m.to_dense(), expected)
    assert m.nnz == 8 and m.meta["mm_symmetry"] == "symmetric"


def test_mtx_skew_symmetric_expansion_exact(tmp_path):
    text = "%%MatrixMarket matrix coordinate real skew-symmetric\n3 3 2\n2 1 1.5\n3 1 -2\n"
    (tmp_path / "skew.mtx").write_text(text)
    expected = np.array([[0, -1.5, 2.0], [1.5, 0, 0], [-2.0, 0, 0]])
    np.testing.assert_array_equal(load_matrix(tmp_path / "skew.mtx").to_dense(), expected)


def test_mtx_pattern_values_seeded(tmp_path):
    text = "%%MatrixMarket matrix coordinate pattern symmetric\n5 5 6\n2 1\n3 1\n4 2\n5 5\n5 3\n1 1\n"
    path = tmp_path / "pat.mtx"
    path.write_text(text)
    a, b, c = load_matrix(path, seed=0), load_matrix(path, seed=0), load_matrix(path, seed=1)
    assert a.nnz == 10 and a.dtype == "float32"
    np.testing.assert_array_equal(a.data, b.data)
    assert not np.array_equal(a.data, c.data)
    np.testing.assert_array_equal(a.indices, c.indices)
    dense = a.to_dense()
    np.testing.assert_array_equal(dense, dense.T)  # a mirrored entry carries the same value
    assert np.all(a.data != 0)
    assert a.meta["seed"] == 0 and c.meta["seed"] == 1 and a.meta["values"] == "seeded_normal"


def test_mtx_integer_field_is_float32(tmp_path):
    (tmp_path / "int.mtx").write_text("%%MatrixMarket matrix coordinate integer general\n2 3 2\n1 3 7\n2 1 -4\n")
    m = load_matrix(tmp_path / "int.mtx")
    assert m.dtype == "float32"
    np.testing.assert_array_equal(m.to_dense(), [[0, 0, 7], [-4, 0, 0]])


def test_mtx_array_general_and_symmetric(tmp_path):
    scipy.io.mmwrite(tmp_path / "dense.mtx", KNOWN)  # array layout, column-major
    assert "array" in (tmp_path / "dense.mtx").read_text().splitlines()[0]
    check_known(load_matrix(tmp_path / "dense.mtx"))
    (tmp_path / "sa.mtx").write_text("%%MatrixMarket matrix array real symmetric\n3 3\n1\n2\n0\n4\n5\n6\n")
    np.testing.assert_array_equal(load_matrix(tmp_path / "sa.mtx").to_dense(),
                                  [[1, 2, 0], [2, 4, 5], [0, 5, 6]])


def smtx_text(dense: np.ndarray) -> str:
    csr = sp.csr_array(dense)
    return (f"{dense.shape[0]}, {dense.shape[1]}, {csr.nnz}\n" + " ".join(map(str, csr.indptr)) + " \n"
            + " ".join(map(str, csr.indices)) + " \n")


def test_smtx_plain_and_gz_seeded(tmp_path):
    text = smtx_text(KNOWN)
    plain = tmp_path / "layer.smtx"
    plain.write_text(text)
    zipped = gz(tmp_path / "layer.smtx.gz", text.encode())
    a, b, c = load_matrix(plain), load_matrix(zipped), load_matrix(zipped, seed=7)
    for m in (a, b, c):
        np.testing.assert_array_equal(m.mask(), KNOWN != 0)
        assert m.dtype == "float32" and m.name == "layer"
    np.testing.assert_array_equal(a.data, b.data)
    assert not np.array_equal(a.data, c.data)
    assert b.meta == {**b.meta, "format": "smtx", "gzip": True, "seed": 0, "source": str(zipped)}


def test_npz_scipy_and_numpy_archives(tmp_path):
    sp.save_npz(tmp_path / "csr.npz", sp.csr_array(KNOWN.astype(np.float32)))
    sp.save_npz(tmp_path / "coo.npz", sp.coo_matrix(KNOWN))
    check_known(load_matrix(tmp_path / "csr.npz"), "float32")
    check_known(load_matrix(tmp_path / "coo.npz"), "float64")
    np.savez(tmp_path / "one.npz", KNOWN.astype(np.float16))
    check_known(load_matrix(tmp_path / "one.npz"), "float16")
    np.savez(tmp_path / "two.npz", w=KNOWN.astype(np.float32), b=np.ones(3))
    m = load_matrix(tmp_path / "two.npz", tensor="w")
    check_known(m, "float32")
    assert m.meta["tensor"] == "w" and m.name == "two:w"
    raw = (tmp_path / "two.npz").read_bytes()
    check_known(load_matrix(gz(tmp_path / "two.npz.gz", raw), tensor="w"))


def test_pt_tensor_state_dict_nested_and_sparse(tmp_path):
    torch.save(torch.tensor(KNOWN, dtype=torch.bfloat16), tmp_path / "t.pt")
    check_known(load_matrix(tmp_path / "t.pt"), "bfloat16")
    sd = {"fc1.weight": torch.tensor(KNOWN, dtype=torch.float16), "fc1.bias": torch.zeros(6)}
    torch.save(sd, tmp_path / "sd.pth")
    check_known(load_matrix(tmp_path / "sd.pth", tensor="fc1.weight"), "float16")
    torch.save({"model": sd, "epoch": 3}, tmp_path / "ckpt.pt")
    check_known(load_matrix(tmp_path / "ckpt.pt", tensor="model.fc1.weight"), "float16")
    torch.save({"w": torch.tensor(KNOWN).to_sparse_csr()}, tmp_path / "sparse.pt")
    check_known(load_matrix(tmp_path / "sparse.pt"), "float64")
    raw = (tmp_path / "sd.pth").read_bytes()
    check_known(load_matrix(gz(tmp_path / "sd.pth.gz", raw), tensor="fc1.weight"), "float16")


def test_safetensors_plain_and_gz(tmp_path):
    from safetensors.torch import save_file

    save_file({"a.weight": torch.tensor(KNOWN, dtype=torch.bfloat16), "a.bias": torch.ones(6)},
              str(tmp_path / "m.safetensors"))
    m = load_matrix(tmp_path / "m.safetensors", tensor="a.weight")
    check_known(m, "bfloat16")
    assert m.meta["format"] == "safetensors" and m.meta["tensor"] == "a.weight"
    raw = (tmp_path / "m.safetensors").read_bytes()
    check_known(load_matrix(gz(tmp_path / "m.safetensors.gz", raw), tensor="a.weight"), "bfloat16")
    assert list_tensors(tmp_path / "m.safetensors") == {"a.weight": "(6, 5) bfloat16", "a.bias": "(6,) float32"}


def test_list_tensors_pt_and_npz(tmp_path):
    torch.save({"enc": {"w": torch.zeros(2, 3)}, "step": 1}, tmp_path / "c.pt")
    assert list_tensors(tmp_path / "c.pt") == {"enc.w": "(2, 3) float32"}
    np.savez(tmp_path / "a.npz", x=np.zeros((4, 2), np.float16))
    assert list_tensors(tmp_path / "a.npz") == {"x": "(4, 2) float16"}


@pytest.mark.parametrize("suffix", [".mtx", ".mtx.gz", ".npz", ".smtx.gz"])
def test_save_matrix_round_trip(tmp_path, suffix):
    m = load_matrix(KNOWN.astype(np.float32), name="rt")
    out = save_matrix(m, tmp_path / f"rt{suffix}")
    back = load_matrix(out)
    np.testing.assert_array_equal(back.indptr, m.indptr)
    np.testing.assert_array_equal(back.indices, m.indices)
    if suffix != ".smtx.gz":  # .smtx stores no values
        np.testing.assert_array_equal(back.data, m.data)
        assert back.dtype == "float32"


def test_save_matrix_mtx_keeps_dtype_name_and_exact_values(tmp_path):
    rng = np.random.default_rng(3)
    dense = rng.standard_normal((20, 30)) * (rng.random((20, 30)) < 0.2)
    for dtype in ("float16", "float64"):
        m = load_matrix(dense, dtype=dtype, name="schicht ü 1")  # spaces and non-ASCII in the name
        back = load_matrix(save_matrix(m, tmp_path / f"{dtype}.mtx"))
        assert back.dtype == dtype
        np.testing.assert_array_equal(back.data, m.data)


# ---- errors -----------------------------------------------------------------------------------
def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_error_non_2d_message_exact():
    with pytest.raises(ValueError, match=re.escape("Expected a 2-D matrix, got 3-D tensor of shape (2, 3, 4).")):
        load_matrix(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match=re.escape("got 1-D array of shape (5,)")):
        load_matrix(np.ones(5))


def gz_corrupt(path):
    path.write_bytes(b"\x1f\x8b\x08\x00garbage")
    return path


MTX = "%%MatrixMarket matrix coordinate real general\n"
ERROR_CASES = {
    "empty shape": (lambda p: np.zeros((0, 5)), ["non-empty", "(0, 5)"]),
    "empty torch": (lambda p: torch.zeros(3, 0), ["non-empty", "(3, 0)"]),
    "no nonzeros dense": (lambda p: np.zeros((3, 4)), ["no nonzeros", "(3, 4)"]),
    "no nonzeros file": (lambda p: write(p, "e.mtx", MTX + "3 3 0\n"), ["no nonzeros", "e.mtx"]),
    "nan and inf": (lambda p: np.array([[1.0, 0, 0], [0, 0, np.nan], [np.inf, 0, np.nan]]),
                    ["3 NaN/Inf", "row 1, column 2"]),
    "nan in file": (lambda p: write(p, "n.mtx", MTX + "2 2 2\n1 1 1\n2 2 nan\n"),
                    ["1 NaN/Inf", "row 1, column 1", "n.mtx"]),
    "overflow to inf as float32": (lambda p: write(p, "big.mtx", MTX + "% sparseditto: dtype=float32\n1 2 1\n1 1 1e300\n"),
                                   ["1 NaN/Inf", "inf at (row 0, column 0)"]),
    "complex torch": (lambda p: torch.ones(2, 2, dtype=torch.complex64), ["Unsupported value dtype", "complex64"]),
    "bool torch": (lambda p: torch.ones(2, 2, dtype=torch.bool), ["Unsupported value dtype", "bool"]),
    "complex numpy": (lambda p: np.ones((2, 2), np.complex128), ["Unsupported value dtype", "complex128"]),
    "string numpy": (lambda p: np.array([["a", "b"]]), ["Unsupported value dtype"]),
    "bool scipy": (lambda p: sp.csr_array(np.eye(2, dtype=bool)), ["Unsupported value dtype", "bool"]),
    "complex mtx": (lambda p: write(p, "c.mtx", "%%MatrixMarket matrix coordinate complex general\n1 1 1\n1 1 1 2\n"),
                    ["complex", "c.mtx"]),
    "unknown format": (lambda p: write(p, "w.csv", "1,2"), ["Unknown matrix file format", "w.csv", ".mtx", ".smtx",
                                                           ".npz", ".pt", ".safetensors"]),
    "missing file": (lambda p: p / "nope.mtx", ["not found", "nope.mtx"]),
    "directory": (lambda p: p, ["directory"]),
    "unsupported type": (lambda p: [[1.0, 2.0]], ["Unsupported matrix source", "list"]),
    "bad dtype override": (lambda p: (KNOWN, {"dtype": "int8"}), ["dtype override", "int8", "float16"]),
    "tensor= on in-memory": (lambda p: (KNOWN, {"tensor": "w"}), ["tensor='w'", "in-memory"]),
    "tensor= on mtx": (lambda p: (write(p, "k.mtx", MTX + "1 1 1\n1 1 1\n"), {"tensor": "w"}), ["single matrix"]),
    "truncated mtx": (lambda p: write(p, "t.mtx", MTX + "3 3 4\n1 1 1\n2 2 2\n3 3 3\n"),
                      ["truncated", "declares 4 entries", "ends early", "t.mtx"]),
    "mtx bad token": (lambda p: write(p, "b.mtx", MTX + "2 2 2\n1 1 1\n2 x 2\n"),
                      ["malformed line 4", "'2 x 2'", "b.mtx"]),
    "mtx fractional index": (lambda p: write(p, "f.mtx", MTX + "2 2 1\n1.5 1 1\n"),
                             ["malformed line 3", "'1.5 1 1'", "indices are integers"]),
    "mtx out of range": (lambda p: write(p, "o.mtx", MTX + "2 2 2\n1 1 1\n3 1 2\n"),
                         ["out-of-range", "line 4", "(3, 1)", "2 x 2", "o.mtx"]),
    "mtx zero index": (lambda p: write(p, "z.mtx", MTX + "2 2 1\n0 1 1\n"), ["out-of-range", "(0, 1)"]),
    "mtx no header": (lambda p: write(p, "h.mtx", "2 2 1\n1 1 1\n"), ["%%MatrixMarket", "h.mtx"]),
    "mtx bad size line": (lambda p: write(p, "s.mtx", MTX + "2 2\n1 1 1\n"), ["size line", "rows cols nnz"]),
    "mtx symmetric not square": (lambda p: write(p, "q.mtx", MTX.replace("general", "symmetric") + "2 3 1\n1 1 1\n"),
                                 ["square", "2 x 3"]),
    "mtx skew diagonal": (lambda p: write(p, "k.mtx", MTX.replace("general", "skew-symmetric") + "2 2 1\n1 1 1\n"),
                          ["skew-symmetric", "diagonal"]),
    "smtx truncated offsets": (lambda p: write(p, "t.smtx", "3, 3, 2\n0 1 2\n0 1\n"),
                               ["truncated", "expected 4 row offsets", "found 3", "t.smtx"]),
    "smtx truncated indices": (lambda p: write(p, "i.smtx", "3, 3, 3\n0 1 2 3\n0 1\n"),
                               ["nnz = 3", "found 2"]),
    "smtx offsets disagree": (lambda p: write(p, "d.smtx", "2, 3, 2\n0 1 3\n0 1\n"), ["end at nnz = 2", "3"]),
    "smtx decreasing offsets": (lambda p: write(p, "r.smtx", "3, 3, 2\n0 2 1 2\n0 1\n"), ["decrease at row 1"]),
    "smtx out of range": (lambda p: write(p, "o.smtx", "2, 3, 2\n0 1 2\n0 3\n"), ["out-of-range", "(1, 3)", "2 x 3"]),
    "smtx bad header": (lambda p: write(p, "h.smtx", "2 by 3\n0 1 2\n0 1\n"), ["malformed .smtx header"]),
    "corrupt gzip": (lambda p: gz_corrupt(p / "c.mtx.gz"), ["corrupt or truncated gzip", "c.mtx.gz"]),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_errors_name_the_problem(tmp_path, case):
    make, keywords = ERROR_CASES[case]
    src = make(tmp_path)
    src, kwargs = src if isinstance(src, tuple) else (src, {})
    with pytest.raises(ValueError) as info:
        load_matrix(src, **kwargs)
    for word in keywords:
        assert word in str(info.value), f"{word!r} missing from: {info.value}"


def test_error_tensor_selection_lists_names(tmp_path):
    from safetensors.torch import save_file

    save_file({"enc.w": torch.ones(2, 2), "dec.w": torch.ones(3, 3)}, str(tmp_path / "m.safetensors"))
    torch.save({"enc.w": torch.ones(2, 2), "dec.w": torch.ones(3, 3)}, tmp_path / "m.pt")
    np.savez(tmp_path / "m.npz", enc=np.ones((2, 2)), dec=np.ones((3, 3)))
    for path in ("m.safetensors", "m.pt", "m.npz"):
        with pytest.raises(ValueError, match="pass tensor=NAME") as info:
            load_matrix(tmp_path / path)
        assert "2 tensors" in str(info.value) and path in str(info.value)
        assert "dec" in str(info.value) and "(3, 3)" in str(info.value)
        with pytest.raises(ValueError, match="not found") as info:
            load_matrix(tmp_path / path, tensor="enc.W")
        assert "Names present" in str(info.value) and "dec" in str(info.value)
    with pytest.raises(ValueError, match="Did you mean 'enc.w'"):
        load_matrix(tmp_path / "m.pt", tensor="enc.W")


def test_error_pickled_module_refused(tmp_path):
    torch.save(torch.nn.Linear(2, 2), tmp_path / "module.pt")
    with pytest.raises(ValueError, match="state_dict") as info:
        load_matrix(tmp_path / "module.pt")
    assert "module.pt" in str(info.value)


def test_error_hybrid_and_meta_tensors():
    hybrid = torch.sparse_coo_tensor(torch.tensor([[0, 1]]), torch.ones(2, 3), (2, 3), check_invariants=True)
    with pytest.raises(ValueError, match="hybrid"):
        load_matrix(hybrid)
    with pytest.raises(ValueError, match="meta"):
        load_matrix(torch.empty(2, 2, device="meta"))


# ---- real matrices ----------------------------------------------------------------------------
def test_every_dlmc_file_loads_with_header_counts(shared_data):
    files = sorted((shared_data / "dlmc").rglob("*.smtx.gz"))
    assert len(files) >= 100
    for path in files:
        with gzip.open(path, "rt") as fh:
            rows, cols, nnz = (int(x) for x in fh.readline().split(","))
        m = load_matrix(path)
        assert (m.shape, m.nnz) == ((rows, cols), nnz), path
        assert m.name == path.name[: -len(".smtx.gz")] and m.dtype == "float32"


def test_every_suitesparse_file_loads_with_expanded_counts(shared_data):
    files = sorted((shared_data / "suitesparse").glob("*.mtx*"))
    assert len(files) >= 18
    for path in files:
        with gzip.open(path, "rt") as fh:
            banner = fh.readline().lower().split()
            line = fh.readline()
            while line.startswith("%"):
                line = fh.readline()
            rows, cols, nnz = (int(x) for x in line.split())
            entries = np.loadtxt(fh, dtype=np.float64, ndmin=2)
        assert len(entries) == nnz
        if banner[3] != "pattern":   # stored zeros (zenios holds 25877 of them) are no nonzeros
            entries = entries[entries[:, 2] != 0]
        ij = entries[:, :2].astype(np.int64)
        expected = len(ij) if banner[4] == "general" else 2 * len(ij) - int((ij[:, 0] == ij[:, 1]).sum())
        m = load_matrix(path)
        assert (m.shape, m.nnz) == ((rows, cols), expected), path
        if banner[4] == "general":
            assert m.meta.get("explicit_zeros_dropped", 0) == nnz - len(entries), path
        if banner[3] != "pattern":  # values agree with scipy's own reader
            with gzip.open(path) as fh:
                ref = sp.csr_array(scipy.io.mmread(fh))
            assert abs(m.to_scipy() - ref).max() == 0, path


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_dense_tensor_to_csr_matches_scipy_exactly(dtype):
    """The torch scan (nonzero + row counts) gives scipy's CSR of the same dense tensor: same
    row pointers, sorted columns, values; -0.0 is a zero, a NaN is kept and refused by name."""
    import scipy.sparse as sp
    import torch

    g = torch.Generator().manual_seed(5)
    w = torch.randn(37, 53, generator=g).to(getattr(torch, dtype))
    w[torch.rand(37, 53, generator=g) < 0.6] = 0
    w[3] = 0                      # an empty row
    w[5, 7] = -0.0
    A = load_matrix(w, name="w")
    ref = sp.csr_array(w.to(torch.float64).numpy())
    assert np.array_equal(A.indptr, ref.indptr) and np.array_equal(A.indices, ref.indices)
    assert np.array_equal(A.data.astype(np.float64), ref.data) and A.dtype == dtype
    w[2, 9] = float("nan")
    with pytest.raises(ValueError, match=r"NaN/Inf.*row 2, column 9"):
        load_matrix(w, name="w")
