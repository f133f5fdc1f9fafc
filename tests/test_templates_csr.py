"""The CSR-family Triton templates run their real kernels (Triton interpreter on CPU, or the GPU)
against a float64 reference: csr_rowsplit, csr_balanced, compact_rows_cols.

Each case instantiates the template through the registry, writes the candidate source to a file
(Triton needs real source files), imports it, runs prepare() + spmm() into a NaN-filled output and
compares with float64 numpy on the *same rounded* inputs (A's values and B cast to the kernel's
dtype), within a bound scaled by |A| @ |B|. Shapes stay small on the CPU (the interpreter runs
every program in Python).
"""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from sparseditto.kernel_templates.registry import get_template
from sparseditto.matrix import SparseMatrix

TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


# the NumPy >= 2.4 interpreter fix is applied by tests/conftest.py for in-process runs
from template_instances import load_candidate  # noqa: E402


def random_matrix(m, k, density, seed, empty_rows=(), empty_cols=()) -> SparseMatrix:
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((m, k)) * (rng.random((m, k)) < density)
    dense[list(empty_rows), :] = 0
    dense[:, list(empty_cols)] = 0
    return SparseMatrix.from_scipy(sp.csr_array(dense), name=f"random{m}x{k}")


def skewed_matrix(m, k, seed) -> SparseMatrix:
    """A few very long rows (one full row), many short or empty ones: rows cross nnz splits."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum(k, (rng.pareto(1.2, m) * 3).astype(int))
    lengths[m // 3] = k
    lengths[: m // 8] = 0
    rows = np.repeat(np.arange(m), lengths)
    cols = np.concatenate([rng.choice(k, size=n, replace=False) for n in lengths])
    vals = rng.standard_normal(rows.size)
    return SparseMatrix.from_scipy(sp.csr_array((vals, (rows, cols)), shape=(m, k)), name="skewed")


def run_and_check(module, A: SparseMatrix, n: int, dtype, *, b_transposed=False, seed=0):
    """Run prepare + spmm into a NaN-filled output and compare with float64 numpy."""
    gen = torch.Generator().manual_seed(seed)
    M, K = A.shape
    B = torch.randn(K, n, generator=gen).to(dtype)
    if b_transposed:  # same values, column-major storage: B.stride() == (1, K)
        B = B.t().contiguous().t()
    B = B.to(DEVICE)
    B_before = B.clone()
    packed = module.prepare(A, dtype, DEVICE)
    out = torch.full((M, n), float("nan"), dtype=dtype, device=DEVICE)
    module.spmm(packed, B, out)
    assert torch.equal(B, B_before), "spmm modified B"
    got = out.double()
    unwritten = int(torch.isnan(got).sum())
    assert unwritten == 0, f"{unwritten} output elements left unwritten (NaN)"
    # float64 reference on the same device (test code may use torch.matmul; candidates may not).
    a_vals = torch.from_numpy(A.data.astype(np.float32)).to(dtype).double().numpy()
    a64 = torch.from_numpy(A.with_values(a_vals).to_dense()).to(DEVICE)
    b64 = B.double()
    ref = a64 @ b64
    scale = a64.abs() @ b64.abs()
    err = (got - ref).abs()
    bound = TOL[dtype] * (scale + ref.abs()) + 1e-6
    if not bool((err <= bound).all()):
        worst = np.unravel_index(int(torch.argmax(err - bound)), tuple(err.shape))
        raise AssertionError(f"max error {float(err.max()):.3g} at {worst}: got {float(got[worst]):.6g}, "
                             f"expected {float(ref[worst]):.6g} (bound {float(bound[worst]):.3g})")
    return packed


SMALL = random_matrix(64, 96, 0.15, seed=1, empty_rows=(0, 17, 63), empty_cols=(5, 6))

# (template, params, matrix, n, dtype): default instances across dtypes and N, plus non-default
# params that take other code paths (row groups, reordering, 32-bit ids, nnz splits, tiles).
CASES = [
    ("csr_rowsplit", {}, "small", 33, torch.float16),
    ("csr_rowsplit", {"ROWS_PER_PROGRAM": 4, "REORDER": "length", "BLOCK_NNZ": 16, "INDEX_BITS": 32},
     "small", 7, torch.float32),
    ("csr_rowsplit", {"BLOCK_N": 8, "BLOCK_NNZ": 8, "num_warps": 1}, "small", 12, torch.float32),
    ("csr_rowsplit", {}, "small", 1, torch.bfloat16),
    ("csr_rowsplit", {"ROWS_PER_PROGRAM": 2, "REORDER": "length"}, "skewed", 5, torch.float32),
    ("csr_balanced", {}, "small", 33, torch.float16),
    ("csr_balanced", {"NNZ_PER_PROGRAM": 64, "BLOCK_NNZ": 16, "INDEX_BITS": 32}, "skewed", 7, torch.float32),
    ("csr_balanced", {"NNZ_PER_PROGRAM": 64, "FIXUP": "launch", "BLOCK_N": 4}, "skewed", 6, torch.float32),
    ("csr_balanced", {"NNZ_PER_PROGRAM": 128, "BLOCK_NNZ": 64, "BLOCK_N": 4}, "small", 6, torch.float32),
    ("csr_balanced", {"NNZ_PER_PROGRAM": 64}, "small", 1, torch.bfloat16),
    ("compact_rows_cols", {}, "pruned", 33, torch.float16),
    ("compact_rows_cols", {"BLOCK_M": 16, "BLOCK_K": 16, "BLOCK_N": 16, "num_warps": 1}, "pruned", 7, torch.float32),
    ("compact_rows_cols", {"BLOCK_M": 32, "BLOCK_K": 32}, "small", 1, torch.bfloat16),
    # both row layouts, one-chunk and looped programs, several rows at once
    ("csr_rowsplit", {"LAYOUT": "csr", "ROWS_PER_PROGRAM": 4, "BLOCK_NNZ": 8}, "small", 16, torch.float16),
    ("csr_rowsplit", {"LAYOUT": "padded", "ROWS_PER_PROGRAM": 2, "BLOCK_NNZ": 8}, "skewed", 3, torch.float32),
    ("csr_rowsplit", {"LAYOUT": "padded", "ROWS_PER_PROGRAM": 8, "REORDER": "length"}, "small", 5, torch.bfloat16),
    # split-K: partials reduced by the last split; rows only pruned (B read directly) and not
    ("compact_rows_cols", {"SPLIT_K": 4, "BLOCK_M": 16, "BLOCK_K": 16}, "rows_only", 16, torch.float16),
    ("compact_rows_cols", {"SPLIT_K": 2, "BLOCK_M": 16, "BLOCK_K": 16}, "pruned", 5, torch.float32),
]


def _matrix(kind: str) -> SparseMatrix:
    if kind == "small":
        return SMALL
    if kind == "skewed":
        return skewed_matrix(48, 160, seed=3)  # one full row: spans 3+ programs of 64 nonzeros
    if kind == "rows_only":  # row pruning of a dense weight: every column kept
        return random_matrix(40, 70, 1.0, seed=6, empty_rows=range(1, 40, 3))
    # Channel-pruned: whole rows and columns removed, the rest fairly dense.
    return random_matrix(48, 72, 0.6, seed=2, empty_rows=range(0, 48, 5), empty_cols=range(3, 72, 4))


@pytest.mark.parametrize("name,params,kind,n,dtype", CASES,
                         ids=[f"{c[0]}-{c[2]}-n{c[3]}-{str(c[4])[6:]}-{i}" for i, c in enumerate(CASES)])
def test_template_matches_reference(name, params, kind, n, dtype, tmp_path_factory):
    module = load_candidate(name, params, tmp_path_factory)
    run_and_check(module, _matrix(kind), n, dtype)


EDGE_TEMPLATES = ["csr_rowsplit", "csr_balanced", "compact_rows_cols"]


@pytest.mark.parametrize("name", EDGE_TEMPLATES)
def test_edge_shapes(name, tmp_path_factory):
    """M = 1, K = 1, an all-zero matrix, and B stored column-major (strides honoured)."""
    module = load_candidate(name, {}, tmp_path_factory)
    run_and_check(module, random_matrix(1, 40, 0.5, seed=4), 3, torch.float32)
    run_and_check(module, random_matrix(24, 1, 0.5, seed=5), 2, torch.float32)
    empty = SparseMatrix.from_scipy(sp.csr_array((10, 12)), name="empty")
    run_and_check(module, empty, 2, torch.float32)
    run_and_check(module, SMALL, 3, torch.float32, b_transposed=True)


def test_dlmc_slice(shared_data, tmp_path_factory):
    """A real pruned transformer weight (DLMC, 90% magnitude pruning), sliced to 48 x 80."""
    from sparseditto.io import load_matrix

    path = shared_data / "dlmc/transformer/magnitude_pruning/0.9/body_encoder_layer_0_ffn_conv1_fully_connected.smtx.gz"
    full = load_matrix(path)
    sub = SparseMatrix.from_scipy(full.to_scipy()[:48, :80], name="dlmc_slice")
    assert sub.nnz > 0
    for name, params in (("csr_rowsplit", {"ROWS_PER_PROGRAM": 4}), ("csr_balanced", {"NNZ_PER_PROGRAM": 64}),
                         ("compact_rows_cols", {"BLOCK_M": 16, "BLOCK_K": 32})):
        run_and_check(load_candidate(name, params, tmp_path_factory), sub, 5, torch.float16, seed=7)


def test_rowsplit_reorder_is_applied_to_c(tmp_path_factory):
    """REORDER='length' computes rows out of order; C must still be in the original row order."""
    module = load_candidate("csr_rowsplit", {"REORDER": "length", "ROWS_PER_PROGRAM": 2}, tmp_path_factory)
    A = skewed_matrix(20, 30, seed=9)
    packed = module.prepare(A, torch.float32, "cpu")
    order = packed["order"].numpy()
    lengths = np.diff(A.indptr)
    assert sorted(order.tolist()) == list(range(20))
    assert (np.diff(lengths[order]) <= 0).all(), "rows are not ordered longest first"
    run_and_check(module, A, 3, torch.float32)


def test_balanced_split_covers_every_row(tmp_path_factory):
    """The nnz split: row ranges tile [0, M) (shared rows overlap only between neighbours), each
    program owns <= P nonzeros, and shared rows are exactly the rows spanning two programs."""
    module = load_candidate("csr_balanced", {}, tmp_path_factory)
    for A, P in ((skewed_matrix(200, 300, seed=11), 64), (SMALL, 128), (random_matrix(30, 40, 0.3, 12), 7)):
        split = module.split_by_nonzeros(A.indptr, P)
        lo, hi = split["row_lo"].astype(int), split["row_hi"].astype(int)
        assert lo[0] == 0 and hi[-1] == A.rows - 1
        assert (hi >= lo).all()
        assert (lo[1:] >= hi[:-1]).all() and (lo[1:] <= hi[:-1] + 1).all()
        shared = set(split["shared_rows"].tolist())
        overlap = {int(lo[p + 1]) for p in range(len(lo) - 1) if lo[p + 1] == hi[p]}
        assert overlap <= shared
        for r in shared:
            first, last = A.indptr[r] // P, (A.indptr[r + 1] - 1) // P
            assert first != last
        assert split["programs"] == max(1, -(-A.nnz // P))
        # Every (shared row, contributing program) pair is announced exactly once by that program.
        announced = sorted((int(i), p) for p, pair in enumerate(split["shared_of_prog"]) for i in pair if i >= 0)
        expected = sorted((i, p) for i in range(len(shared)) for p in
                          range(split["shared_first"][i], split["shared_last"][i] + 1))
        assert announced == expected


def test_balanced_is_deterministic(tmp_path_factory):
    module = load_candidate("csr_balanced", {"NNZ_PER_PROGRAM": 64}, tmp_path_factory)
    A = skewed_matrix(48, 160, seed=3)
    packed = module.prepare(A, torch.float32, DEVICE)
    B = torch.randn(160, 4, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    outs = []
    for _ in range(2):
        out = torch.full((48, 4), float("nan"), device=DEVICE)
        module.spmm(packed, B, out)
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    assert packed["n_shared"] > 0 and int(packed["counters"].abs().sum()) == 0, "arrival counters not reset"


def test_bad_shapes_raise(tmp_path_factory):
    module = load_candidate("csr_rowsplit", {}, tmp_path_factory)
    packed = module.prepare(SMALL, torch.float32, "cpu")
    with pytest.raises(ValueError, match=r"Expected B of shape \(96, N\)"):
        module.spmm(packed, torch.zeros(95, 4), torch.zeros(64, 4))
    with pytest.raises(ValueError, match=r"Expected out of shape \(64, 4\)"):
        module.spmm(packed, torch.zeros(96, 4), torch.zeros(64, 5))
    with pytest.raises(ValueError, match="INDEX_BITS=16 needs K <= 32768"):
        load_candidate("csr_rowsplit", {"INDEX_BITS": 16}, tmp_path_factory).prepare(
            SparseMatrix.from_scipy(sp.csr_array((2, 40000))), torch.float32, "cpu")


# ---- GPU: bigger shapes, every dtype, the planner's grid points ---------------------------------

GPU_N = [1, 16, 257]


@pytest.mark.gpu
@pytest.mark.parametrize("name", EDGE_TEMPLATES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_gpu_large(name, dtype, tmp_path_factory):
    """The planner's first two grid points on real-size matrices of three pattern classes."""
    from sparseditto import generate
    from sparseditto.analysis import analyze

    mats = [generate.unstructured(1024, 2048, 0.9, seed=0), skewed_matrix(2048, 1024, seed=1),
            generate.row_pruned(768, 1536, 0.5, density=0.5, seed=2)]
    template = get_template(name)
    for A in mats:
        report = analyze(A)
        for n in GPU_N:
            for params in template.param_grid(report, n, "H200", limit=2 if dtype != torch.float32 else 1):
                run_and_check(load_candidate(name, params, tmp_path_factory), A, n, dtype)


