"""The planner's rules for the CUDA decode tier, on the analyzer's reports of pruned weights.

The table is built as on a GPU (exec_backend='cuda', H200 target), so the CUDA templates are in it;
the expert policy's first plan is checked against what the H200 measurements say wins (see
docs/benchmarks.md, "Decode tier"): mma.sp for 2:4, the dense stream for a dense weight or 50-85%
unstructured at small N, row-split CSR / the tensor-core bitmap at 85-95%, and the delta-coded SpMV
at N <= 2 from 85% and at N = 1 from 65%.
"""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from sparseditto.agents.costing import template_table
from sparseditto.agents.expert import ExpertPolicy
from sparseditto.agents.policy import PlanningInput
from sparseditto.analysis import analyze
from sparseditto.matrix import SparseMatrix
from sparseditto.targets import get_target

H200 = get_target("H200")


def _weight(style: str, m: int = 512, k: int = 1024, seed: int = 0) -> SparseMatrix:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((m, k)).astype(np.float32)
    if style == "2:4":
        g = np.abs(w).reshape(m, -1, 4)
        drop = np.argsort(-g, axis=2)[:, :, 2:]
        keep = np.ones_like(g, dtype=bool)
        np.put_along_axis(keep, drop, False, axis=2)
        w *= keep.reshape(m, k)
    elif style != "dense":
        sparsity = float(style)
        kept = int(round((1 - sparsity) * k))
        thresh = -np.partition(-np.abs(w), kept - 1, axis=1)[:, kept - 1:kept]
        w *= np.abs(w) >= thresh
    return SparseMatrix.from_scipy(sp.csr_array(w), dtype="float16")


def _first_plan(style: str, n: int, dtype: str = "float16"):
    report = analyze(_weight(style)).model_dump()
    table, roof = template_table(report, n, dtype, H200, exec_backend="cuda")
    dense = next(t for t in table if t["name"] == "dense")
    inp = PlanningInput(report=report, target={"name": "H200", "timings_are_gpu": True}, n_values=[n], dtype=dtype,
                        memory_hits=[], tried=[], best=None, dense_ms=dense["estimate_ms"], roofline_ms=roof,
                        budget_left=8, templates=table)
    return table, ExpertPolicy().plan(inp)


def test_2_of_4_plans_the_sparse_tensor_cores_first():
    table, plan = _first_plan("2:4", 16)
    names = {t["name"] for t in table}
    assert {"tc_sp24", "tc_dense", "tc_bitmap"} <= names
    assert plan.action == "try" and plan.candidates[0].template == "tc_sp24"
    assert "nm" in plan.candidates[0].rationale


