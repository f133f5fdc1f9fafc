"""The template registry: discovery without imports, instantiation, validation, grids and cost."""
from __future__ import annotations

import ast
import difflib
import importlib
import hashlib
import json
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from sparseditto.kernel_templates import cost as cost_mod
from sparseditto.kernel_templates.registry import (
    TEMPLATE_ROOT,
    Candidate,
    describe_template,
    discovery_problems,
    get_template,
    list_templates,
)
from sparseditto.matrix import SparseMatrix

MINE = {"csr_rowsplit": "triton", "csr_balanced": "triton", "compact_rows_cols": "triton", "csr_vector": "cuda"}


def _matrix(m, k, density, seed, empty_rows=(), empty_cols=()) -> SparseMatrix:
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((m, k)) * (rng.random((m, k)) < density)
    dense[list(empty_rows), :] = 0
    dense[:, list(empty_cols)] = 0
    return SparseMatrix.from_scipy(sp.csr_array(dense))


def _report(A: SparseMatrix):
    analysis = pytest.importorskip("sparseditto.analysis")
    return analysis.analyze(A)


def _hand_report(density: float = 0.05, empty_rows: int = 0, empty_cols: int = 0) -> dict:
    """A report with round numbers for hand-checked formulas (100 x 200)."""
    nnz = int(round(100 * 200 * density))
    return {"shape": (100, 200), "nnz": nnz, "row_stats": {"mean": nnz / 100, "max": nnz / 100, "cv": 0.0},
            "empty_rows": empty_rows, "empty_cols": empty_cols, "best_block_shape": None, "blocks": [],
            "nm_conformance": {"2:4": {"row": 0.5, "col": 0.5}}}


# ---- discovery --------------------------------------------------------------------------------

def test_discovery_lists_every_template_without_importing_them():
    before = set(sys.modules)
    templates = {t.name: t for t in list_templates()}
    for name, backend in MINE.items():
        assert templates[name].backend == backend
    assert templates["dense"].backend == "builtin" and templates["dense"].path is None
    files = sorted(p.stem for d in ("triton", "cuda") for p in (TEMPLATE_ROOT / d).glob("*.py")
                   if not p.name.startswith("_"))
    assert sorted(n for n in templates if n != "dense") == files
    assert discovery_problems() == {}
    imported = {m for m in set(sys.modules) - before if "kernel_templates.triton" in m or "kernel_templates.cuda" in m}
    assert not imported, f"discovery imported template modules: {imported}"


@pytest.mark.parametrize("name", sorted(MINE))
def test_meta_is_a_literal_and_matches(name):
    t = get_template(name)
    tree = ast.parse(t.path.read_text())
    meta = next(ast.literal_eval(n.value) for n in tree.body
                if isinstance(n, ast.Assign) and any(getattr(x, "id", None) == "META" for x in n.targets))
    assert meta == t.meta
    assert set(meta["defaults"]) == set(meta["params"])
    assert meta["name"] == t.path.stem and meta["backend"] == t.path.parent.name


def test_get_template_unknown_lists_names():
    with pytest.raises(ValueError) as info:
        get_template("csr_rowspilt")
    msg = str(info.value)
    assert "csr_rowsplit" in msg and "dense" in msg and "Did you mean 'csr_rowsplit'" in msg