@pytest.mark.gpu
def test_gpu_spmv_and_wide_n(tmp_path_factory):
    """N = 1 (SpMV), odd N and N = 8192 on the default instances."""
    A = random_matrix(512, 1024, 0.05, seed=3, empty_rows=range(0, 512, 7))
    for name in EDGE_TEMPLATES:
        module = load_candidate(name, {}, tmp_path_factory)
        for n in (1, 3, 33, 8192):
            run_and_check(module, A, n, torch.float16)


@pytest.mark.gpu
@pytest.mark.parametrize("fixup", ["inline", "launch"])
def test_gpu_balanced_fixups(fixup, tmp_path_factory):
    """Long rows crossing many programs: both fix-ups exact, repeatable (counters reset), bitwise
    deterministic across calls."""
    module = load_candidate("csr_balanced", {"NNZ_PER_PROGRAM": 128, "FIXUP": fixup}, tmp_path_factory)
    A = skewed_matrix(4096, 2048, seed=13)
    for n in (1, 16, 300):
        run_and_check(module, A, n, torch.float16)
        run_and_check(module, A, n, torch.float16)
    packed = module.prepare(A, torch.float32, "cuda")
    B = torch.randn(2048, 64, device="cuda")
    first = torch.empty(4096, 64, device="cuda")
    module.spmm(packed, B, first)
    for _ in range(3):
        again = torch.empty(4096, 64, device="cuda")
        module.spmm(packed, B, again)
        assert torch.equal(first, again)
    assert int(packed["counters"].abs().sum()) == 0