def test_4_of_8_at_decode_tries_the_delta_spmv_early():
    """4:8 cannot go to mma.sp (a group of 8 may keep 3 + 1 in its halves); at N = 1 the decode SpMV
    is among the first two candidates (the H200 bench answered it with cuBLAS when it was not)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((1024, 1024)).astype(np.float32)
    g = np.abs(w).reshape(1024, -1, 8)
    keep = np.zeros_like(g, dtype=bool)
    np.put_along_axis(keep, np.argsort(-g, axis=2)[:, :, :4], True, axis=2)
    A = SparseMatrix.from_scipy(sp.csr_array(w * keep.reshape(1024, 1024)), dtype="float16")
    report = analyze(A).model_dump()
    assert report["pattern"].startswith("nm")
    table, roof = template_table(report, 1, "float16", H200, exec_backend="cuda")
    dense = next(t for t in table if t["name"] == "dense")
    inp = PlanningInput(report=report, target={"name": "H200", "timings_are_gpu": True}, n_values=[1], dtype="float16",
                        memory_hits=[], tried=[], best=None, dense_ms=dense["estimate_ms"], roofline_ms=roof,
                        budget_left=8, templates=table)
    plan = ExpertPolicy().plan(inp)
    assert "delta_spmv" in [c.template for c in plan.candidates[:2]], [c.template for c in plan.candidates]
    _, two_four = _first_plan("2:4", 1)       # exact 2:4 keeps the sparse MMA first
    assert two_four.candidates[0].template == "tc_sp24"


def test_dense_weight_at_small_n_tries_the_dense_stream_not_a_stop():
    _, plan = _first_plan("dense", 16)
    assert plan.action == "try" and [c.template for c in plan.candidates] == ["tc_dense"]
    assert "cuBLAS" in plan.rationale


def test_dense_weight_at_large_n_stops_for_cublas():
    _, plan = _first_plan("dense", 128)
    assert plan.action == "stop" and "cuBLAS" in plan.rationale


@pytest.mark.parametrize("style,n,first", [("0.7", 16, "tc_words"), ("0.9", 1, "delta_spmv"), ("0.9", 2, "delta_spmv"),
                                           ("0.7", 1, "delta_spmv"), ("0.9", 4, "delta_spmv"), ("0.5", 1, "delta_spmv"),
                                           ("0.5", 2, "delta_spmv"), ("0.5", 4, "delta_spmv"),
                                           ("0.5", 8, "tc_dense"), ("0.9", 8, "csr_vector")])
def test_unstructured_first_candidate_follows_the_measurements(style, n, first):
    _, plan = _first_plan(style, n)
    assert plan.action == "try" and plan.candidates[0].template == first


def test_unstructured_is_not_offered_to_mma_sp():
    table, _ = _first_plan("0.5", 16)
    assert "tc_sp24" not in {t["name"] for t in table}


def test_fp32_leaves_the_tensor_core_tier_out():
    table, _ = _first_plan("2:4", 16, dtype="float32")
    assert not {t["name"] for t in table} & {"tc_sp24", "tc_dense", "tc_bitmap"}


def test_bitmap_decode_floor_marks_it_decode_bound_at_moderate_sparsity():
    table, _ = _first_plan("0.5", 16)
    bitmap = next(t for t in table if t["name"] == "tc_bitmap")
    dense = next(t for t in table if t["name"] == "dense")
    assert bitmap["bound"] == "decode" and bitmap["estimate_ms"] > dense["estimate_ms"]


def test_block_weight_at_decode_explores_the_delta_spmv_second_and_fp32_leaves_it_out():
    from sparseditto import generate

    for dtype, expect in (("float16", True), ("float32", False)):
        A = generate.block_sparse(512, 1024, (32, 32), 0.25, seed=0, dtype=dtype)
        report = analyze(A).model_dump()
        table, roof = template_table(report, 1, dtype, H200, exec_backend="cuda")
        dense = next(t for t in table if t["name"] == "dense")
        inp = PlanningInput(report=report, target={"name": "H200", "timings_are_gpu": True}, n_values=[1], dtype=dtype,
                            memory_hits=[], tried=[], best=None, dense_ms=dense["estimate_ms"], roofline_ms=roof,
                            budget_left=8, templates=table)
        plan = ExpertPolicy().plan(inp)
        tried = [c.template for c in plan.candidates]
        assert report["pattern"] == "block"
        assert ("delta_spmv" in tried) == expect, (dtype, tried)


@pytest.mark.parametrize("m,k,style,lanes,second", [(4096, 4096, "0.5", 32, {"LANES": 16}),
                                                    (4096, 4096, "0.9", 8, {"MIN_WARPS": 0}),
                                                    (512, 1024, "0.5", 32, {"LANES": 16}),
                                                    (11008, 4096, "0.5", 32, {"LANES": 16})])
def test_delta_spmv_plans_lanes_that_fill_and_balance_the_gpu(m, k, style, lanes, second):
    """The planner costs the packing prepare makes on the H200 (4096 rows of a 90% weight: 8 lanes
    per row, not the 4 of the least padding, so that 128 CTAs cover the SMs), and tries 16 lanes
    per row second where the packing puts 32 on a row (whole rows per warp leave a tail of warps
    with one row more), not where it already uses fewer."""
    from sparseditto.kernel_templates.cost import ReportStats
    from sparseditto.kernel_templates.cuda.planning import delta_spmv as planning
    from sparseditto.kernel_templates.registry import get_template

    report = analyze(_weight(style, m=m, k=k)).model_dump()
    assert planning.packing(ReportStats(report), 2, H200, {})[2] == lanes
    grid = get_template("delta_spmv").param_grid(report, 1, H200)
    full = get_template("delta_spmv").validate_params
    assert grid[0] == full({}) and grid[1] == full(second), grid[:2]
    # the estimate honours a fixed LANES: the bytes of its padding
    assert planning.packing(ReportStats(report), 2, H200, {"LANES": 4})[2] == 4


def test_measured_delta_spmv_is_refined_through_its_planned_parameter_sets():
    """delta_spmv has no tile parameter to step, so once it is the measured best the policy's
    refinements are its planning module's next sets (16 lanes per row on a 4096-row 50% weight),
    before templates it has not measured yet lower down the ranking."""
    from sparseditto.agents.policy import TriedCandidate

    report = analyze(_weight("0.5", m=4096, k=4096)).model_dump()
    table, roof = template_table(report, 1, "float16", H200, exec_backend="cuda")
    dense = next(t for t in table if t["name"] == "dense")
    delta = next(t for t in table if t["name"] == "delta_spmv")
    first = TriedCandidate(template="delta_spmv", params=delta["grid"][0]["params"], status="verified",
                           median_ms=0.0138, speedup_vs_dense=1.15)
    other = TriedCandidate(template="tc_dense", params={}, status="verified", median_ms=0.0330, speedup_vs_dense=0.5)
    inp = PlanningInput(report=report, target={"name": "H200", "timings_are_gpu": True}, n_values=[1], dtype="float16",
                        memory_hits=[], tried=[first, other], best=first, dense_ms=dense["estimate_ms"],
                        roofline_ms=roof, budget_left=1, templates=table)
    plan = ExpertPolicy().plan(inp)
    assert plan.action == "try", plan.rationale
    spec = plan.candidates[0]
    # the two lane counts cost within 1% (16 lanes store fewer row starts), so either may lead;
    # whichever was measured first, the other comes next
    assert spec.template == "delta_spmv" and spec.params == delta["grid"][1]["params"], (spec, plan.rationale)
    assert {first.params["LANES"], spec.params["LANES"]} == {16, "auto"}
    assert "its planned parameter set" in spec.rationale


def test_tc_words_decode_floor_grows_with_the_n8_tiles_past_two():
    """tc_words' decode floor per 16x64 block: 0.40 ns up to N = 16 (two n8 tiles), + 0.133 ns per further
    tile, 1.20 ns at N = 64, the H200's 11008x4096 50% N = 64 time (52.8 us over 44032 blocks); wider N runs
    more 64-column launch blocks, not wider ones. The floor stays under the other measured N = 64 rows."""
    from sparseditto.kernel_templates.cuda.planning import tc_words as plan

    assert plan.block_s(1) == plan.block_s(16) == plan.BLOCK_S
    assert plan.block_s(24) == pytest.approx(plan.BLOCK_S + plan.NT_STEP_S)
    assert plan.block_s(64) == plan.block_s(128) == pytest.approx(1.198e-9)

    class Stats:
        m, k, nnz = 11008, 4096, 11008 * 2048

    floor = {n: plan.cost(Stats, n, "float16", H200, {}).decode_s for n in (16, 64, 128)}
    assert floor[64] == pytest.approx(3 * floor[16], rel=0.01) and floor[128] == pytest.approx(2 * floor[64])
    assert floor[64] * 1e6 <= 53.1 and 16384 * plan.block_s(64) * 1e6 <= 28.5   # the measured N = 64 times (us)


def test_grid_points_within_the_tie_keep_the_planning_modules_order():
    """ranked_points: the cheapest estimate first unless the planning module's earlier proposal is within
    GRID_TIE of it; beyond the tie the estimate decides."""
    from sparseditto.agents.costing import GRID_TIE, ranked_points

    pts = [{"params": {"LANES": "auto"}, "estimate_ms": 7.54}, {"params": {"LANES": 16}, "estimate_ms": 7.46},
           {"params": {"WARPS": 4}, "estimate_ms": 9.0}, {"params": {"SKEW": 0}, "estimate_ms": 7.50}]
    assert [p["params"] for p in ranked_points(pts)] == [{"LANES": "auto"}, {"LANES": 16}, {"SKEW": 0}, {"WARPS": 4}]
    far = [{"params": {"a": 1}, "estimate_ms": 7.46 * (1 + GRID_TIE) * 1.01}, {"params": {"a": 2}, "estimate_ms": 7.46}]
    assert [p["params"] for p in ranked_points(far)] == [{"a": 2}, {"a": 1}]
    assert ranked_points([]) == []


def test_delta_spmv_tries_its_default_lanes_first_at_n1():
    """On a K = 4096 weight at 50% (32 lanes a row) 16 lanes are estimated ~1% under the default, which won
    every unstructured N = 1 case of the H200 llm suite where delta_spmv won (session 39): default first.
    2048 rows: 16 lanes still fill the H200's SMs (fewer rows would charge 16 lanes for idle SMs)."""
    report = analyze(_weight("0.5", m=2048, k=4096)).model_dump(mode="json")
    table, _ = template_table(report, 1, "float16", H200, exec_backend="cuda")
    delta = next(t for t in table if t["name"] == "delta_spmv")
    lanes = [g["params"]["LANES"] for g in delta["grid"]]
    assert lanes[0] == "auto" and 16 in lanes[1:]
    assert min(g["estimate_ms"] for g in delta["grid"]) < delta["grid"][0]["estimate_ms"]   # 16 lanes: lower, within the tie


