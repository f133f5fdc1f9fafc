"""The pattern analyzer: exact measurements, the class on every generated pattern, real files.

Measurements are checked against a brute-force dense-mask reference (both internal tile paths,
dense grid and sorted sparse tiles, and tiny stripes); the classifier against the labelled
generator suite (>= 95% right, the issue's bar); the real DLMC and SuiteSparse files for
exact nnz/sparsity and a clean run.
"""
from __future__ import annotations

import gzip
import json
from collections import Counter

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp

from sparseditto import generate as gen
from sparseditto import pattern_features as pf
from sparseditto.analysis import FEATURE_NAMES, PatternReport, analyze, diag_band
from sparseditto.matrix import SparseMatrix
from sparseditto.pattern_classes import PATTERNS, ramp


def from_mask(mask: np.ndarray, name: str = "m", seed: int = 0) -> SparseMatrix:
    csr = sp.csr_array(mask.astype(np.float32))
    csr.data = np.random.default_rng(seed).standard_normal(csr.nnz).astype(np.float32)
    return SparseMatrix.from_scipy(csr, name=name)


# ---- brute-force reference ------------------------------------------------------------------
def reference(M: np.ndarray) -> dict:
    m, k = M.shape
    nnz = int(M.sum())
    out = {"nm": {}, "blocks": {}}
    for n, g in pf.NM_RATIOS:
        rows = np.pad(M, ((0, 0), (0, -k % g))).reshape(m, -1, g).sum(-1)
        cols = np.pad(M, ((0, -m % g), (0, 0))).reshape(-1, g, k).sum(1)
        out["nm"][f"{n}:{g}"] = {"row": float((rows <= n).mean()), "col": float((cols <= n).mean())}
    shapes = [(a, b) for a in pf.BLOCK_EDGES for b in pf.BLOCK_EDGES if a <= m and b <= k]
    shapes += [s for s in pf.VECTOR_SHAPES if s[0] <= m and s[1] <= k]
    for bm, bk in shapes:
        grid = np.pad(M, ((0, -m % bm), (0, -k % bk))).reshape(-(-m // bm), bm, -(-k // bk), bk).any(axis=(1, 3))
        nz = int(grid.sum())
        out["blocks"][(bm, bk)] = (nz, grid.size, nnz / (nz * bm * bk) if nz else 0.0)
    i, j = np.nonzero(M)
    off = np.abs(i - j)
    out["bandwidth"] = int(off.max()) if nnz else 0
    out["diag_fraction"] = float((off <= diag_band((m, k))).mean()) if nnz else 0.0
    out["rows"], out["cols"] = M.sum(1), M.sum(0)
    return out


def ref_gini(x: np.ndarray) -> float:
    x = x.astype(np.float64)
    if x.sum() == 0:
        return 0.0
    return float(np.abs(x[:, None] - x[None, :]).sum() / (2 * x.size ** 2 * x.mean()))


def check_against_reference(A: SparseMatrix) -> PatternReport:
    r = analyze(A)
    M = A.mask()
    ref = reference(M)
    assert r.nnz == A.nnz and r.shape == A.shape
    assert r.sparsity == 1.0 - A.nnz / (A.shape[0] * A.shape[1])
    assert r.nm_conformance.keys() == ref["nm"].keys()
    for ratio, axes in ref["nm"].items():
        assert r.nm_conformance[ratio] == pytest.approx(axes, abs=1e-12), ratio
    got = {tuple(b.shape): (b.nonzero_blocks, b.total_blocks, b.occupancy) for b in r.blocks}
    assert set(got) == set(ref["blocks"])
    for shape, (nz, total, occ) in ref["blocks"].items():
        assert got[shape][:2] == (nz, total), shape
        assert got[shape][2] == pytest.approx(occ, rel=1e-12)
        assert r.block_stat(shape).block_density == pytest.approx(nz / total)
    assert r.bandwidth == ref["bandwidth"]
    assert r.diag_fraction == pytest.approx(ref["diag_fraction"])
    for stats, lengths, empty in ((r.row_stats, ref["rows"], r.empty_rows), (r.col_stats, ref["cols"], r.empty_cols)):
        assert empty == int((lengths == 0).sum())
        assert (stats.min, stats.max) == (int(lengths.min()), int(lengths.max()))
        assert stats.mean == pytest.approx(lengths.mean()) and stats.std == pytest.approx(lengths.std())
        assert stats.gini == pytest.approx(ref_gini(lengths), abs=1e-9)
    return r


@pytest.mark.parametrize("path", ["dense_grid", "sorted_tiles"])
def test_measurements_match_brute_force(path, monkeypatch):
    rng = np.random.default_rng(11)
    if path == "sorted_tiles":   # the path for huge sparse graphs, with a coarse |i - j| histogram
        monkeypatch.setattr(pf, "DENSE_TILE_LIMIT", 0)
        monkeypatch.setattr(pf, "OFFSET_HIST_BINS", 16)
    for trial in range(12):
        monkeypatch.setattr(pf, "CHUNK_NNZ", int(rng.integers(1, 4000)))
        m, k = (int(x) for x in rng.integers(1, 260, size=2))
        kind = trial % 4
        if kind == 0:
            A = gen.unstructured(m, k, float(rng.uniform(0.3, 0.99)), seed=trial)
        elif kind == 1:
            A = gen.nm_sparse(m, k, n=2, m_group=4, axis="col", violations=0.05, seed=trial)
        elif kind == 2:
            A = gen.block_sparse(m, k, (8, 16), block_density=0.3, occupancy=0.5, seed=trial)
        else:
            A = gen.banded(m, k, bandwidth=int(rng.integers(0, 9)), fill=0.7, seed=trial)
        check_against_reference(A)


@pytest.mark.parametrize("bins", [1 << 22, 64])
def test_offset_quantile_is_exact_or_a_tight_upper_bound(bins, monkeypatch):
    monkeypatch.setattr(pf, "OFFSET_HIST_BINS", bins)
    for A in (gen.banded(3000, 3000, 20, 0.5), gen.unstructured(5000, 40, 0.9), gen.laplacian_2d(30, 30)):
        i, j = np.nonzero(A.mask())
        exact = int(np.quantile(np.abs(i - j), 0.995, method="inverted_cdf"))
        f = pf.compute_features(A)
        q = f.offset_quantile(0.995)
        assert exact <= q < exact + f.offset_bin
        assert f.offset_bin == -(-max(A.shape) // bins)


# ---- classification -------------------------------------------------------------------------
@pytest.mark.slow
def test_classifier_accuracy_on_the_labelled_suite():
    cases = gen.labelled_suite(30, seed=2024)
    confusion = Counter()
    wrong = []
    for label, kind, kw in cases:
        report = analyze(gen.make(kind, **kw))
        confusion[(label, report.pattern)] += 1
        if report.pattern != label:
            wrong.append((label, report.pattern, kind, kw))
        assert 0.0 <= report.confidence <= 1.0
    accuracy = 1.0 - len(wrong) / len(cases)
    assert accuracy >= 0.95, f"accuracy {accuracy:.3f}; misclassified: {wrong[:10]}"
    for cls in PATTERNS:   # and no class is systematically lost
        right = confusion[(cls, cls)]
        total = sum(v for (t, _), v in confusion.items() if t == cls)
        assert right >= 0.85 * total, f"{cls}: {right}/{total}"


@pytest.mark.parametrize("block", [(16, 16), (32, 32), (16, 64), (64, 16), (8, 32)])
def test_block_parameters_recover_the_generator_shape(block):
    A = gen.block_sparse(1024, 1024, block, block_density=0.2, occupancy=0.8, seed=3)
    r = analyze(A)
    assert r.pattern == "block" and r.confidence > 0.8
    assert r.best_block_shape == block and r.params["block_shape"] == list(block)
    assert r.params["occupancy"] == pytest.approx(0.8, abs=0.03)
    assert r.params["block_density"] == pytest.approx(0.2, abs=0.01)


@pytest.mark.parametrize("n,g,axis,viol", [(2, 4, "row", 0.0), (2, 4, "col", 0.01), (1, 2, "row", 0.01), (4, 8, "col", 0.0)])
def test_nm_parameters(n, g, axis, viol):
    r = analyze(gen.nm_sparse(512, 768, n=n, m_group=g, axis=axis, violations=viol, seed=5))
    assert r.pattern == "nm" and r.params["nm"] == [n, g] and r.params["axis"] == axis
    assert r.params["violations"] == pytest.approx(viol, abs=0.005)
    assert r.nm_conformance[f"{n}:{g}"][axis] == pytest.approx(1.0 - viol, abs=0.005)
    assert r.best_block_shape is None


def test_other_class_parameters():
    rp = analyze(gen.row_pruned(600, 300, prune_fraction=0.5, density=0.6, seed=1))
    assert rp.pattern == "row_pruned" and rp.params["kept_rows"] == 300 and rp.params["kept_cols"] == 300
    cp = analyze(gen.column_pruned(300, 600, prune_fraction=0.4, density=1.0, seed=1))
    assert cp.pattern == "column_pruned" and cp.params["kept_cols"] == 360
    lap = analyze(gen.laplacian_2d(40, 30))
    assert lap.pattern == "banded" and lap.params["bandwidth"] == 40 and lap.bandwidth == 40
    pl = analyze(gen.rmat(12, seed=1))
    assert pl.pattern == "power_law" and pl.powerlaw_alpha is not None and 1.0 < pl.params["alpha"] < 4.0
    assert 0.0 <= pl.powerlaw_r2 <= 1.0
    un = analyze(gen.unstructured(512, 512, 0.9, seed=1))
    assert un.pattern == "unstructured" and un.confidence > 0.9 and un.best_block_shape is None
    assert analyze(gen.dense(200, 300, 0.05)).pattern == "dense"


def test_scores_explain_the_decision():
    r = analyze(gen.block_sparse(512, 512, (32, 32), 0.25, 1.0, seed=2))
    assert set(r.scores) == set(PATTERNS)
    assert r.scores["block"] >= 0.5 > max(r.scores[p] for p in ("dense", "banded", "nm"))
    assert r.evidence["block"]["lift"] > 2.0
    assert ramp(0.5, 0.0, 1.0) == 0.5 and ramp(2.0, 1.0, 0.0) == 0.0


# ---- signature ------------------------------------------------------------------------------
def test_signature_is_structure_only_and_stable():
    A = SparseMatrix(np.array([0, 2, 3, 5], np.int64), np.array([0, 3, 1, 0, 2], np.int32),
                     np.arange(5, dtype=np.float32) + 1, (3, 4))
    r = analyze(A)
    # pinned: the signature must never change across runs, machines or releases of numpy
    assert r.signature == "b8ff45977227c9c002eb"
    other_values = A.with_values(np.random.default_rng(0).standard_normal(5).astype(np.float32))
    as_f64 = SparseMatrix(A.indptr, A.indices, A.data.astype(np.float64), A.shape, "float64", "other")
    assert analyze(other_values).signature == r.signature == analyze(as_f64).signature
    moved = SparseMatrix(A.indptr, np.array([0, 3, 1, 0, 3], np.int32), A.data, (3, 4))
    wider = SparseMatrix(A.indptr, A.indices, A.data, (3, 5))
    assert len({r.signature, analyze(moved).signature, analyze(wider).signature}) == 3
    big = gen.unstructured(300, 200, 0.9, seed=1)
    assert analyze(big).signature == analyze(gen.unstructured(300, 200, 0.9, seed=1)).signature
    assert analyze(big).signature != analyze(gen.unstructured(300, 200, 0.9, seed=2)).signature


# ---- report API -----------------------------------------------------------------------------
def test_describe_json_roundtrip_and_feature_vector():
    for A in (gen.block_sparse(256, 512, (16, 32), 0.3, 0.7), gen.laplacian_2d(20, 20), gen.rmat(10),
              gen.nm_sparse(128, 128)):
        r = analyze(A, name="x" * 500)
        text = r.describe()
        facts = json.loads(text)
        assert len(text) <= 1500
        assert facts["pattern"] == r.pattern and facts["shape"] == list(A.shape) and facts["nnz"] == A.nnz
        assert "best_nm" in facts and "rows" in facts
        again = PatternReport.model_validate_json(r.model_dump_json())
        assert again == r
        assert PatternReport.model_validate(r.model_dump(mode="json")) == r
        vec = r.feature_vector()
        assert len(vec) == len(FEATURE_NAMES) == len(PatternReport.feature_names())
        assert all(isinstance(v, float) and 0.0 <= v <= 1.0 for v in vec)
        assert r.analysis_seconds > 0.0
    block = analyze(gen.block_sparse(256, 512, (16, 32), 0.3, 0.7))
    assert json.loads(block.describe())["best_block"]["shape"] == [16, 32]
    assert block.block_stat((16, 32)).nonzero_blocks > 0 and block.block_stat((3, 3)) is None


def test_feature_vector_separates_classes():
    a = analyze(gen.nm_sparse(256, 256, seed=1)).feature_vector()
    b = analyze(gen.nm_sparse(256, 256, seed=2)).feature_vector()
    c = analyze(gen.unstructured(256, 256, 0.5, seed=1)).feature_vector()
    assert np.linalg.norm(np.subtract(a, b)) < 0.2 * np.linalg.norm(np.subtract(a, c))


@pytest.mark.parametrize("mask", [
    np.array([[1, 0, 1, 1, 0, 0, 1, 0, 1, 1, 1]], bool),        # 1 x N
    np.array([[1], [0], [1], [1], [0], [1], [1], [1], [0]], bool),  # N x 1
    np.zeros((7, 9), bool),                                     # nothing stored
    np.eye(1, dtype=bool),                                      # 1 x 1
    np.pad(np.ones((5, 40), bool), ((3, 30), (0, 0))),          # mostly all-zero rows
])
def test_degenerate_shapes_analyze(mask):
    A = from_mask(mask)
    r = check_against_reference(A)
    assert r.pattern in PATTERNS and 0.0 <= r.confidence <= 1.0
    json.loads(r.describe())
    assert PatternReport.model_validate_json(r.model_dump_json()) == r
    if A.nnz == 0:
        assert r.pattern == "row_pruned" and r.params["kept_rows"] == 0 and r.bandwidth == 0
        assert r.empty_rows == A.shape[0] and r.powerlaw_alpha is None


def test_non_sparsematrix_inputs_go_through_load_matrix():
    mask = np.random.default_rng(0).random((40, 30)) < 0.2
    dense = np.where(mask, 1.5, 0.0).astype(np.float32)
    r_np = analyze(dense, name="from-numpy")
    r_sp = analyze(sp.csr_matrix(dense))
    assert r_np.name == "from-numpy" and r_np.nnz == r_sp.nnz == int(mask.sum())
    assert r_np.signature == r_sp.signature == analyze(from_mask(mask)).signature


@pytest.mark.parametrize("indices,match", [
    ([0, 3, 1, 2, 0], "row 2 has column 0 after column 2"),   # unsorted inside the last row
    ([0, 0, 1, 0, 2], "row 0 has column 0 after column 0"),   # duplicate
    ([0, 3, 1, 0, 4], "column index 4 out of range \\[0, 4\\)"),
])
def test_non_canonical_input_is_rejected(indices, match):
    A = SparseMatrix(np.array([0, 2, 3, 5], np.int64), np.array(indices, np.int32), np.ones(5, np.float32), (3, 4))
    with pytest.raises(ValueError, match=match):
        analyze(A)


# ---- real matrices --------------------------------------------------------------------------
def _smtx_header_nnz(path) -> tuple[int, int, int]:
    with gzip.open(path, "rt") as fh:
        return tuple(int(x) for x in fh.readline().replace(",", " ").split())


def test_every_dlmc_file_analyzes(shared_data):
    from sparseditto.io import load_matrix

    files = sorted((shared_data / "dlmc").rglob("*.smtx.gz"))
    assert files, "no DLMC files found"
    for path in files:
        rows, cols, nnz = _smtx_header_nnz(path)
        r = analyze(load_matrix(path))
        assert r.shape == (rows, cols) and r.nnz == nnz, path
        assert r.sparsity == 1.0 - nnz / (rows * cols)
        assert r.pattern in PATTERNS and len(r.describe()) <= 1500


def test_every_suitesparse_file_analyzes(shared_data):
    from sparseditto.io import load_matrix

    files = sorted((shared_data / "suitesparse").glob("*.mtx*"))
    assert files, "no SuiteSparse files found"
    patterns = Counter()
    for path in files:
        coo = sp.coo_array(scipy.io.mmread(path))   # independent parser; expands symmetric files
        coo.sum_duplicates()
        stored_zeros = coo.nnz - np.count_nonzero(coo.data)   # dropped: a stored 0 is no nonzero
        structural = coo.nnz - stored_zeros
        r = analyze(load_matrix(path))
        assert r.shape == coo.shape and r.nnz == structural, path
        assert r.explicit_zeros_dropped == stored_zeros, path
        assert r.sparsity == 1.0 - structural / (coo.shape[0] * coo.shape[1])
        patterns[r.pattern] += 1
    assert patterns["banded"] >= 1   # olm1000 (Olmstead model) is tridiagonal-like


@pytest.mark.parametrize("make, words", [
    (lambda: gen.block_sparse(512, 512, (32, 32), 0.1, seed=2), ["32x32 blocks", "% of the block grid holds a nonzero", "100% full"]),
    (lambda: gen.nm_sparse(256, 256, n=2, m_group=4, seed=2), ["2:4 along rows", "100.0%", "random placement"]),
    (lambda: gen.row_pruned(256, 128, 0.5, seed=2), ["128 of 256 rows are empty", "kept part is 100% dense"]),
    (lambda: gen.column_pruned(128, 256, 0.5, seed=2), ["128 of 256 columns are empty"]),
    (lambda: gen.banded(256, 256, 4, seed=2), ["|i - j| <= 4"]),
    (lambda: gen.rmat(10, seed=2), ["heavy-tailed", "power-law exponent"]),
    (lambda: gen.dense(64, 64, seed=2), ["no sparse format reads fewer bytes"]),
    (lambda: gen.unstructured(256, 256, 0.9, seed=2), ["no structure beyond its density", "of the 0.5 it needs"]),
])
def test_explain_gives_the_reason_in_the_rule_s_numbers(make, words):
    report = analyze(make())
    text = report.explain()
    for word in words:
        assert word in text, f"{word!r} missing from {report.pattern}: {text}"