# ---- launch plans, layouts, the "auto" rules --------------------------------------------------

def test_rowsplit_layouts_agree_and_padded_rows_are_aligned(tmp_path_factory):
    """LAYOUT="padded" stores row r at r*W (W a multiple of 16, >= the longest row) with its length;
    both layouts give the same result, and "auto" pads only when it costs few bytes."""
    A = skewed_matrix(30, 50, seed=21)
    padded = load_candidate("csr_rowsplit", {"LAYOUT": "padded"}, tmp_path_factory)
    packed = padded.prepare(A, torch.float32, "cpu")
    lengths = np.diff(A.indptr)
    W = packed["width"]
    assert packed["layout"] == "padded" and W % 16 == 0 and W >= lengths.max()
    idx = packed["indices"].numpy().reshape(30, W)
    for r in (0, 10, 29):
        assert idx[r, :lengths[r]].tolist() == A.indices[A.indptr[r]:A.indptr[r + 1]].tolist()
        assert not idx[r, lengths[r]:].any()
    run_and_check(padded, A, 4, torch.float32)
    run_and_check(load_candidate("csr_rowsplit", {"LAYOUT": "csr"}, tmp_path_factory), A, 4, torch.float32)
    choose = padded.choose_layout
    assert choose(np.full(1000, 40), 2, 2) == "padded"                       # equal rows: no padding
    big = np.concatenate([np.full(100_000, 10), [5000]])                     # one long row: 2 GB padded
    assert choose(big, 2, 2) == "csr"


