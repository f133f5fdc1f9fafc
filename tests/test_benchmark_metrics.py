"""`sparseditto bench`'s numbers on hand-made rows with known answers, and its case bookkeeping.

The metrics decide what the project claims ("2.1x geomean, fast_1 = 80%"), so each definition is
pinned here on rows small enough to work out by hand: the speedup basis (graph vs graph, else
eager vs eager), dense counted as a competitor, fast_p denominators with failed and vendor-less
cases, geomeans over correct cases only, the worst case and its reason.
"""
from __future__ import annotations

import math
import os
import signal

import pytest

from sparseditto.benchmark import measure, metrics, ratios
from sparseditto.benchmark.cases import Case, MatrixSpec, generated
from sparseditto.benchmark.rows import BenchRow, ChosenKernel, PathTiming
from sparseditto.benchmark.runner import Budget, _check_args, _sigterm_as_interrupt, sample_indices
from sparseditto.benchmark.suites import select_cases


def timings(chosen, dense, **vendors):
    """(eager_us, graph_us) pairs -> PathTimings; a vendor given as None did not run."""
    out = [PathTiming(name="chosen", ok=True, eager_us=chosen[0], graph_us=chosen[1]),
           PathTiming(name="cublas_dense", ok=True, eager_us=dense[0], graph_us=dense[1])]
    for name, t in vendors.items():
        out.append(PathTiming(name=name, ok=t is not None, eager_us=t[0] if t else None,
                              graph_us=t[1] if t else None, error=None if t else "not applicable"))
    return out


def row(name, ts, *, correct=True, suite="llm", status="ok", template="bsr_tc", reason="fastest measured",
        pct=None, error=None, rank=None, origin="template"):
    fields = ratios.speedups(ts) if ts else {}
    return BenchRow(case_id=name, suite=suite, case=name, matrix={}, shape=(8, 8), nnz=10, pattern="p", sparsity=0.5,
                    dtype="float16", n=16, status=status, error=error, timings_are_gpu=True, timings=ts or [],
                    chosen=ChosenKernel(template=template, reason=reason, winner_rank=rank, origin=origin),
                    correct=correct,
                    correctness="" if correct else "wrong_result: 3 entries outside tolerance", pct_roofline=pct,
                    **fields)


def test_speedup_basis_is_graph_when_both_have_graphs_else_eager():
    ts = timings((10.0, 8.0), (20.0, 16.0), cusparse_csr_torch=(30.0, None), triton_bsr_torch=(50.0, 12.0))
    s = ratios.speedups(ts)
    assert (s["speedup_vs_dense"].value, s["speedup_vs_dense"].basis) == (2.0, "graph")
    by = {v.versus: v for v in s["speedups_vs_vendor"]}
    assert (by["cusparse_csr_torch"].value, by["cusparse_csr_torch"].basis) == (3.0, "eager")
    assert (by["triton_bsr_torch"].value, by["triton_bsr_torch"].basis) == (1.5, "graph")
    assert s["best_vendor"].versus == "triton_bsr_torch" and s["best_vendor"].value == 1.5
    assert s["best_alternative"].versus == "triton_bsr_torch"  # 1.5 < dense's 2.0
    slow_dense = ratios.speedups(timings((10.0, 8.0), (9.0, 6.0), cusparse_csr_torch=(30.0, None)))
    assert slow_dense["best_alternative"].versus == "cublas_dense" and slow_dense["best_alternative"].value == 0.75
    none = ratios.speedups(timings((10.0, None), (20.0, None), cusparselt_2to4=None))
    assert none["best_vendor"] is None and none["speedups_vs_vendor"] == []
    assert none["best_alternative"].value == 2.0 and none["best_alternative"].basis == "eager"


