"""delta_spmv (CUDA C++ decode kernel on delta-coded row slices): the format round-trips exactly
under the kernel's own walk (fillers, padding, empty rows, odd shapes), its bytes are the cost
model's, the launch plan only names kernels prepare compiles, the source compiles for sm_90
without spills, and (GPU) the harness verifies it against fp64 at every N class.
"""
from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from sparseditto.delta_format import GROUP, DeltaSlices, packing_score
from sparseditto.kernel_templates.registry import get_template
from sparseditto.matrix import SparseMatrix

from template_instances import CHILD_LOADS_EXPORT, load_candidate

gpu = pytest.mark.gpu


def _matrix(m: int, k: int, density: float, seed: int, empty_rows=(), wide_gaps=False) -> SparseMatrix:
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((m, k)) * (rng.random((m, k)) < density)
    dense[list(empty_rows), :] = 0
    if wide_gaps and m > 1:   # one row with gaps far wider than an 8-bit field, ending at the last column
        dense[1, :] = 0
        dense[1, [0, 300, 301, 1000 % k, k - 1]] = 1.5
    return SparseMatrix.from_scipy(sp.csr_array(dense))


@pytest.mark.parametrize("shape,density,empty,wide", [((37, 100), 0.5, (0, 5), False), ((64, 1030), 0.3, (), True),
                                                       ((5, 1100), 0.9, (4,), True), ((130, 67), 0.02, (1, 2, 3), False),
                                                       ((3, 2), 1.0, (), False), ((9, 4099), 0.1, (8,), True)])
@pytest.mark.parametrize("bits,skew", [(4, 0), (8, 4), ("auto", "auto"), (4, 7)])
@pytest.mark.parametrize("lanes", [32, 4, "auto"])
def test_slices_decode_to_the_exact_matrix_under_the_kernels_walk(shape, density, empty, wide, bits, skew, lanes):
    A = _matrix(*shape, density, seed=shape[0], empty_rows=empty, wide_gaps=wide)
    fmt = DeltaSlices.from_matrix(A, lanes=lanes, bits=bits, skew=skew)
    ref = A.to_scipy()
    got = fmt.to_csr()
    assert (abs(got - ref)).max() == 0 if ref.nnz else got.nnz == 0
    assert fmt.values.size == fmt.pieces * GROUP and fmt.deltas.size == fmt.pieces
    assert fmt.starts.shape == (shape[0] * fmt.lanes,) and fmt.group_base.shape == (shape[0] + 1,)
    assert np.all(np.diff(fmt.group_base) % fmt.lanes == 0), "every row's pieces are whole groups of L lanes"
    real = np.count_nonzero(fmt.values)
    assert real == np.count_nonzero(ref.data), "each nonzero stored once; fillers and padding are zeros"
    if wide and fmt.bits == 4:
        assert fmt.fillers > 0, "gaps wider than 15 columns need fillers"


def test_csr_arrays_canonicalizes_with_numpy_like_scipy():
    """The numpy-only input path (what an exported kernel packs with): unsorted columns and
    repeated entries summed like scipy's canonical CSR, other formats through their own tocsr()."""
    from sparseditto.delta_format import csr_arrays

    rng = np.random.default_rng(3)
    rows, cols = rng.integers(0, 40, 600), rng.integers(0, 70, 600)      # many repeats
    coo = sp.coo_array((rng.standard_normal(600), (rows, cols)), shape=(40, 70))
    ref = sp.csr_array(coo)
    ref.sum_duplicates()
    for A in (coo, coo.tocsc()):
        indptr, indices, data, shape = csr_arrays(A)
        assert shape == (40, 70) and np.array_equal(indptr, ref.indptr) and np.array_equal(indices, ref.indices)
        assert np.allclose(data, ref.data, rtol=0, atol=1e-12)
    arrays = (ref.data[::-1].copy(), ref.indices[::-1].copy(), ref.indptr.copy())   # unsorted, repeated columns
    canon = sp.csr_array(arrays, shape=(40, 70))
    canon.sort_indices()
    canon.sum_duplicates()
    indptr, indices, data, _ = csr_arrays(sp.csr_array(arrays, shape=(40, 70)))
    assert np.array_equal(indptr, canon.indptr) and np.array_equal(indices, canon.indices)
    assert np.allclose(data, canon.data, rtol=0, atol=1e-12)
    assert (abs(DeltaSlices.from_matrix(coo).to_csr() - ref)).max() < 1e-12
    with pytest.raises(ValueError, match="CSR form"):
        csr_arrays(np.zeros((3, 3)))
    with pytest.raises(ValueError, match="Column ids"):
        csr_arrays(sp.csr_array((np.ones(1), np.array([9]), np.array([0, 1])), shape=(1, 4)))