def test_rowsplit_wide_index_math(tmp_path_factory, monkeypatch):
    """Offsets past 2^31 switch the kernel to int64 index math (WIDE); forced here by lowering the
    limit, the results must not change."""
    module = load_candidate("csr_rowsplit", {"ROWS_PER_PROGRAM": 2}, tmp_path_factory)
    monkeypatch.setattr(module, "_INT32_LIMIT", 10)
    packed = run_and_check(module, SMALL, 6, torch.float32)
    (plan,) = packed["scratch"].values()
    names = list(plan["kernel"].arg_names)
    assert plan["args"][names.index("WIDE")] is True


def test_rowsplit_auto_rules_match_the_tuned_configs(tmp_path_factory):
    """The "auto" tiles reproduce the configurations measured fastest on the H200 (docs/kernels.md):
    90% sparse rows of ~410 -> 1 warp, 64-nonzero chunks; 99% (rows of ~41, padded to 80) with
    2 rows per program -> one 128-wide chunk, 2 warps; N = 2048 -> 128-column tiles, 16-nonzero
    chunks, 4 warps; few rows -> narrower N tiles."""
    def packed_like(M, mean, longest, layout):
        return {"shape": (M, 4096), "layout": layout, "width": longest if layout == "padded" else 0,
                "max_row_nnz": longest, "mean_row_nnz": mean}

    one = load_candidate("csr_rowsplit", {}, tmp_path_factory)
    two = load_candidate("csr_rowsplit", {"ROWS_PER_PROGRAM": 2}, tmp_path_factory)
    cfg = one.launch_config(packed_like(4096, 410, 490, "csr"), 16)
    assert (cfg["BLOCK_N"], cfg["BLOCK_NNZ"], cfg["num_warps"], cfg["ONE_CHUNK"]) == (16, 64, 1, False)
    cfg = two.launch_config(packed_like(4096, 41, 80, "padded"), 16)
    assert (cfg["BLOCK_N"], cfg["BLOCK_NNZ"], cfg["num_warps"], cfg["ONE_CHUNK"]) == (16, 128, 2, True)
    cfg = one.launch_config(packed_like(4096, 41, 80, "padded"), 2048)
    assert (cfg["BLOCK_N"], cfg["BLOCK_NNZ"], cfg["num_warps"]) == (128, 16, 4)
    assert one.launch_config(packed_like(512, 10, 30, "padded"), 256)["BLOCK_N"] == 64