def test_chained_ratio_only_when_both_were_chained_and_its_geomean_is_separate():
    ts = timings((30.0, 12.0), (30.0, 15.0))
    ts[0].chain_us, ts[1].chain_us = 8.0, 14.0
    s = ratios.speedups(ts)
    assert (s["speedup_vs_dense"].value, s["speedup_vs_dense"].basis) == (1.25, "graph")
    assert (s["speedup_vs_dense_chain"].value, s["speedup_vs_dense_chain"].basis) == (1.75, "chain")
    assert s["best_alternative"].basis == "graph"      # the chained ratio never replaces the like-for-like one
    ts[1].chain_us = None                               # dense not chained (too large, or --no-chain)
    assert ratios.speedups(ts)["speedup_vs_dense_chain"] is None
    a = row("a", timings((1.0, 2.0), (1.0, 4.0)))
    b_ts = timings((1.0, 2.0), (1.0, 3.0))
    b_ts[0].chain_us, b_ts[1].chain_us = 1.0, 4.0
    b = row("b", b_ts)
    summary = metrics.summarize_suite("llm", [a, b])
    assert summary.geomean_vs_dense == pytest.approx(math.sqrt(2.0 * 1.5))
    assert summary.geomean_vs_dense_chain == pytest.approx(4.0)   # only b was chained
    from sparseditto.benchmark.tables import ROW_HEADERS, SUITE_HEADERS, row_cells, suite_cells
    cells = dict(zip(ROW_HEADERS, row_cells(b)))
    assert (cells["us chained"], cells["dense us chained"], cells["x dense chained"]) == ("1.0", "4.0", "4.00")
    assert dict(zip(SUITE_HEADERS, suite_cells(summary)))["geomean x dense chained"] == "4.00"


def test_fast_p_counts_failures_and_only_vendor_cases_against_vendor_sparse():
    rows = [
        row("a", timings((10, 10), (30, 30), cusparse_csr_torch=(25, 25))),     # 3.0 dense, 2.5 vendor
        row("b", timings((10, 10), (15, 15), cusparse_csr_torch=(12, 12))),     # 1.5 dense, 1.2 vendor
        row("c", timings((10, 10), (9, 9), cusparse_csr_torch=(40, 40))),       # 0.9 dense, 4.0 vendor
        row("d", timings((10, 10), (20, 20), cusparselt_2to4=None)),            # 2.0 dense, no vendor ran
        row("e", timings((10, 10), (50, 50), cusparse_csr_torch=(50, 50)), correct=False),  # fast but wrong
        row("f", [], status="error", correct=False, error="bench failed: worker crash"),
    ]
    alt = metrics.fast_p(rows, "best_of_dense_and_vendor")
    # best of dense + vendor: a 2.5, b 1.2, c 0.9, d 2.0, e wrong, f failed -> 6 cases
    assert alt.cases == 6
    assert alt.shares == {"0": 4 / 6, "1": 3 / 6, "1.5": 2 / 6, "2": 2 / 6}
    ven = metrics.fast_p(rows, "best_vendor_sparse")
    # vendor sparse ran on a, b, c, e; f failed before timing (counted); d had none (left out)
    assert ven.cases == 5
    assert ven.shares == {"0": 3 / 5, "1": 3 / 5, "1.5": 2 / 5, "2": 2 / 5}
    s = metrics.summarize_suite("llm", rows)
    assert (s.cases, s.correct, s.errors) == (6, 4, 1)
    assert s.geomean_vs_dense == pytest.approx((3.0 * 1.5 * 0.9 * 2.0) ** 0.25)
    assert s.geomean_vs_best_vendor == pytest.approx((2.5 * 1.2 * 4.0) ** (1 / 3))
    assert s.geomean_vs_best_alternative == pytest.approx((2.5 * 1.2 * 0.9 * 2.0) ** 0.25)
    assert s.worst.case == "e" and "outside tolerance" in s.worst.reason  # a wrong kernel is the worst case