def test_delta_spmv_charges_an_explicit_lane_count_that_leaves_sms_idle():
    """1024 rows at 50%: 4 lanes a row pad least (the lowest byte estimate) but make 16 CTAs of 8 warps for
    132 SMs; prepare's "auto" never goes below the filling count, an explicit LANES can. The H200's 4-
    against 8-lane measurement (session 21) is charged on its floor, so the default is planned first."""
    from sparseditto.kernel_templates.registry import get_template

    report = analyze(_weight("0.5", m=1024, k=4096)).model_dump(mode="json")
    table, _ = template_table(report, 1, "float16", H200, exec_backend="cuda")
    delta = next(t for t in table if t["name"] == "delta_spmv")
    assert delta["grid"][0]["params"]["LANES"] == "auto"
    template = get_template("delta_spmv")
    four = template.cost(report, 1, "float16", H200, {"LANES": 4})
    default = template.cost(report, 1, "float16", H200, {})
    assert "leave SMs idle" in four.notes and "leave SMs idle" not in default.notes
    assert four.seconds > default.seconds and four.a_bytes < default.a_bytes   # fewer bytes, slower all the same
    filling = analyze(_weight("0.5", m=4096, k=4096)).model_dump(mode="json")
    sixteen = template.cost(filling, 1, "float16", H200, {"LANES": 16})        # 16 lanes on 4096 rows fill the GPU
    assert "leave SMs idle" not in sixteen.notes