def test_compact_auto_split_and_direct_b(tmp_path_factory):
    """Row pruning keeps every column: B is read directly (no column-id loads). The split-K
    counters are reset by the reducing program, so repeated launches stay exact."""
    module = load_candidate("compact_rows_cols", {"SPLIT_K": 4, "BLOCK_M": 16, "BLOCK_K": 16}, tmp_path_factory)
    A = _matrix("rows_only")
    packed = run_and_check(module, A, 9, torch.float16)
    assert packed["direct_b"] and packed["kept_k"] == A.shape[1]
    (plan,) = packed["scratch"].values()
    assert plan["config"]["SPLIT"] == 4 and int(plan["cnt"].abs().sum()) == 0
    B = torch.randn(A.shape[1], 9, generator=torch.Generator().manual_seed(5)).to(torch.float16)
    out = torch.full((A.shape[0], 9), float("nan"), dtype=torch.float16)
    module.spmm(packed, B, out)
    ref = A.to_dense() @ B.double().numpy()
    assert np.allclose(out.double().numpy(), ref, rtol=1e-2, atol=1e-2)
    assert not load_candidate("compact_rows_cols", {}, tmp_path_factory).prepare(
        _matrix("pruned"), torch.float16, "cpu")["direct_b"]
    auto = load_candidate("compact_rows_cols", {}, tmp_path_factory)
    big = {"kept_m": 2048, "kept_k": 4096, "dtype": torch.float16}
    small_n, large_n = auto.launch_config(big, 16), auto.launch_config(big, 2048)
    assert (small_n["BLOCK_M"], small_n["BLOCK_K"], small_n["SPLIT"], small_n["num_stages"]) == (64, 128, 4, 4)
    assert (large_n["BLOCK_M"], large_n["BLOCK_N"], large_n["SPLIT"], large_n["num_stages"]) == (128, 128, 1, 3)


def test_compact_prepare_matches_the_format():
    """The template's O(nnz) compaction equals sparseditto.formats.Compacted."""
    from sparseditto.formats import Compacted
    from sparseditto.kernel_templates.registry import get_template

    spec = importlib.util.spec_from_file_location("compact_tpl", get_template("compact_rows_cols").path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for A in (_matrix("pruned"), _matrix("rows_only"), SMALL):
        rows, cols, dense = module._compact(A)
        ref = Compacted.from_matrix(A)
        assert np.array_equal(rows, ref.rows) and np.array_equal(cols, ref.cols)
        assert np.array_equal(dense, ref.dense.astype(np.float32))


def test_plans_are_cached_per_layout_of_b(tmp_path_factory):
    """One plan per (N, B/C strides and alignment): a transposed B gets its own plan, and the
    cached plan is reused (no re-planning) for a second call with the same layout."""
    module = load_candidate("csr_rowsplit", {}, tmp_path_factory)
    packed = module.prepare(SMALL, torch.float32, "cpu")
    B = torch.randn(96, 4)
    out = torch.empty(64, 4)
    module.spmm(packed, B, out)
    (plan,) = packed["scratch"].values()
    module.spmm(packed, torch.randn(96, 4), out)
    assert list(packed["scratch"].values()) == [plan]
    module.spmm(packed, B.t().contiguous().t(), out)
    assert len(packed["scratch"]) == 2