def test_dense_answer_scores_exactly_one_against_dense():
    """When run_graph answers dense, the chosen timing is dense's own: 1.0, never 0.98 from noise."""
    from sparseditto.harness.results import BaselineTiming, BenchResult, Timing, VerifyResult

    t = lambda ms: Timing(median_ms=ms, p10_ms=ms, p90_ms=ms, repeats=3)
    bench_result = BenchResult(
        n=16, dtype="float16", backend="cuda", gpu_name="x", timings_are_gpu=True, candidate=t(0.0102),
        candidate_graph=t(0.0099), conversion_ms=1.0, dense=t(0.0100), dense_graph=t(0.0095),
        baselines=[BaselineTiming(name="cublas_dense", ok=True, timing=t(0.0100), graph_timing=t(0.0095)),
                   BaselineTiming(name="cusparse_csr_torch", ok=True, timing=t(0.0300))],
        speedup_vs_dense=1.0, reverified=True)
    verified = VerifyResult(ok=True, status="verified")
    ts = measure.path_timings(bench_result, verified, ChosenKernel(template="dense"))
    s = ratios.speedups(ts)
    assert s["speedup_vs_dense"].value == 1.0 and s["speedup_vs_dense"].basis == "graph"
    assert s["best_vendor"].value == pytest.approx(3.0)  # eager vs eager: the vendor has no graph timing
    assert ts[0].note == "the chosen kernel is cublas_dense itself" and ts[0].rechecked is True
    sparse = measure.path_timings(bench_result, verified, ChosenKernel(template="bsr_tc"))
    assert sparse[0].graph_us == pytest.approx(9.9)


def test_worst_case_without_failures_is_the_lowest_speedup_with_its_reason():
    rows = [row("fast", timings((10, 10), (30, 30))),
            row("slow", timings((10, 10), (11, 11)), template="csr_rowsplit", reason="dependent loads")]
    worst = metrics.worst_case(rows)
    assert worst.case == "slow" and worst.speedup == pytest.approx(1.1)
    assert "csr_rowsplit" in worst.reason and "dependent loads" in worst.reason


def test_geomean_and_median_ignore_missing_values():
    assert metrics.geomean([2.0, 8.0, None, 0.0, math.inf]) == pytest.approx(4.0)
    assert metrics.geomean([]) is None and metrics.median([None]) is None
    assert metrics.median([3.0, None, 1.0, 2.0]) == 2.0


def test_summaries_per_suite_then_all():
    rows = [row("a", timings((10, 10), (20, 20))), row("g", timings((10, 10), (40, 40)), suite="graphs")]
    names = [s.suite for s in metrics.summarize(rows)]
    assert names == ["llm", "graphs", "all"]
    assert metrics.summarize(rows)[-1].geomean_vs_dense == pytest.approx(math.sqrt(2.0 * 4.0))


# ---- cases, suites, budget ----------------------------------------------------------------------

def test_case_ids_are_stable_and_depend_on_what_the_case_is():
    spec = generated("x", "unstructured_magnitude", "magnitude_pruned", dict(m=8, k=8, sparsity=0.5, seed=1), 0.5)
    a = Case(suite="llm", matrix=spec, n=16, dtype="float16")
    assert a.case_id == Case(suite="llm", matrix=spec, n=16, dtype="float16").case_id
    relabelled = spec.model_copy(update={"label": "other name"})
    assert Case(suite="llm", matrix=relabelled, n=16, dtype="float16").case_id == a.case_id
    assert Case(suite="llm", matrix=spec, n=1, dtype="float16").case_id != a.case_id
    assert Case(suite="llm", matrix=spec, n=16, dtype="bfloat16").case_id != a.case_id
    assert len(a.case_id) == 16 and int(a.case_id, 16) >= 0


def test_llm_presets_cover_the_issue_cross_product():
    core = select_cases(["llm"], "core")
    assert {c.matrix.args["m"] for c in core} == {4096, 11008} and {c.n for c in core} == {1, 16, 64}
    assert len(core) == 2 * 7 * 3 + 4 and sum(c.dtype == "bfloat16" for c in core) == 4
    full = select_cases(["llm"], "full")
    assert len(full) == 4 * 23 * 8 * 2
    shapes = {(c.matrix.args["m"], c.matrix.args["k"]) for c in full}
    assert shapes == {(4096, 4096), (11008, 4096), (4096, 11008), (14336, 4096)}
    assert {c.matrix.pattern for c in full} >= {"unstructured_magnitude", "unstructured_random", "nm_2:4", "nm_4:8",
                                                "block16", "block32", "block64", "row_pruned", "channel_pruned"}
    assert len({c.case_id for c in full}) == len(full)
    assert all(c.matrix.generator in ("magnitude_pruned", "unstructured", "nm_magnitude_pruned", "block_sparse",
                                      "row_pruned", "column_pruned") for c in full)


