"""csr_rowdecomp (CUDA C++ row-decomposed CSR SpMM for graphs and meshes): the work items cover every
nonzero once, the kernels' walk over the packed arrays gives the exact product on power-law, banded
and mesh matrices, the launch plan only names kernels prepare compiles, the source compiles for
sm_90 without spills, the planner prefers it on graphs, and (GPU) the harness verifies it.

Without a GPU the kernels cannot run, so `_kernel_walk` restates csr_rowdecomp.cu over the arrays
prepare() ships: each item's sum goes to its row of C or its partial slot, then each split row's
slots are summed in slot order.
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from sparseditto import generate
from sparseditto.kernel_templates.registry import get_template
from sparseditto.matrix import SparseMatrix
from sparseditto.row_items import RowItems, auto_chunk

from template_instances import (assert_inlines_header_then_kernel, assert_refuses_cpu_and_misshapen_operands,
                                compile_every_instantiation, load_candidate)

gpu = pytest.mark.gpu


def _load(params: dict, tmp_path_factory):
    return load_candidate("csr_rowdecomp", params, tmp_path_factory)


def _hub_matrix(m: int, k: int, seed: int) -> SparseMatrix:
    """Short random rows, a few empty ones, and two hub rows far longer than any chunk."""
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((m, k)) * (rng.random((m, k)) < 0.03)
    dense[[1, m - 2]] = rng.standard_normal((2, k))
    dense[[0, 5, m - 1]] = 0
    return SparseMatrix.from_scipy(sp.csr_array(dense))


GRAPHS = {
    "rmat": lambda: generate.rmat(9, 8, seed=3),
    "hubs": lambda: _hub_matrix(150, 700, seed=1),
    "banded": lambda: generate.banded(300, 300, 7, fill=0.6, seed=2),
    "mesh2d": lambda: generate.laplacian_2d(13, 11),
    "mesh3d": lambda: generate.laplacian_3d(5, 6, 7),
}


def _kernel_walk(packed: dict, B: np.ndarray) -> np.ndarray:
    """C = A @ B the way csr_rowdecomp.cu computes it (float64): item (row, start, end, slot) sums
    values[start:end] * B[indices[start:end]] into C[row] (slot < 0) or partials[slot]; the fixup
    launch sums slots fix_ptr[f]:fix_ptr[f+1] into C[fix_rows[f]]. NaN marks rows nobody wrote."""
    items = packed["items"].numpy().astype(np.int64)
    indices = packed["indices"].numpy().astype(np.int64)
    values = packed["values"].float().numpy().astype(np.float64)
    C = np.full((packed["shape"][0], B.shape[1]), np.nan)
    partials = np.full((packed["n_slots"], B.shape[1]), np.nan)
    for row, start, end, slot in items:
        acc = values[start:end] @ B[indices[start:end]]
        if slot < 0:
            C[row] = acc
        else:
            partials[slot] = acc
    fix_rows, fix_ptr = packed["fix_rows"].numpy(), packed["fix_ptr"].numpy()
    assert fix_rows.shape[0] == packed["n_fix"] and fix_ptr.shape[0] == packed["n_fix"] + 1
    for f, row in enumerate(fix_rows):
        C[row] = partials[fix_ptr[f]:fix_ptr[f + 1]].sum(axis=0)
    return C


def _stream_walk(packed: dict, B: np.ndarray, plan: dict) -> tuple[np.ndarray, list]:
    """C = A @ B the way csr_rowdecomp_stream computes it (float64, one column strip): each group's
    (first, stride, end) from the plan's grid and block_items as the kernel derives them, the pipeline's
    registers restated (cur / next / after headers, the next item's first LANES pairs loaded a step
    ahead, the preloaded pairs used for the first pass only), then the fixup as in `_kernel_walk`.
    Returns (C, the items each group summed, in order)."""
    items = packed["items"].numpy().astype(np.int64)
    indices = packed["indices"].numpy().astype(np.int64)
    values = packed["values"].float().numpy().astype(np.float64)
    n_items = items.shape[0]
    C = np.full((packed["shape"][0], B.shape[1]), np.nan)
    partials = np.full((packed["n_slots"], B.shape[1]), np.nan)
    lanes, per_block, block_items = plan["lanes"], plan["block"][0] // plan["lanes"], plan["block_items"]
    sub = np.arange(lanes)
    none = np.array([0, 0, 0, -1])

    def lane_pairs(base, end):          # what lanes 0..LANES-1 load: pair base + sub, zeros past the end
        k = base + sub
        ok = k < end
        at = np.minimum(k, max(indices.size - 1, 0))
        return np.where(ok, indices[at], 0), np.where(ok, values[at], 0.0)

    def group(first, stride, end):
        mine = []
        cur = items[first]
        cur_col, cur_val = lane_pairs(cur[1], cur[2])
        has_next = first + stride < end
        nxt = items[first + stride] if has_next else none
        item = first
        while item < end:
            has_after = item + 2 * stride < end
            next_col, next_val = lane_pairs(nxt[1], nxt[2]) if has_next else lane_pairs(0, 0)
            after = items[item + 2 * stride] if has_after else none
            acc = np.zeros(B.shape[1])
            for base in range(cur[1], cur[2], lanes):
                my_col, my_val = (cur_col, cur_val) if base == cur[1] else lane_pairs(base, cur[2])
                count = min(lanes, cur[2] - base)
                acc += my_val[:count] @ B[my_col[:count]]
            if cur[3] < 0:
                C[cur[0]] = acc
            else:
                partials[cur[3]] = acc
            mine.append(item)
            cur, cur_col, cur_val, nxt, has_next = nxt, next_col, next_val, after, has_after
            item += stride
        return mine

    walked = []
    for block in range(plan["grid"][0]):
        for local in range(per_block):
            if block_items > 0:
                first, stride = block * block_items + local, per_block
                end = min(block * block_items + block_items, n_items)
            else:
                first, stride, end = block * per_block + local, plan["grid"][0] * per_block, n_items
            if first < end:
                walked.append(group(first, stride, end))
    fix_rows, fix_ptr = packed["fix_rows"].numpy(), packed["fix_ptr"].numpy()
    for f, row in enumerate(fix_rows):
        C[row] = partials[fix_ptr[f]:fix_ptr[f + 1]].sum(axis=0)
    return C, walked


@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("params", [{"ITEMS": 4}, {"ITEMS": 16, "CHUNK": 16, "ORDER": "row"},
                                    {"ITEMS": 2, "LANES": 4, "VEC": 2, "CHUNK": 1024},
                                    {"ITEMS": 8, "WALK": "block", "ORDER": "length"},
                                    {"ITEMS": 4, "WALK": "grid", "ORDER": "row", "LANES": 8}])
def test_the_pipelined_walk_sums_every_item_once_and_gives_the_exact_product(name, params, tmp_path_factory):
    """ITEMS > 1: the launch plan's groups, interleaved over the grid or walking their block's run of
    items: every item summed by exactly one group, in order, and the product exact, for lane groups
    narrower than a warp too."""
    module = _load(params, tmp_path_factory)
    A = GRAPHS[name]()
    packed = module.prepare(A, "float32", "cpu")
    n = 40
    plan = module.plan_launch(packed, n, torch.float32, 0, n, 0, n)
    assert plan["name"].startswith("csr_rowdecomp_stream<") and plan["items"] == params["ITEMS"]
    per_block = plan["block"][0] // plan["lanes"] * params["ITEMS"]
    assert plan["grid"][0] * per_block >= packed["n_items"] > (plan["grid"][0] - 1) * per_block
    walk = params.get("WALK", "auto")
    walk = ("block" if packed["order"] == "row" else "grid") if walk == "auto" else walk
    assert plan["block_items"] == (per_block if walk == "block" else 0)
    B = np.random.default_rng(5).standard_normal((A.shape[1], n))
    got, walked = _stream_walk(packed, B, plan)
    assert sorted(i for w in walked for i in w) == list(range(packed["n_items"]))
    assert max(len(w) for w in walked) <= params["ITEMS"]
    if walk == "block":   # a group's items are neighbours: one block's run, P apart
        assert all(np.all(np.diff(w) == plan["block"][0] // plan["lanes"]) for w in walked)
    assert not np.isnan(got).any(), "a row of C that no item or fixup writes"
    exact = A.to_scipy().astype(np.float32).astype(np.float64) @ B
    np.testing.assert_allclose(got, exact, rtol=1e-10, atol=1e-10)


def test_candidate_inlines_the_shared_header_then_the_kernel_and_passes_static_checks():
    assert_inlines_header_then_kernel("csr_rowdecomp")


@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("params", [{}, {"CHUNK": 16, "ORDER": "row"}, {"CHUNK": 1024, "ORDER": "length"}])
def test_packed_items_give_the_exact_product_under_the_kernels_walk(name, params, tmp_path_factory):
    module = _load(params, tmp_path_factory)
    A = GRAPHS[name]()
    packed = module.prepare(A, "float32", "cpu")
    assert packed["kernels"] == {}, "nothing is compiled without a GPU"
    assert packed["items"].dtype == torch.int32 and packed["items"].shape == (packed["n_items"], 4)
    B = np.random.default_rng(7).standard_normal((A.shape[1], 5))
    got = _kernel_walk(packed, B)
    assert not np.isnan(got).any(), "a row of C that no item or fixup writes"
    exact = A.to_scipy().astype(np.float32).astype(np.float64) @ B     # the fp32 values prepare ships
    np.testing.assert_allclose(got, exact, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("chunk", [1, 3, 16, 64, 4096])
@pytest.mark.parametrize("order", ["length", "row"])
def test_items_cover_every_nonzero_once_and_split_rows_keep_nonzero_order(chunk, order):
    A = _hub_matrix(90, 400, seed=chunk)
    layout = RowItems.from_indptr(A.indptr, A.shape, chunk, order)
    assert layout.covers(A.indptr)
    rows, start, end, slot = layout.items.T.astype(np.int64)
    assert np.all(end - start <= chunk)
    lengths = np.diff(A.indptr)
    assert set(layout.fix_rows.tolist()) == set(np.flatnonzero(lengths > chunk).tolist())
    # a split row's slots are consecutive and follow its nonzeros: the fixup's sum order is fixed
    for f, row in enumerate(layout.fix_rows):
        mine = np.flatnonzero((rows == row) & (slot >= 0))
        by_start = mine[np.argsort(start[mine])]
        assert slot[by_start].tolist() == list(range(layout.fix_ptr[f], layout.fix_ptr[f + 1]))
    assert np.all(slot[np.isin(rows, layout.fix_rows, invert=True)] == -1)
    if order == "length":
        assert np.all(np.diff(end - start) <= 0)
    else:
        assert np.all(np.diff(rows) >= 0)
    again = RowItems.from_indptr(A.indptr, A.shape, chunk, order)
    assert np.array_equal(again.items, layout.items), "the layout is deterministic"


def test_covers_rejects_a_broken_layout():
    A = _hub_matrix(40, 200, seed=0)
    layout = RowItems.from_indptr(A.indptr, A.shape, 8, "row")
    broken = layout.items.copy()
    broken[3, 2] -= 1                       # drop a nonzero
    assert not RowItems(broken, layout.fix_rows, layout.fix_ptr, layout.shape, 8, "row").covers(A.indptr)
    assert layout.items[-1, 1] == layout.items[-1, 2], "the last row is empty"
    twice = np.concatenate([layout.items, layout.items[-1:]])   # an empty row written by two items
    assert not RowItems(twice, layout.fix_rows, layout.fix_ptr, layout.shape, 8, "row").covers(A.indptr)
    stolen = layout.items.copy()
    stolen[stolen[:, 3] == 0, 0] = 0        # slot 0 claimed by another row than the fixup's
    assert not RowItems(stolen, layout.fix_rows, layout.fix_ptr, layout.shape, 8, "row").covers(A.indptr)


def test_bad_layout_arguments_are_clear_errors():
    indptr = np.array([0, 2, 2, 5])
    with pytest.raises(ValueError, match="chunk must be an integer"):
        RowItems.from_indptr(indptr, (3, 9), 0)
    with pytest.raises(ValueError, match="order must be one of"):
        RowItems.from_indptr(indptr, (3, 9), 4, "random")
    with pytest.raises(ValueError, match="length M \\+ 1 = 4"):
        RowItems.from_indptr(indptr[:-1], (3, 9), 4)
    with pytest.raises(ValueError, match="non-decreasing"):
        RowItems.from_indptr(np.array([0, 3, 2, 5]), (3, 9), 4)


def test_auto_order_and_chunk_follow_the_row_lengths(tmp_path_factory):
    module = _load({}, tmp_path_factory)
    skewed = module.prepare(generate.rmat(10, 8, seed=0), "float16", "cpu")
    mesh = module.prepare(generate.laplacian_2d(20, 20), "float16", "cpu")
    assert skewed["order"] == "length" and skewed["n_fix"] > 0
    assert mesh["order"] == "row" and mesh["n_fix"] == 0 and mesh["chunk"] == auto_chunk(5.0) == 32


@pytest.mark.parametrize("params", [{}, {"LANES": 4, "VEC": 2}, {"VEC": 8, "UNROLL": 8, "WARPS_PER_BLOCK": 2},
                                    {"ITEMS": 8}, {"ITEMS": 2, "LANES": 8, "VEC": 4}])
def test_every_planned_kernel_is_compiled_and_the_grid_covers_items_and_columns(params, tmp_path_factory):
    module = _load(params, tmp_path_factory)
    A = _hub_matrix(120, 300, seed=4)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        packed = module.prepare(A, dtype, "cpu")
        compiled = set(module.reachable_kernels(dtype))
        for n in list(range(1, 70)) + [128, 255, 256, 257, 1000]:
            plan = module.plan_launch(packed, n, dtype, 0, n, 0, n)
            assert plan["name"] in compiled and plan["fix_name"] in compiled, (dtype, n)
            per_block = plan["block"][0] // plan["lanes"] * params.get("ITEMS", 1)
            assert plan["grid"][0] * per_block >= packed["n_items"] > (plan["grid"][0] - 1) * per_block
            kind = "csr_rowdecomp_items<" if params.get("ITEMS", 1) == 1 else "csr_rowdecomp_stream<"
            assert plan["name"].startswith(kind)
            assert plan["grid"][1] * plan["lanes"] * plan["vec"] >= n and plan["fix_grid"][1] * 32 * plan["vec"] >= n
            assert plan["pstride"] % 8 == 0 and plan["pstride"] >= n
    fp32 = module.plan_launch(packed, 128, torch.float32, 0, 128, 0, 128)
    if not params:
        assert (fp32["vec"], fp32["lanes"], fp32["grid"][1]) == (4, 32, 1)      # a warp, one float4 per lane
        assert module.plan_launch(packed, 32, torch.float32, 0, 32, 0, 32)["lanes"] == 8   # 4 items a warp
        assert module.plan_launch(packed, 256, torch.float32, 0, 256, 0, 256)["vec"] == 8
    assert module.plan_launch(packed, 64, torch.float32, 4, 64, 0, 64)["vec_ok"] == 2   # B 4 bytes off: C only
    assert module.plan_launch(packed, 64, torch.float32, 0, 64, 0, 64)["vec_ok"] == 3


def test_bad_dtype_and_cpu_operands_are_clear_errors(tmp_path_factory):
    module = _load({}, tmp_path_factory)
    A = _hub_matrix(16, 40, seed=0)
    with pytest.raises(ValueError, match="float32, float16 and bfloat16"):
        module.prepare(A, torch.int8, "cpu")
    assert_refuses_cpu_and_misshapen_operands(module, module.prepare(A, "float32", "cpu"))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_source_compiles_for_sm90_without_spills(tmp_path):
    """The candidate's CUDA_SRC through ptxas with every instantiation: no spills, B rows and fp32
    partial rows move as 16-byte vectors."""
    entries, spills, ptx = compile_every_instantiation("csr_rowdecomp", tmp_path)
    assert len([e for e in entries if "csr_rowdecomp_items" in e]) == 3 * 3 * 4 * 6   # dtypes x UNROLL x VEC x LANES
    assert len([e for e in entries if "csr_rowdecomp_stream" in e]) == 3 * 3 * 4 * 6
    assert len([e for e in entries if "csr_rowdecomp_fixup" in e]) == 3 * 4
    assert spills and max(spills) == 0, "register spills in csr_rowdecomp"
    assert "ld.global.nc.v4.f32" in ptx and "st.global.v4.f32" in ptx


def test_planner_tries_it_first_on_graphs_at_wide_n():
    from sparseditto.agents.expert import pattern_preferences
    from sparseditto.analysis import analyze

    for A in (generate.rmat(10, 8, seed=0), generate.laplacian_2d(30, 30)):
        report = analyze(A).model_dump()
        assert pattern_preferences(report, 128)[0] == "csr_rowdecomp", report["pattern"]
        assert pattern_preferences(report, 32)[0] == "csr_rowdecomp"


def test_cost_model_counts_items_partials_and_the_second_launch():
    from sparseditto.analysis import analyze

    t = get_template("csr_rowdecomp")
    graph, mesh = analyze(generate.rmat(12, 16, seed=0)), analyze(generate.laplacian_2d(30, 30))
    skew = t.cost(graph, 128, "float32", "H200", {})
    assert "2 launch(es)" in skew.notes and skew.a_bytes > graph.nnz * 8
    assert "1 launch(es)" in t.cost(mesh, 128, "float32", "H200", {}).notes
    # the row-per-warp CSR kernel waits on the hub row (931 nonzeros); items bound the path by CHUNK
    per_row = get_template("csr_vector").cost(graph, 128, "float32", "H200", {})
    assert per_row.bound == "imbalance" and skew.bound == "memory" and skew.seconds < per_row.seconds


@gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("params,name", [({}, "rmat"), ({}, "mesh2d"), ({"CHUNK": 16, "ORDER": "row"}, "hubs"),
                                         ({"LANES": 4, "VEC": 2, "UNROLL": 8}, "banded"),
                                         ({"VEC": 8, "LANES": 32, "WARPS_PER_BLOCK": 8}, "hubs"),
                                         ({"ITEMS": 4}, "mesh2d"), ({"ITEMS": 16}, "rmat"),
                                         ({"ITEMS": 2, "LANES": 4, "VEC": 2, "CHUNK": 16}, "hubs"),
                                         ({"ITEMS": 8, "WALK": "block"}, "rmat")])
def test_gpu_verifies_against_fp64(params, name, dtype):
    from sparseditto.harness.verify import run_and_verify

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    result = run_and_verify(get_template("csr_rowdecomp").instantiate(params), GRAPHS[name](),
                            n_values=(1, 3, 8, 17, 32, 64, 128, 129, 256), dtype=dtype, backend="cuda", timeout=600)
    assert result.ok, result.message


def test_grid_follows_the_h200_sweep_and_csr_balanced_floor_ranks_it_behind_on_graphs():
    """Session 30's sweep (benchmarks/graph_kernels.py): UNROLL 8 on small matrices, items of 16 for
    long rows at N <= 32, of 2x auto for hub rows at N >= 128; csr_balanced measured 1187 us on R-MAT
    s16 at N = 128 (cuSPARSE 83 us), which its wide-N floor now says."""
    from sparseditto.analysis import analyze
    from sparseditto.kernel_templates.cost import ReportStats

    t = get_template("csr_rowdecomp")
    plan = t.planning()
    graph = analyze(generate.rmat(12, 16, seed=0))
    wide = plan.grid(ReportStats(graph), 128, None, t)
    assert wide[:3] == [{}, {"UNROLL": 8}, {"CHUNK": 2 * auto_chunk(ReportStats(graph).row_mean)}]
    long_rows = analyze(SparseMatrix.from_scipy(sp.csr_array(np.random.default_rng(0).random((400, 400)) < 0.1)))
    assert {"CHUNK": 16, "UNROLL": 8} in plan.grid(ReportStats(long_rows), 32, None, t)[:3]
    assert all(d.keys() <= set(t.meta["params"]) for d in wide)
    balanced = get_template("csr_balanced")
    assert balanced.cost(graph, 128, "float32", "H200", {}).seconds > 5 * t.cost(graph, 128, "float32", "H200", {}).seconds
    narrow = balanced.cost(graph, 8, "float32", "H200", {})
    assert narrow.seconds < 2 * balanced.cost(graph, 1, "float32", "H200", {}).seconds   # N = 8 keeps the old floor


@pytest.mark.parametrize("mean", [0.0, 0.3, 5.0, 7.9, 8.0, 8.1, 14.6, 31.9, 32.0, 49.1, 127.0, 128.5, 4096.0])
def test_planning_resolves_auto_chunk_as_prepare_does(mean):
    """The planning module restates row_items.auto_chunk (it may import the cost arithmetic only)."""
    from types import SimpleNamespace

    plan = get_template("csr_rowdecomp").planning()
    assert plan.chunk_for(SimpleNamespace(row_mean=mean), {}) == auto_chunk(mean)
    assert plan.chunk_for(SimpleNamespace(row_mean=mean), {"CHUNK": 64}) == 64


@pytest.mark.parametrize("items", [1, 4])
def test_launch_runs_the_items_kernel_then_the_fixup_on_the_same_plan(items, tmp_path_factory, monkeypatch):
    """runtime.launch_cuda with csr_rowdecomp's plan, kernels replaced by recorders (no GPU): the items
    kernel gets B's and C's pointers between its fixed arguments (the stream kernel block_items after
    n_items), the fixup C's only, after it, sharing the partial-row workspace; a second call reuses the plan."""
    from contextlib import nullcontext

    from sparseditto.kernel_templates import runtime as rt

    module = _load({"CHUNK": 16, "ITEMS": items}, tmp_path_factory)
    packed = module.prepare(_hub_matrix(40, 300, seed=3), "float32", "cpu")
    assert packed["n_fix"] > 0
    calls = []

    class Recorder:
        def __init__(self, name):
            self.name = name

        def __call__(self, grid, block, args, shared_mem=0):
            calls.append((self.name, grid, block, args))

    packed["kernels"] = {name: Recorder(name) for name in module.reachable_kernels(torch.float32)}
    monkeypatch.setattr(rt, "cupy_stream", lambda scratch, device: (nullcontext(), nullcontext()))
    b, out = torch.zeros(300, 64), torch.zeros(40, 64)
    for _ in range(2):
        rt.launch_cuda(packed, ("key",), lambda: module._make_plan(packed, 64, b, out), b, out, out)
    plan = packed["scratch"][("key",)]
    (first, grid, block, args), (second, fgrid, _, fargs) = calls[:2]
    assert calls[2:] == calls[:2], "the second call launches the same plan"
    assert first == plan["name"] and second == plan["fix_name"]
    assert grid == plan["grid"] and block == plan["block"] and fgrid == plan["fix_grid"]
    b_ptr, c_ptr, p_ptr = (np.uint64(t.data_ptr()) for t in (b, out, plan["partials"]))
    h = 6 if items == 1 else 7
    assert len(plan["head"]) == h and args[:h] == plan["head"] and args[h:h + 2] == (b_ptr, c_ptr)
    assert args[h + 2:] == plan["tail"] and len(args) == h + 6
    assert items == 1 or args[2] == plan["block_items"]
    assert args[h - 2] == p_ptr and fargs[3] == p_ptr and fargs[5] == c_ptr and len(fargs) == 9
    assert plan["partials"].shape == (packed["n_slots"], plan["pstride"])