# ---- instantiation ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(MINE))
def test_instantiate_rewrites_only_the_params_line(name):
    t = get_template(name)
    params = t.param_grid(_hand_report(0.1), 16, "H100", limit=8)[-1]
    cand = t.instantiate(params)
    assert cand.template == name and cand.backend == t.backend and cand.format == t.format
    assert cand.origin == "template" and cand.params == t.validate_params(params)
    diff = [line for line in difflib.unified_diff(t.source().splitlines(), cand.source.splitlines(), lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert diff == ['-PARAMS = dict(META["defaults"])', "+PARAMS = " + repr(cand.params)]
    assert ast.literal_eval(diff[1].split("=", 1)[1].strip()) == cand.params


def test_cuda_source_inlines_the_cu_file_and_nothing_else():
    t = get_template("csr_vector")
    raw = t.path.read_text()
    cu = "\n\n".join((t.path.parent / f).read_text().rstrip("\n") for f in ("dtypes.cuh", "csr_vector.cu"))
    placeholder = 'CUDA_SRC = r"""@SPARSEDITTO_INLINE dtypes.cuh csr_vector.cu@"""'
    assert raw.count(placeholder) == 1
    assert t.source() == raw.replace(placeholder, 'CUDA_SRC = r"""\n' + cu + '\n"""')


def test_source_hash_is_stable_and_content_addressed():
    t = get_template("csr_rowsplit")
    a = t.instantiate({"BLOCK_N": 32, "REORDER": "length"})
    b = t.instantiate({"REORDER": "length", "BLOCK_N": 32})
    c = t.instantiate({"BLOCK_N": 64, "REORDER": "length"})
    assert a.source_hash == b.source_hash == hashlib.sha256(a.source.encode()).hexdigest()
    assert a.source == b.source and c.source_hash != a.source_hash
    assert t.instantiate({}).source_hash == t.instantiate(dict(t.defaults)).source_hash


def test_candidate_checks_its_hash():
    src = "def prepare(A, dtype, device):\n    return {}\n"
    digest = hashlib.sha256(src.encode()).hexdigest()
    assert Candidate(template="x", source=src, backend="triton").source_hash == digest
    assert Candidate(template="x", source=src, source_hash=digest[:32], backend="triton", format=None).format == "unknown"
    with pytest.raises(ValueError, match="is not the sha256"):
        Candidate(template="x", source=src, source_hash="0" * 64, backend="triton")
    dense = get_template("dense").instantiate({})
    assert dense.backend == "builtin" and dense.source == "" and dense.format == "dense"
    json.dumps(dense.model_dump())


def test_validation_names_the_parameter_and_legal_values():
    t = get_template("csr_rowsplit")
    with pytest.raises(ValueError, match=r"Unknown parameter 'BLOCK_X'.*BLOCK_N"):
        t.instantiate({"BLOCK_X": 4})
    with pytest.raises(ValueError, match=r"Illegal value 48 for parameter 'BLOCK_N'.*\['auto', 1, 2"):
        t.instantiate({"BLOCK_N": 48})
    with pytest.raises(ValueError, match=r"Illegal value '32' for parameter 'BLOCK_N'"):
        t.instantiate({"BLOCK_N": "32"})
    with pytest.raises(ValueError, match=r"Illegal value True for parameter 'ROWS_PER_PROGRAM'"):
        t.instantiate({"ROWS_PER_PROGRAM": True})
    with pytest.raises(ValueError, match=r"Illegal value 1 for parameter 'ALLOW_TF32'"):
        get_template("compact_rows_cols").instantiate({"ALLOW_TF32": 1})
    assert t.instantiate({"BLOCK_N": np.int64(32)}).params["BLOCK_N"] == 32
    with pytest.raises(ValueError, match="Unknown parameter 'BLOCK_N' for template 'dense'"):
        get_template("dense").instantiate({"BLOCK_N": 16})


def test_every_instance_passes_the_harness_static_checks():
    static = pytest.importorskip("sparseditto.harness.static_checks")
    for t in list_templates():
        if t.backend == "builtin":
            continue
        for params in [{}] + t.param_grid(_hand_report(0.1, empty_rows=3), 16, "H100", limit=3):
            result = static.check_source(t.instantiate(params).source)
            assert result.ok, (t.name, params, result.violations)


# ---- planning: applicability, grids -----------------------------------------------------------

def test_applicability_rules():
    plain = _hand_report(0.1)
    pruned = _hand_report(0.1, empty_rows=10, empty_cols=0)
    for name in ("csr_rowsplit", "csr_balanced", "csr_vector", "dense"):
        assert get_template(name).applicable(plain)[0]
    ok, why = get_template("compact_rows_cols").applicable(plain)
    assert not ok and "no empty rows or columns" in why
    ok, why = get_template("compact_rows_cols").applicable(pruned)
    assert ok and "10 empty rows" in why
    names = {t.name for t in list_templates()}
    if "bsr_tc" in names:
        assert not get_template("bsr_tc").applicable(plain)[0]
        assert get_template("bsr_tc").applicable({**plain, "best_block_shape": (16, 16)})[0]
    if "nm_compressed" in names:
        assert not get_template("nm_compressed").applicable(plain)[0]
        conforming = {**plain, "nm_conformance": {"2:4": {"row": 0.97, "col": 0.4}}}
        ok, why = get_template("nm_compressed").applicable(conforming)
        assert ok and "2:4" in why


@pytest.fixture(scope="module")
def reports():
    from sparseditto import generate

    return {
        "random": _report(_matrix(96, 128, 0.1, seed=0)),
        "pruned": _report(_matrix(96, 128, 0.5, seed=1, empty_rows=range(0, 96, 3), empty_cols=range(0, 128, 5))),
        "powerlaw": _report(generate.rmat(9, 8, seed=2)),
        "empty": _report(SparseMatrix.from_scipy(sp.csr_array((16, 24)))),
    }


def test_param_grids_are_small_valid_and_distinct(reports):
    for report in reports.values():
        for t in list_templates():
            if not t.applicable(report)[0]:
                continue
            for n in (1, 16, 257):
                for limit in (8, 2):
                    grid = t.param_grid(report, n, "H200", limit=limit)
                    assert 1 <= len(grid) <= limit, (t.name, n, len(grid))
                    keys = [json.dumps(g, sort_keys=True) for g in grid]
                    assert len(set(keys)) == len(keys), (t.name, "duplicate grid points")
                    for params in grid:
                        assert t.validate_params(params) == params  # full, legal dicts
    with pytest.raises(ValueError, match="limit must be a positive integer"):
        get_template("csr_rowsplit").param_grid(reports["random"], 16, "H200", limit=0)


def test_grids_follow_the_pattern(reports):
    rows_random = get_template("csr_rowsplit").param_grid(reports["random"], 16, "H200")[0]
    rows_power = get_template("csr_rowsplit").param_grid(reports["powerlaw"], 16, "H200")[0]
    assert rows_random["REORDER"] == "none" and rows_power["REORDER"] == "length"
    vec = get_template("csr_vector")
    assert vec.param_grid(reports["random"], 1, "H200")[1]["LAYOUT"] == "nnz"
    assert vec.param_grid(reports["random"], 256, "H200")[1]["LAYOUT"] == "cols"


# ---- cost -------------------------------------------------------------------------------------

def test_cost_matches_hand_formulas():
    from sparseditto.kernel_templates.triton.planning import csr_balanced as balanced_plan
    from sparseditto.kernel_templates.triton.planning import csr_rowsplit as rowsplit_plan
    from sparseditto.targets import get_target

    h200 = get_target("H200")
    bw = h200.bandwidth_gbs() * 1e9
    rep = _hand_report(0.05, empty_rows=10, empty_cols=20)  # nnz = 1000
    n = 8
    b, c = 200 * n * 2, 100 * n * 2
    est = get_template("csr_rowsplit").cost(rep, n, "float16", "H200", {"INDEX_BITS": 32})
    assert est.bytes == 1000 * (2 + 4) + 101 * 4 + b + c
    assert est.flops == 2 * 1000 * n and est.unit == "cuda_core"
    assert est.memory_s == pytest.approx(est.bytes / bw)
    # Rows of 10 nonzeros: one program streams 10 * (2 + 4 + 8*2) bytes at 2/132 of the bandwidth,
    # which here exceeds the whole matrix's memory time.
    critical = 10 * (2 + 4 + n * 2) / (2 * bw / h200.sm_count)
    # ... and the measured per-nonzero floor (csr_rowsplit's planning module) both exceed it: the larger decides
    floor = cost_mod.h200_scaled(1000 * rowsplit_plan.NNZ_STEP_S, h200)
    assert critical > est.memory_s and floor > est.memory_s
    assert est.bound == ("imbalance" if critical > floor else "decode")
    assert est.seconds == pytest.approx(max(critical, floor) + cost_mod.LAUNCH_S)
    big = {**_hand_report(), "shape": (4096, 4096), "nnz": 4096 * 410, "row_stats": {"mean": 410, "max": 410, "cv": 0}}
    dense_rows = get_template("csr_rowsplit").cost(big, 16, "float16", "H200", {"INDEX_BITS": 32})
    assert dense_rows.bytes == 4096 * 410 * 6 + 4097 * 4 + 2 * 4096 * 16 * 2
    big_floor = cost_mod.h200_scaled(4096 * 410 * rowsplit_plan.NNZ_STEP_S, h200)
    assert dense_rows.bound == "decode" and big_floor > max(dense_rows.memory_s, dense_rows.compute_s)
    assert dense_rows.seconds == pytest.approx(big_floor + cost_mod.LAUNCH_S)
    est16 = get_template("csr_rowsplit").cost(rep, n, "float16", h200, {})  # auto: int16 ids (K <= 32768)
    assert est16.bytes == est.bytes - 1000 * 2
    vec = get_template("csr_vector").cost(rep, n, "float16", "H200")
    assert vec.bytes == est.bytes  # always int32 ids
    reordered = get_template("csr_rowsplit").cost(rep, n, "float16", "H200", {"INDEX_BITS": 32, "REORDER": "length"})
    assert reordered.bytes == est.bytes + 100 * 4
    dense = get_template("dense").cost(rep, n, "float16", "H200")
    assert dense.bytes == 100 * 200 * 2 + b + c and dense.flops == 2 * 100 * 200 * n and dense.unit == "tensor"
    assert get_template("dense").cost(rep, n, "float32", "H200").unit == "cuda_core"
    comp = get_template("compact_rows_cols").cost(rep, n, "float16", "H200", {"BLOCK_M": 16, "BLOCK_K": 16})
    assert comp.bytes == 90 * 180 * 2 + (90 + 180) * 4 + 180 * n * 2 + c
    assert comp.flops == 2 * 96 * 192 * 16 and comp.unit == "tensor"  # padded to 16 x 16 x 16 tiles
    bal = get_template("csr_balanced").cost(rep, n, "float32", "H200", {"NNZ_PER_PROGRAM": 64, "INDEX_BITS": 32})
    programs = -(-1000 // 64)
    assert bal.bytes == 1000 * (4 + 4) + 101 * 4 + 200 * n * 4 + 100 * n * 4 + 2 * programs * n * 4
    bal_floor = cost_mod.h200_scaled(1000 * balanced_plan.NNZ_STEP_S, h200)
    assert bal.seconds == pytest.approx(max(bal.memory_s, bal.compute_s, bal_floor) + cost_mod.LAUNCH_S)
    two = get_template("csr_balanced").cost(rep, n, "float32", "H200", {"NNZ_PER_PROGRAM": 64, "FIXUP": "launch"})
    assert two.seconds == pytest.approx(max(two.memory_s, two.compute_s, bal_floor) + 2 * cost_mod.LAUNCH_S)


def test_format_bytes_equal_the_formats_nbytes():
    from sparseditto import formats as F

    A = _matrix(64, 96, 0.2, seed=4, empty_rows=(5,), empty_cols=(7, 8))
    rep = _report(A)
    cases = [("csr", {"INDEX_BITS": 32}, F.CSR.from_matrix(A)),
             ("csr", {"INDEX_BITS": 16}, F.CSR.from_matrix(A, index_dtype="int16")),
             ("bsr", {"BM": 16, "BK": 16}, F.BSR.from_matrix(A, (16, 16))),
             ("bsr", {"BM": 8, "BK": 32}, F.BSR.from_matrix(A, (8, 32))),
             ("bitmap", {}, F.BitmapTiles.from_matrix(A, tile_k=32)),
             ("compact", {}, F.Compacted.from_matrix(A)),
             ("ell", {}, F.ELL.from_matrix(A))]
    for fmt, params, built in cases:
        for vb, dtype in ((2, "float16"), (4, "float32")):
            assert cost_mod.format_bytes(fmt, rep, dtype, params) == built.nbytes(vb), (fmt, params, dtype)
    nm = SparseMatrix.from_scipy(sp.csr_array(_two_four(64, 96)))  # every group of 4 holds exactly 2
    assert cost_mod.format_bytes("nm", _report(nm), "float16", {"NM": "2:4"}) == F.NMCompressed.from_matrix(nm).nbytes(2)


def _two_four(m, k):
    rng = np.random.default_rng(5)
    keep = np.argsort(rng.random((m, k // 4, 4)), axis=2)[:, :, :2]
    dense = np.zeros((m, k // 4, 4))
    np.put_along_axis(dense, keep, rng.standard_normal(keep.shape) + 3.0, axis=2)
    return dense.reshape(m, k)


def test_cost_is_monotone_in_density_and_n():
    densities = (0.02, 0.05, 0.1, 0.3)
    for t in list_templates():
        for dtype in ("float16", "float32"):
            by_density = [t.cost(_hand_report(d, empty_rows=5), 16, dtype, "H200") for d in densities]
            assert all(a.bytes <= b.bytes and a.seconds <= b.seconds for a, b in zip(by_density, by_density[1:])), t.name
            by_n = [t.cost(_hand_report(0.1, empty_rows=5), n, dtype, "A100") for n in (1, 16, 64, 256, 4096)]
            assert all(a.bytes < b.bytes and a.flops <= b.flops and a.seconds <= b.seconds
                       for a, b in zip(by_n, by_n[1:])), t.name
    csr = [get_template("csr_rowsplit").cost(_hand_report(d), 16, "float16", "H200").bytes for d in densities]
    assert all(a < b for a, b in zip(csr, csr[1:]))


def test_balanced_beats_rowsplit_on_one_huge_row():
    m, k = 4096, 16384
    rep = {"shape": (m, k), "nnz": k + (m - 1) * 8, "row_stats": {"mean": (k + (m - 1) * 8) / m, "max": k, "cv": 4.0},
           "empty_rows": 0, "empty_cols": 0, "best_block_shape": None, "blocks": [], "nm_conformance": {}}
    rows = get_template("csr_rowsplit").cost(rep, 64, "float16", "H200")
    bal = get_template("csr_balanced").cost(rep, 64, "float16", "H200")
    assert rows.bound == "imbalance" and "longest row" in rows.notes
    assert bal.seconds < rows.seconds


def test_cost_rejects_bad_inputs():
    t = get_template("csr_rowsplit")
    with pytest.raises(ValueError, match="positive integer"):
        t.cost(_hand_report(), 0, "float16", "H200")
    with pytest.raises(ValueError, match="Unsupported value dtype"):
        t.cost(_hand_report(), 16, "int8", "H200")
    with pytest.raises(ValueError, match="Unknown GPU target"):
        t.cost(_hand_report(), 16, "float16", "Z900")
    with pytest.raises(ValueError, match="Illegal value"):
        t.cost(_hand_report(), 16, "float16", "H200", {"BLOCK_NNZ": 7})


def test_describe_template_is_json():
    for t in list_templates():
        desc = describe_template(t.name)
        text = json.dumps(desc)
        assert json.loads(text)["name"] == t.name
        assert desc["cost_model"] and desc["applicability"] and "params" in desc
        assert (desc["source_chars"] > 1000) == (t.backend != "builtin")


def test_cuda_templates_are_planned_only_where_cupy_imports():
    """The CUDA C++ templates launch through CuPy (an extra): without it the planner leaves them out
    of what it may try on a GPU too, and says how to install the extra. The cost model's table
    itself keeps them (planning for a GPU can be studied anywhere)."""
    from sparseditto import generate
    from sparseditto.agents.costing import runnable_templates, template_table
    from sparseditto.analysis import analyze
    from sparseditto.kernel_templates.registry import backend_unavailable, list_templates
    from sparseditto.targets import get_target

    cuda = {t.name for t in list_templates() if t.backend == "cuda"}
    assert "csr_vector" in cuda
    assert backend_unavailable("triton") is None
    report = analyze(generate.unstructured(128, 128, 0.9, seed=1)).model_dump(mode="json")
    table, _ = template_table(report, 16, "float16", get_target("H100"), exec_backend="cuda")
    assert "csr_vector" in {t["name"] for t in table}
    planned = {t["name"] for t in runnable_templates(table, "cuda")}
    assert runnable_templates(table, "interpret") == table
    try:
        importlib.import_module("cupy")
        has_cupy = True
    except Exception:
        has_cupy = False
    if has_cupy:
        assert backend_unavailable("cuda") is None and "csr_vector" in planned
    else:
        why = backend_unavailable("cuda")
        assert "CuPy cannot be imported" in why and "sparseditto[gpu]" in why and "gpu-cuda12" in why
        assert not planned & cuda and {"csr_rowsplit", "dense"} <= planned


def test_an_adapted_kernels_floor_follows_the_bytes_it_packs():
    """A kernel adapted from a template (an LLM's edit) is costed with A's measured bytes; the template's
    measured decode floor scales with them (same bytes in flight, fewer bytes to stream)."""
    rep = {**_hand_report(), "shape": (4096, 4096), "nnz": 4096 * 410, "row_stats": {"mean": 410, "max": 410, "cv": 0}}
    t = get_template("csr_rowsplit")
    own = t.cost(rep, 8, "float16", "H200", {})
    half = t.cost(rep, 8, "float16", "H200", {}, a_bytes=own.a_bytes / 2)
    assert own.bound == half.bound == "decode"
    assert half.seconds - cost_mod.LAUNCH_S == pytest.approx((own.seconds - cost_mod.LAUNCH_S) / 2)