def test_overrides_and_files_and_bad_input(shared_data):
    ns = select_cases(["llm"], "quick", ns=(2, 3), dtypes=("float32",))
    assert {c.n for c in ns} == {2, 3} and {c.dtype for c in ns} == {"float32"} and len(ns) == 8
    dlmc = select_cases(["dlmc"], "core", data_dir=shared_data)
    assert len({c.matrix.key for c in dlmc}) == 12
    assert {c.n for c in dlmc if c.matrix.label.startswith("rn50")} > {256}   # rn50 layers at their own N
    files = select_cases([str(shared_data / "suitesparse")], "core")
    assert len(files) == 18 * 3 and {c.suite for c in files} == {"files"}
    graphs = select_cases(["graphs"], "core", data_dir=shared_data)
    assert {c.dtype for c in graphs} == {"float32"} and any(c.matrix.generator == "rmat" for c in graphs)
    with pytest.raises(ValueError, match="preset"):
        select_cases(["llm"], "huge")
    with pytest.raises(ValueError, match="Not a suite name"):
        select_cases(["no/such/file.mtx"], "core")
    with pytest.raises(ValueError, match="DLMC folder not found"):
        select_cases(["dlmc"], "core", data_dir=shared_data / "nothing-here")


def test_memory_check_samples_spread_over_the_run():
    assert sample_indices(10, 3) == {0, 4, 9}
    assert sample_indices(4, 10) == {0, 1, 2, 3} and sample_indices(5, 0) == set() and sample_indices(5, 1) == {0}


def test_budget_stops_before_a_case_that_would_not_fit():
    spec_a = generated("a", "p", "unstructured", dict(m=4, k=4, sparsity=0.5), 0.5)
    spec_b = generated("b", "p", "unstructured", dict(m=8, k=4, sparsity=0.5), 0.5)
    a1, a2, b1 = (Case(suite="llm", matrix=spec_a, n=1, dtype="float16"),
                  Case(suite="llm", matrix=spec_a, n=2, dtype="float16"),
                  Case(suite="llm", matrix=spec_b, n=1, dtype="float16"))
    budget = Budget(100.0, previous=[])
    assert budget.fits(a1, new_matrix=True) and budget.estimate(a1, True) == 0.0  # nothing known yet: try
    budget.builds.append(5.0)
    budget.record(a1, 30.0)
    assert budget.estimate(a2, new_matrix=False) == 30.0
    assert budget.estimate(b1, new_matrix=True) == 35.0   # another matrix: + its build time
    budget.start -= 80.0                                  # pretend 80 s have passed
    assert not budget.fits(a2, new_matrix=False)
    assert Budget(None, []).fits(a2, new_matrix=True)
    earlier = [row("old", timings((1, 1), (1, 1)))]
    earlier[0].case_seconds, earlier[0].nnz = 12.0, 16                 # b's expected nonzeros: no scaling
    assert Budget(50.0, earlier).estimate(b1, new_matrix=True) == 12.0  # a resumed run learns from the file