def test_auto_choice_takes_the_best_packing_and_the_cost_model_predicts_it():
    from sparseditto.analysis import analyze
    from sparseditto.kernel_templates.cost import ReportStats, delta_packing

    for density, bits in ((0.5, 4), (0.1, 8)):
        A = _matrix(512, 4096, density, seed=1)
        fmt = DeltaSlices.from_matrix(A)
        assert fmt.bits == bits
        for b in (4, 8):
            other = DeltaSlices.from_matrix(A, bits=b)
            assert packing_score(fmt.pieces * GROUP, fmt.bits) <= packing_score(other.pieces * GROUP, b) * 1.01
        est, est_bits, est_lanes, _ = delta_packing(ReportStats(analyze(A)), 2)
        assert (est_bits, est_lanes) == (fmt.bits, fmt.lanes)
        assert abs(est - fmt.nbytes()) / fmt.nbytes() < 0.05, (est, fmt.nbytes())


def test_auto_skew_only_where_lanes_stay_aligned():
    """2:4 keeps the lanes' columns aligned (every lane on one bank without a skew); a random pattern
    spreads them by itself, and the H200 measured the skew slower there."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((256, 4096))
    groups = np.abs(w).reshape(256, -1, 4)
    keep = np.zeros_like(groups, dtype=bool)
    np.put_along_axis(keep, np.argsort(-groups, axis=2)[:, :, :2], True, axis=2)
    nm = SparseMatrix.from_scipy(sp.csr_array(w * keep.reshape(256, 4096)))
    assert DeltaSlices.from_matrix(nm).skew > 0
    assert DeltaSlices.from_matrix(_matrix(256, 4096, 0.5, seed=0)).skew == 0


def test_prepare_ships_the_arrays_and_bytes_it_reports(tmp_path_factory):
    module = load_candidate("delta_spmv", {}, tmp_path_factory)
    A = _matrix(200, 777, 0.4, seed=3, empty_rows=(7,))
    packed = module.prepare(A, "float16", "cpu")
    assert packed["kernels"] == {}, "nothing is compiled without a GPU"
    shipped = sum(packed[k].numel() * packed[k].element_size() for k in packed["arrays"])
    assert shipped == packed["a_bytes"]
    fmt = DeltaSlices.from_matrix(A, skew=module.PARAMS["SKEW"])
    assert torch.equal(packed["values"], torch.from_numpy(fmt.values).to(torch.float16))
    assert (packed["lanes"], packed["bits"]) == (fmt.lanes, fmt.bits)


@pytest.mark.parametrize("params", [{}, {"WARPS": 4}, {"NV": 2, "PIPE": 2}, {"WARPS": 16, "CTAS_PER_SM": 2},
                                    {"B_HALF": 1, "NV": 4}, {"B_HALF": 0}])
def test_every_planned_kernel_is_compiled_and_the_grid_covers_the_matrix(params, tmp_path_factory):
    module = load_candidate("delta_spmv", params, tmp_path_factory)
    for shape in ((1001, 70), (64, 11008), (5, 25344), (3, 50688), (3, 50689)):
        A = _matrix(*shape, 0.3, seed=0)
        if shape[1] * module.b_bytes() > module.SMEM_CAP:
            with pytest.raises(ValueError, match=f"K <= {module.SMEM_CAP // module.b_bytes()}"):
                module.prepare(A, "bfloat16", "cpu")
            continue
        if params.get("NV", 1) * shape[1] * module.b_bytes() > module.SMEM_CAP:
            with pytest.raises(ValueError, match="lower NV"):
                module.prepare(A, "bfloat16", "cpu")
            continue
        packed = module.prepare(A, "bfloat16", "cpu")
        rows_per_cta = module.PARAMS["WARPS"] * (32 // packed["lanes"])
        for n in range(1, 20):
            plan = module.plan_launch(packed, n, torch.bfloat16, 132)
            assert plan["name"] in module.reachable_kernels(torch.bfloat16, packed["kp"], packed["lanes"], packed["bits"])
            # one wave, no CTA without a row to stream
            assert plan["streams"] == plan["grid"][0] * rows_per_cta
            assert (plan["grid"][0] - 1) * rows_per_cta < shape[0]
            assert plan["grid"][0] <= 132 * module.ctas_per_sm(plan["smem"], 64) and plan["grid"][1] * plan["nv"] >= n
            assert plan["smem"] == packed["kp"] * plan["nv"] * module.b_bytes() <= module.SMEM_CAP


@pytest.mark.parametrize("streams", [1, 7, 64, 500])
def test_stream_split_gives_every_row_to_one_stream_and_balances_pieces(streams, tmp_path_factory):
    """The kernel's sub-warps each stream split[s] .. split[s + 1]: every row exactly once, pieces
    contiguous, each stream within one row of an equal share (rows are never cut)."""
    module = load_candidate("delta_spmv", {}, tmp_path_factory)
    rng = np.random.default_rng(streams)
    groups = rng.integers(0, 12, size=300)
    groups[40:90] = 0                               # a run of empty rows
    groups[200] = 400                               # one row longer than a share
    base = np.concatenate(([0], np.cumsum(groups * 8))).astype(np.int32)
    split = module.stream_split(base, streams)
    assert split.shape == (streams + 1, 2) and split.dtype == np.int32
    assert split[0].tolist() == [0, 0] and split[-1].tolist() == [300, int(base[-1])]
    assert (np.diff(split[:, 0]) >= 0).all()
    assert (split[:, 1] == base[split[:, 0]]).all(), "a stream's first piece is its first row's"
    targets = (int(base[-1]) * np.arange(streams + 1)) // streams
    holder = np.clip(np.searchsorted(base, targets, side="right") - 1, 0, 299)    # the row a target falls in
    half_row = (base[holder + 1] - base[holder]) / 2
    assert (np.abs(split[:, 1] - targets) <= half_row).all(), "a cut is not at the row end nearest its share"
    with pytest.raises(ValueError, match="at least one stream"):
        module.stream_split(base, 0)


def test_bad_inputs_are_clear_errors(tmp_path_factory):
    module = load_candidate("delta_spmv", {}, tmp_path_factory)
    A = _matrix(16, 40, 0.5, seed=0)
    with pytest.raises(ValueError, match="float16 and bfloat16"):
        module.prepare(A, torch.float32, "cpu")
    with pytest.raises(ValueError, match="K <= 50688"):
        module.prepare(_matrix(2, 60000, 0.01, seed=0), torch.float16, "cpu")
    fp32_copy = load_candidate("delta_spmv", {"B_HALF": 0}, tmp_path_factory)
    with pytest.raises(ValueError, match="K <= 25344"):
        fp32_copy.prepare(_matrix(2, 30000, 0.01, seed=0), torch.float16, "cpu")
    packed = module.prepare(A, "float16", "cpu")
    with pytest.raises(ValueError, match="CUDA device"):
        module.spmm(packed, torch.zeros(40, 2, dtype=torch.float16), torch.zeros(16, 2, dtype=torch.float16))
    with pytest.raises(ValueError, match="lanes per row"):
        DeltaSlices.from_matrix(A, lanes=3)
    with pytest.raises(ValueError, match="delta bits"):
        DeltaSlices.from_matrix(A, bits=5)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_source_compiles_for_sm90_without_spills(tmp_path):
    """The candidate's own CUDA_SRC through ptxas, 7 instantiations (every delta width, L 4..32 and
    NV 1..8 at least once, fp16 and bf16, row splits and 16-bit B copies): no spills, 16-byte
    streaming loads of the value pieces."""
    from sparseditto.harness.source_loader import cuda_sources

    src = tmp_path / "delta_spmv.cu"
    code = cuda_sources(get_template("delta_spmv").instantiate({}).source)["CUDA_SRC"]
    src.write_text("#define SPARSEDITTO_INSTANTIATE_ALL\n" + code)
    proc = subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "-cubin", "-Xptxas", "-v", "-keep",
                           "-keep-dir", str(tmp_path), str(src), "-o", str(tmp_path / "delta.cubin")],
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    entries = re.findall(r"Compiling entry function '(\w+)'", proc.stderr)
    assert len([e for e in entries if "delta_spmv" in e]) == 7
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", proc.stderr)]
    assert spills and max(spills) == 0, "register spills in delta_spmv"
    ptx = "".join(p.read_text() for p in tmp_path.glob("*.ptx"))
    assert "ld.global.nc.L1::no_allocate.v4.u32" in ptx


@gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("params,shape,density,empty", [
    ({}, (300, 1000), 0.5, (3,)), ({}, (4096, 4096), 0.5, (3,)),
    ({"WARPS": 4, "PIPE": 2}, (257, 3333), 0.1, (3,)), ({"NV": 1}, (64, 11008), 0.3, (3,)),
    # deep pipelines, few big CTAs: streams of many rows; a block of empty rows inside streams
    ({"PIPE": 8, "WARPS": 16, "CTAS_PER_SM": 2}, (4096, 4096), 0.5, tuple(range(100, 700))),
    ({"LANES": 4, "WARPS": 32, "CTAS_PER_SM": 1}, (3000, 2048), 0.05, tuple(range(0, 3000, 3))),
    # rows cut between streams: 64 long rows over ~3000 streams (many streams inside one row), and
    # a square weight with empty rows at cuts
    ({"ROW_SPLIT": 1}, (64, 11008), 0.3, (3,)), ({"ROW_SPLIT": 1, "LANES": 4}, (4096, 4096), 0.5, tuple(range(100, 700))),
    # B's copy in 16-bit values: every NV (N 1..17 in the check), a skewed copy (2:4-like columns
    # are not drawn here, so a forced skew), and K = 11008 with NV 4 in one pass
    ({"B_HALF": 1}, (300, 1000), 0.5, (3,)), ({"B_HALF": 1, "SKEW": 5}, (257, 3333), 0.1, (3,)),
    ({"B_HALF": 1, "NV": 4}, (64, 11008), 0.3, (3,))])
def test_gpu_verifies_against_fp64(params, shape, density, empty, dtype):
    from sparseditto.harness.verify import run_and_verify

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    A = _matrix(*shape, density, seed=0, empty_rows=empty, wide_gaps=True)
    result = run_and_verify(get_template("delta_spmv").instantiate(params), A, n_values=(1, 2, 3, 8, 16, 17),
                            dtype=dtype, backend="cuda", timeout=600)
    assert result.ok, result.message


def _emulate_row_split(module, fmt, B, streams):
    """The kernel's ROW_SPLIT walk in numpy (float64): each stream from split/heads/head_cols, rows
    finished at their ends, parts of cut rows kept per (stream, slot) and added in stream order as
    combine_part does. Returns C and how many times each row was written."""
    from sparseditto.delta_format import logical_columns

    split, heads = module.group_split(fmt.group_base, fmt.lanes, streams)
    head_cols = module.head_columns(fmt, split, heads)
    m, k = fmt.shape
    L = fmt.lanes
    bphys = np.zeros((int(logical_columns(k, fmt.skew).size), B.shape[1]))
    logical = logical_columns(k, fmt.skew)
    bphys[logical >= 0] = B[logical[logical >= 0]]
    C = np.zeros((m, B.shape[1]))
    writes = np.zeros(m, dtype=int)
    parts = {}
    gb = fmt.group_base.astype(np.int64)
    for s in range(streams):
        (row, p0), (row_end, p1) = split[s], split[s + 1]
        head, nxt = heads[s], heads[s + 1]
        row_stop = row_end + (1 if nxt[0] >= 0 else 0)
        col = (head_cols[s * L:(s + 1) * L] if head[0] >= 0 else fmt.starts[row * L:(row + 1) * L]).astype(np.int64) \
            if row < row_stop else np.zeros(L, dtype=np.int64)
        acc = np.zeros(B.shape[1])
        pos = int(p0)

        def finish():
            nonlocal row, col, acc
            while row < row_end and pos == gb[row + 1]:
                if head[0] >= 0 and row == split[s, 0]:
                    parts[(s, 0)] = (row, acc.copy())
                else:
                    C[row] = acc
                    writes[row] += 1
                acc = np.zeros(B.shape[1])
                row += 1
                if row < row_stop:
                    col = fmt.starts[row * L:(row + 1) * L].astype(np.int64)

        finish()
        for piece0 in range(int(p0), int(p1), L):
            pieces = piece0 + np.arange(L)
            for i in range(8):
                col = col + fmt.field(pieces, i)
                acc = acc + fmt.values[pieces * 8 + i] @ bphys[col]
            pos += L
            finish()
        if nxt[0] >= 0:
            slot = 0 if (head[0] >= 0 and row == split[s, 0]) else 1
            parts[(s, slot)] = (row, acc.copy())
    for s in range(1, streams + 1):          # every cut row, combined from streams a..b in order
        a, b = heads[s]
        if a < 0 or (s > a + 1 and heads[s - 1][0] == a):
            continue
        rows_, total = set(), np.zeros(B.shape[1])
        for c in range(a, b + 1):
            r, part = parts.pop((c, 1 if c == a else 0))
            rows_.add(r)
            total = total + part
        assert len(rows_) == 1, "contributors worked on different rows"
        C[rows_.pop()] = total
        writes[r] += 1
    assert not parts, f"parts nobody combined: {sorted(parts)}"
    return C, writes


@pytest.mark.parametrize("streams", [1, 3, 17, 64, 300])
@pytest.mark.parametrize("lanes,skew", [(32, 0), (4, 0), (8, 5)])
def test_row_split_streams_compute_the_exact_product(streams, lanes, skew, tmp_path_factory):
    """ROW_SPLIT's launch metadata (group_split, head_columns) walked the kernel's way: every row
    written once (directly, or combined from its streams in order), the product exact; with rows
    long enough to span several streams, empty rows at cuts and more streams than groups."""
    module = load_candidate("delta_spmv", {"ROW_SPLIT": 1}, tmp_path_factory)
    rng = np.random.default_rng(streams + lanes)
    dense = rng.standard_normal((40, 700)) * (rng.random((40, 700)) < 0.3)
    dense[5] = rng.standard_normal(700)                  # a long row
    dense[[0, 11, 12, 13, 39], :] = 0                    # empty rows, first and last among them
    A = SparseMatrix.from_scipy(sp.csr_array(dense))
    fmt = DeltaSlices.from_matrix(A, lanes=lanes, bits=4, skew=skew)
    B = rng.standard_normal((700, 2))
    C, writes = _emulate_row_split(module, fmt, B, streams)
    assert (writes == 1).all(), f"rows written {writes.tolist()}"
    np.testing.assert_allclose(C, dense @ B, rtol=1e-12, atol=1e-12)


def test_group_split_cuts_at_groups_and_names_each_cut_rows_contributors(tmp_path_factory):
    module = load_candidate("delta_spmv", {"ROW_SPLIT": 1}, tmp_path_factory)
    base = np.array([0, 8, 8, 200, 208], dtype=np.int32)          # L = 8: rows of 1, 0, 24 and 1 groups
    split, heads = module.group_split(base, 8, 4)
    assert (split[:, 1] % 8 == 0).all() and split[-1].tolist() == [4, 208] and split[0].tolist() == [0, 0]
    assert np.diff(split[:, 1]).max() - np.diff(split[:, 1]).min() <= 8, "shares within a group"
    for s in range(1, 4):                                         # cuts 48, 104, 152: all inside row 2
        assert split[s, 0] == 2 and heads[s].tolist() == [0, 3]
    assert heads[0].tolist() == heads[4].tolist() == [-1, -1]


# ---- sparseditto export: the standalone module packs with delta_format's own code, without scipy --

CHILD_PACK = CHILD_LOADS_EXPORT + r'''
for tag in sys.argv[2:]:
    W = np.load(f"{tag}.npy")
    k = kernel.SpMM(W, device="cpu", check_signature=tag == "sparse")   # the export's own path
    fmt = kernel._sparseditto_delta_format.DeltaSlices.from_matrix(kernel.as_sparse_matrix(W))
    packed = {f"packed_{name}": k.packed[name].float().numpy() if name == "values" else k.packed[name].numpy()
              for name in ("values", "deltas", "starts", "group_base")}
    np.savez(f"{tag}.npz", values=fmt.values, deltas=fmt.deltas, starts=fmt.starts, group_base=fmt.group_base,
             meta=np.array([fmt.lanes, fmt.bits, fmt.skew, fmt.nnz, fmt.fillers]), **packed)
print(json.dumps({"modules": sorted(m for m in sys.modules if m.startswith(("sparseditto", "scipy")))}))
'''


def test_exported_delta_spmv_packs_exactly_like_delta_slices_without_scipy(tmp_path):
    """`sparseditto export` of a delta_spmv kernel: the module imports torch, numpy (and CuPy on a GPU), and in
    a fresh isolated interpreter that refuses SparseDitto and scipy it packs a weight (through
    SpMM(W), the signature check included) into the very arrays DeltaSlices builds here: fillers
    and empty rows on one weight, a skewed B copy on a 2:4 one. Its CUDA source is the template's."""
    import ast
    import json
    import sys

    from sparseditto import generate
    from sparseditto.batch.export import module_text
    from sparseditto.batch.standalone import third_party_imports
    from sparseditto.harness.source_loader import cuda_sources
    from sparseditto.pattern_features import structure_signature

    weights = {"sparse": _matrix(64, 4096, 0.04, seed=1, empty_rows=(0, 7), wide_gaps=True),
               "nm": generate.nm_sparse(64, 4096, seed=2)}
    candidate = get_template("delta_spmv").instantiate({})
    fields = {"source": candidate.source, "template": "delta_spmv", "layer": "w", "params": {},
              "matrix_shape": [64, 4096], "dtype": "float16", "verified_ns": [1, 2], "verification": {},
              "signature": structure_signature(weights["sparse"]), "density": 0.04, "structure": {"kind": "unstructured"}}
    text = module_text(fields)
    assert third_party_imports(text) == {"torch", "numpy", "cupy"}     # CuPy only inside the GPU launch path
    path = tmp_path / "kernel.py"
    path.write_text(text)
    for tag, A in weights.items():   # values exact in fp16, as a user's fp16 weight would be
        np.save(tmp_path / f"{tag}.npy", A.to_dense().astype(np.float16).astype(np.float32))
    done = subprocess.run([sys.executable, "-I", "-c", CHILD_PACK, str(path), *weights], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["modules"] == []
    for tag in weights:
        W = np.load(tmp_path / f"{tag}.npy")
        here = DeltaSlices.from_matrix(SparseMatrix.from_scipy(sp.csr_array(W)))
        got = np.load(tmp_path / f"{tag}.npz")
        assert got["meta"].tolist() == [here.lanes, here.bits, here.skew, here.nnz, here.fillers]
        for name in ("values", "deltas", "starts", "group_base"):
            assert got[name].dtype == getattr(here, name).dtype and np.array_equal(got[name], getattr(here, name)), name
        view = np.int64 if here.bits == 8 else np.int32
        assert np.array_equal(got["packed_deltas"], here.deltas.view(view))
        assert np.array_equal(got["packed_values"], here.values.astype(np.float16).astype(np.float32))
        assert np.array_equal(got["packed_starts"], here.starts) and np.array_equal(got["packed_group_base"], here.group_base)
    sparse, nm = (np.load(tmp_path / f"{tag}.npz")["meta"] for tag in weights)
    assert (sparse[4] > 0 or sparse[1] == 8) and nm[2] > 0, "fillers (or 8-bit deltas) and a skew were exercised"
    tree = ast.parse(text)
    exported_cuda = next(ast.literal_eval(n.value) for n in tree.body
                         if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "CUDA_SRC")
    assert exported_cuda == cuda_sources(candidate.source)["CUDA_SRC"]
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH: the exported CUDA source was not compiled")
    cu = tmp_path / "exported.cu"
    cu.write_text("#define SPARSEDITTO_INSTANTIATE_ALL\n" + exported_cuda)
    proc = subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "-cubin", str(cu), "-o", str(tmp_path / "e.cubin")],
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_row_split_plans_a_full_wave_for_a_few_long_rows(tmp_path_factory):
    """64 long rows: cuts at row ends could use 64 sub-warps at most; with ROW_SPLIT the grid is one
    full wave (as many streams as there are row groups, up to the resident sub-warps)."""
    A = _matrix(64, 11008, 0.3, seed=0)
    plain = load_candidate("delta_spmv", {}, tmp_path_factory)
    cut = load_candidate("delta_spmv", {"ROW_SPLIT": 1}, tmp_path_factory)
    packed = cut.prepare(A, "float16", "cpu")
    p0 = plain.plan_launch(plain.prepare(A, "float16", "cpu"), 1, torch.float16, 132)
    p1 = cut.plan_launch(packed, 1, torch.float16, 132)
    assert packed["lanes"] == 32 and p0["streams"] == 64                      # one row per warp
    wave = 132 * cut.ctas_per_sm(p1["smem"], 64) * 8
    assert p1["streams"] == min(-(-packed["groups"] // 8) * 8, wave) > 10 * p0["streams"]


def test_lanes_floor_fills_the_sms_and_packs_exactly(tmp_path_factory):
    """`lanes_to_fill` is the fewest lanes whose CTAs cover 90% of the SMs; "auto" then packs at
    least that many (a 4096-row 90% weight: 8 lanes on 132 SMs, where the least padding says 4),
    and the slices stay an exact copy of A."""
    from sparseditto.delta_format import lanes_to_fill

    assert lanes_to_fill(4096, 8, 132) == 8          # 4 lanes: 64 CTAs; 8: 128 >= 0.9 * 132
    assert lanes_to_fill(11008, 8, 132) == 4         # 172 CTAs already
    assert lanes_to_fill(512, 8, 132) == 32          # too short to fill: the most lanes
    assert lanes_to_fill(4096, 4, 132) == 4
    with pytest.raises(ValueError, match="SMs"):
        lanes_to_fill(4096, 8, 0)
    mod = load_candidate("delta_spmv", {}, tmp_path_factory)
    assert mod.min_lanes(4096, 132) == 8 and mod.min_lanes(4096, 0) == 1
    from sparseditto.delta_format import lanes_floor
    assert lanes_floor(4096, 8, 132) == 8 and lanes_floor(4096, 8, 132, row_split=1) == 1
    A = _matrix(600, 2048, 0.1, seed=3)
    assert DeltaSlices.from_matrix(A).lanes == 4
    floored = DeltaSlices.from_matrix(A, min_lanes=16)
    assert floored.lanes == 16
    assert abs(floored.to_csr() - A.to_scipy()).max() < 1e-12


def test_a_known_pattern_reuses_its_layout_and_takes_the_new_values():
    """The second packing of a pattern (new values, as each verification draws) scatters the values
    into the cached layout: every array equals a packing from scratch, none is shared with the
    cache or an earlier result, and a different pattern or packing choice misses."""
    from sparseditto import delta_format

    delta_format.clear_layout_cache()
    A = _matrix(300, 1000, 0.3, seed=5, empty_rows=(4,), wide_gaps=True)
    first = DeltaSlices.from_matrix(A)
    rng = np.random.default_rng(1)
    B = SparseMatrix.from_scipy(sp.csr_array((rng.standard_normal(A.nnz), A.indices, A.indptr), shape=A.shape))
    again = DeltaSlices.from_matrix(B)
    delta_format.clear_layout_cache()
    fresh = DeltaSlices.from_matrix(B)
    for name in ("values", "deltas", "starts", "group_base"):
        assert np.array_equal(getattr(again, name), getattr(fresh, name)), name
    assert (again.lanes, again.bits, again.skew, again.nnz, again.fillers) == \
        (fresh.lanes, fresh.bits, fresh.skew, fresh.nnz, fresh.fillers)
    assert not np.array_equal(again.values, first.values)
    assert abs(again.to_csr() - B.to_scipy()).max() < 1e-12
    again.deltas[:] = 0                                      # a caller writing its arrays
    assert np.array_equal(DeltaSlices.from_matrix(B).deltas, fresh.deltas)
    assert not np.shares_memory(DeltaSlices.from_matrix(B).starts, DeltaSlices.from_matrix(B).starts)
    # another packing choice, another pattern of the same shape and nnz: their own layouts
    assert DeltaSlices.from_matrix(B, lanes=4).lanes == 4
    moved = B.to_scipy().toarray()
    row = 10
    on, off = np.flatnonzero(moved[row]), np.flatnonzero(moved[row] == 0)
    moved[row, off[0]], moved[row, on[0]] = moved[row, on[0]], 0.0     # one nonzero moved: same nnz
    C = SparseMatrix.from_scipy(sp.csr_array(moved))
    assert C.nnz == B.nnz
    assert abs(DeltaSlices.from_matrix(C).to_csr() - C.to_scipy()).max() < 1e-12   # a stale layout would not be
    assert len(delta_format._LAYOUTS) <= delta_format.LAYOUT_CACHE_ENTRIES


@pytest.mark.parametrize("lanes", [32, 16, 8, 4])
def test_entry_slots_match_the_per_entry_formula(lanes):
    """The table lookup `_pack` uses gives every entry the slot the per-entry formula does
    (lane p // run, slot p % run, run = 8 x the row's groups per lane), and the lane starts."""
    from sparseditto.delta_format import _entry_slots, positions

    rng = np.random.default_rng(lanes)
    per_row = rng.integers(0, 700, size=257)
    per_row[::17] = 0                                      # empty rows
    per_row[3] = 8 * lanes                                 # exactly full lanes
    per_row[5] = 1
    groups = -(-per_row // (GROUP * lanes))
    group_base = np.zeros(per_row.size + 1, dtype=np.int64)
    np.cumsum(groups * lanes, out=group_base[1:])
    where, lead_at, lead_slot = _entry_slots(per_row, groups, group_base, lanes)
    rows, lane, slot, _ = positions(per_row, lanes)
    expected = (group_base[rows] + (slot // GROUP) * lanes + lane) * GROUP + slot % GROUP
    assert np.array_equal(where, expected)
    lead = np.flatnonzero(slot == 0)
    assert np.array_equal(lead_at, lead) and np.array_equal(lead_slot, rows[lead].astype(np.int64) * lanes + lane[lead])


def test_the_persistent_grid_is_sized_to_the_devices_sm(tmp_path_factory):
    """One wave of resident CTAs on the GPU that runs it: a 64 KB strip of B leaves room for 3 CTAs on an
    H200 SM (227 KB) and 1 on an Ada SM (99 KB), whose 1536 threads also hold fewer 8-warp CTAs than Hopper's
    2048; off the GPU the plan is Hopper's (runtime.sm_resources)."""
    from sparseditto.kernel_templates import runtime as rt

    module = load_candidate("delta_spmv", {}, tmp_path_factory)
    assert rt.sm_resources(torch.device("cpu")) == rt.SMResources() == module.HOPPER_SM
    ada = rt.SMResources(smem=99 * 1024, threads=1536)
    assert module.ctas_per_sm(64 * 1024, 32) == 3 and module.ctas_per_sm(64 * 1024, 32, ada) == 1
    assert module.ctas_per_sm(4 * 1024, 32) == 8 and module.ctas_per_sm(4 * 1024, 32, ada) == 6
    packed = module.prepare(_matrix(4096, 4096, 0.9, seed=0), "float16", "cpu")
    hopper, small = module.plan_launch(packed, 8, torch.float16, 132), module.plan_launch(packed, 8, torch.float16, 132, 32, ada)
    assert small["smem"] == hopper["smem"] == 65536                      # N = 8: a 4096 x 8 fp16 strip
    assert (hopper["grid"][0], small["grid"][0]) == (3 * 132, 132)       # one wave each