def test_budget_scales_the_nearest_matrices_by_expected_nonzeros():
    """Session 30's overrun: the graphs suite's files took ~9 s each (median), so R-MAT scale 16
    (~10^6 nonzeros) was put at ~9 s and ran 163 s. A matrix not measured yet now gets the times of
    the matrices nearest in size, scaled by (nonzeros ratio)^SIZE_EXPONENT; tiny ones (pure fixed
    cost) do not blow the estimate up, and once measured a matrix's own time is its estimate."""
    from sparseditto.benchmark.cases import expected_nnz
    from sparseditto.benchmark.runner import SIZE_EXPONENT
    from sparseditto.benchmark.suites import graph_generated

    rmat, kron, mesh2, mesh3, band = graph_generated("core")
    assert expected_nnz(rmat) == 2 ** 16 * 16 and expected_nnz(kron) == 2 ** 16 * 8
    assert expected_nnz(mesh2) == 5 * 181 * 181 and expected_nnz(mesh3) == 7 * 32 ** 3
    assert expected_nnz(band) == pytest.approx(32768 * (1 + 2 * 16 * 0.3))
    assert expected_nnz(MatrixSpec(source="file", label="f", pattern="p", path="x.mtx")) is None

    def case(label, nnz_target, n=128):
        return Case(suite="graphs", n=n, dtype="float32",
                    matrix=generated(label, "p", "unstructured", dict(m=1000, k=1000, sparsity=1 - nnz_target / 1e6)))

    budget = Budget(1000.0, previous=[])
    for label, nnz, seconds in (("karate", 156, 5.0), ("afiro", 102, 4.6), ("dnn", 32768, 8.0),
                                ("bcsstk13", 83883, 17.0), ("pushpull", 196305, 46.0)):
        budget.record(case(label, nnz), seconds, nnz=nnz)
    big = Case(suite="graphs", matrix=rmat, n=128, dtype="float32")
    near = [(8.0, 32768), (17.0, 83883), (46.0, 196305)]
    expect = sorted(s * (2 ** 20 / z) ** SIZE_EXPONENT for s, z in near)[1]
    assert budget.estimate(big, new_matrix=False) == pytest.approx(expect)
    assert 100 < expect < 200                                         # measured: 163 s
    budget.record(big, 163.0, nnz=2 ** 20)
    assert budget.estimate(Case(suite="graphs", matrix=rmat, n=32, dtype="float32"), new_matrix=False) == 163.0
    mesh = Case(suite="graphs", matrix=mesh2, n=32, dtype="float32")   # ~164k: pushpull, bcsstk13, R-MAT nearest
    assert 25 < budget.estimate(mesh, new_matrix=False) < 60


def test_bad_bench_arguments_raise_value_errors():
    for kwargs, match in ((dict(n=[0]), "positive integer N"), (dict(dtype=["int8"]), "dtype"),
                          (dict(budget_s=0), "budget_s"), (dict(memory_check=-1), "memory_check"),
                          (dict(candidates=0), "candidates"), (dict(ncu="sometimes"), "ncu")):
        args = dict(preset="core", n=None, dtype=None, budget_s=None, memory_check=0, candidates=4, repeats=None,
                    ncu="off")
        args.update(kwargs)
        with pytest.raises(ValueError, match=match):
            _check_args(**args)


def test_sigterm_becomes_an_interrupt_so_reports_are_written():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt, match="signal"):
        with _sigterm_as_interrupt():
            os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is before


# ---- matrices and failures that never reach run_graph -------------------------------------------

def test_generated_matrices_are_cached_by_spec_and_a_torn_pointer_regenerates(tmp_path):
    from sparseditto.benchmark.cases import build_matrix

    spec = generated("m", "unstructured_magnitude", "magnitude_pruned", dict(m=40, k=64, sparsity=0.75, seed=3), 0.75)
    first = build_matrix(spec, tmp_path)
    pointer = tmp_path / f"{spec.key}.key"
    assert pointer.exists() and first.name == "m" and first.nnz == 40 * 16
    again = build_matrix(spec, tmp_path)
    assert (again.indices == first.indices).all() and (again.data == first.data).all()
    pointer.write_text("matrix-not-a-key\n")                 # a torn or foreign pointer file
    rebuilt = build_matrix(spec, tmp_path)
    assert (rebuilt.data == first.data).all() and pointer.read_text().startswith("matrix-")
    assert build_matrix(spec, None).nnz == first.nnz         # no cache: just generated


def test_artifact_store_forgets_its_in_process_copy_but_keeps_the_file(tmp_path):
    from sparseditto import generate
    from sparseditto.artifacts import ArtifactStore

    store = ArtifactStore(tmp_path)
    A = generate.unstructured(16, 16, 0.5, seed=1)
    key = store.put_matrix(A)
    assert store.get_matrix(key) is A
    store.forget(key)
    B = store.get_matrix(key)
    assert B is not A and (B.indices == A.indices).all() and store.has(key)


def test_a_broken_file_in_a_folder_is_an_error_row_and_the_reports_say_so(tmp_path):
    from sparseditto.benchmark import bench

    folder = tmp_path / "weights"
    folder.mkdir()
    (folder / "broken.mtx").write_text("%%MatrixMarket matrix coordinate real general\n3 3 2\n1 1\n")
    result = bench([str(folder)], n=[4], dtype=["float32"], out=tmp_path / "out", memory_check=0, progress=False)
    assert result.rows == 1 and result.new_rows == 1 and result.stopped is None
    (s,) = result.summaries
    assert (s.cases, s.errors, s.correct) == (1, 1, 0) and s.fast_p_alternative.shares["0"] == 0.0
    assert "could not build the matrix" in s.worst.reason
    row = BenchRow.model_validate_json((tmp_path / "out" / "results.jsonl").read_text())
    assert row.status == "error" and row.shape is None and row.suite == "files"
    assert "error: could not build" in (tmp_path / "out" / "summary.md").read_text()
    assert "broken" in (tmp_path / "out" / "report.html").read_text()


def test_llm_sized_presets_are_refused_on_the_interpreter_unless_asked_for(tmp_path):
    import torch

    from sparseditto.benchmark import bench

    if torch.cuda.is_available():
        pytest.skip("on a GPU the core preset is the thing to run")
    with pytest.raises(ValueError, match="No GPU found.*--quick"):
        bench(["llm"], out=tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists(), "refused before writing anything"


def test_cases_whose_dense_form_cannot_be_built_are_refused_up_front():
    import numpy as np

    from sparseditto.matrix import SparseMatrix

    big = SparseMatrix(np.zeros(262145, dtype=np.int64), np.zeros(0, dtype=np.int32), np.zeros(0, np.float32),
                       (262144, 262144), "float32", "empty_graph", {})
    why = measure.dense_does_not_fit(big, {"host_memory_bytes": 128e9, "gpu_memory_bytes": 141e9})
    assert "275 GB" in why and "host RAM" in why
    assert measure.dense_does_not_fit(big, {}) is None  # unknown memory: no guess
    small = SparseMatrix(np.zeros(4097, dtype=np.int64), np.zeros(0, dtype=np.int32), np.zeros(0, np.float32),
                         (4096, 4096), "float32", "w", {})
    assert measure.dense_does_not_fit(small, {"host_memory_bytes": 128e9, "gpu_memory_bytes": 141e9}) is None


@pytest.mark.slow
def test_template_sweep_times_named_templates_beside_the_answer(shared_data, tmp_path, monkeypatch):
    from sparseditto.benchmark import bench

    monkeypatch.setenv("SPARSEDITTO_CACHE_DIR", str(tmp_path / "cache"))
    karate = shared_data / "suitesparse" / "karate.mtx.gz"
    with pytest.raises(ValueError, match="Unknown template"):
        bench([str(karate)], out=tmp_path / "bad", templates=["no_such_template"], progress=False)
    result = bench([str(karate)], n=[8], dtype=["float32"], out=tmp_path / "out", memory_check=0, progress=False,
                   templates=["csr_rowsplit", "bsr_tc"])
    assert result.rows == 1
    row = BenchRow.model_validate_json((tmp_path / "out" / "results.jsonl").read_text())
    by = {t.template: t for t in row.templates}
    assert by["csr_rowsplit"].status == "verified" and by["csr_rowsplit"].eager_us > 0
    assert by["csr_rowsplit"].speedup_vs_dense.basis == "eager" and by["csr_rowsplit"].reverified
    assert by["csr_rowsplit"].format_bytes > 0
    assert by["bsr_tc"].status == "not_applicable" and "block" in by["bsr_tc"].message
    assert "Template sweep" in (tmp_path / "out" / "summary.md").read_text()


def test_speedup_plot_draws_one_line_per_pattern_n_shape_and_dtype():
    """The speedup-vs-sparsity plot's lines join one pattern's cases at one N, on one shape, in one dtype, by
    sparsity: two shapes at the same sparsities are two lines (joined, they zigzagged between the shapes)."""
    from sparseditto.benchmark.plots import speedup_series, speedup_vs_sparsity

    rows = []
    for i, (shape, sparsity, n, dtype, x) in enumerate([((4096, 4096), 0.5, 16, "float16", 1.1),
                                                         ((11008, 4096), 0.5, 16, "float16", 1.0),
                                                         ((4096, 4096), 0.7, 16, "float16", 1.2),
                                                         ((11008, 4096), 0.7, 16, "float16", 1.3),
                                                         ((4096, 4096), 0.7, 16, "bfloat16", 1.25),
                                                         ((4096, 4096), 0.7, 1, "float16", 1.4)]):
        rows.append(row(f"c{i}", timings((10.0, 10.0), (10.0 * x, 10.0 * x))).model_copy(
            update=dict(shape=shape, sparsity=sparsity, n=n, dtype=dtype)))
    series = speedup_series(rows, "llm")
    assert sorted((n, shape, xs, ys) for _, n, shape, xs, ys in series) == [
        (1, (4096, 4096), [70.0], [1.4]),
        (16, (4096, 4096), [50.0, 70.0], [1.1, 1.2]),
        (16, (4096, 4096), [70.0], [1.25]),
        (16, (11008, 4096), [50.0, 70.0], [1.0, 1.3])]
    assert speedup_vs_sparsity(rows, "llm").startswith(b"\x89PNG")


def test_the_suite_counts_how_often_the_planners_first_candidate_won():
    """Issue 10's "the first candidate it tries is usually the winner": of the correct cases won by our own
    kernel (a vendor answer has no rank, a wrong case does not count), how many at winner_rank 1."""
    from sparseditto.benchmark.tables import SUITE_HEADERS, suite_cells

    ts = timings((10, 10), (20, 20))
    rows = [row("a", ts, rank=1), row("b", ts, rank=3), row("c", ts, rank=1, origin="memory"),
            row("d", ts, template="dense", origin="vendor"), row("e", ts, rank=1, correct=False), row("f", ts)]
    s = metrics.summarize_suite("llm", rows)
    assert (s.first_candidate_wins, s.generated_wins) == (2, 3)
    assert dict(zip(SUITE_HEADERS, suite_cells(s)))["first candidate won"] == "2 of 3"
    none = metrics.summarize_suite("llm", [row("d", ts, template="dense", origin="vendor")])
    assert dict(zip(SUITE_HEADERS, suite_cells(none)))["first candidate won"] == "-"


def test_each_row_lists_the_candidates_in_the_order_they_were_tried():
    """The planner's record per case: a retried candidate once (its last attempt), vendor paths after
    the search, "auto" parameters left out, times in us with the basis they were measured on."""
    from sparseditto.agents.records import CandidateRecord

    cands = [CandidateRecord(index=1, template="tc_words", params={"WARPS": 4, "LOAD": "auto"}, origin="memory",
                             status="compile_error", expected_ms=0.010),
             CandidateRecord(index=1, attempt=2, template="tc_words", params={"WARPS": 2, "LOAD": "auto"},
                             origin="memory", status="verified", expected_ms=0.010, median_ms=0.0242,
                             timing_basis="cuda_graph"),
             CandidateRecord(index=2, template="delta_spmv", origin="template", status="wrong_result",
                             expected_ms=0.0109),
             CandidateRecord(template="dense", origin="vendor", status="verified", median_ms=0.0259,
                             timing_basis="cuda_graph")]
    tried = measure.tried_kernels(cands)
    assert [(t.rank, t.template, t.status) for t in tried] == [
        (1, "tc_words", "verified"), (2, "delta_spmv", "wrong_result"), (3, "dense", "verified")]
    assert tried[0].params == {"WARPS": 2} and tried[0].expected_us == 10.0 and tried[0].us == 24.2
    assert tried[0].basis == "cuda_graph" and tried[1].us is None and tried[1].basis is None
    row = ChosenKernel(template="tc_words", tried=tried)
    assert ChosenKernel.model_validate_json(row.model_dump_json()).tried == tried
