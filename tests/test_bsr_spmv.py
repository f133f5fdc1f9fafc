"""bsr_spmv (CUDA C++ block-sparse SpMV for skinny N): prepare's blocks round-trip to the matrix,
the kernel's walk over them gives the exact product, the launch plan only names kernels prepare
compiles, the source compiles for sm_90 without spills, the planner explores it on block weights at
decode N, and (GPU) the harness verifies it.

Without a GPU the kernel cannot run, so `_kernel_walk` restates bsr_spmv.cu lane by lane over the
arrays prepare ships: which block each warp takes, which rows and columns each lane's 16-byte
vectors hold, B staged with zeros past K and N, the butterfly over a row's lanes and the warps'
sums in warp order.
"""
from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from sparseditto.kernel_templates.registry import get_template
from sparseditto.matrix import SparseMatrix

from template_instances import (CHILD_LOADS_EXPORT, assert_inlines_header_then_kernel,
                                assert_refuses_cpu_and_misshapen_operands, compile_every_instantiation, load_candidate)

gpu = pytest.mark.gpu


def _load(params: dict, tmp_path_factory):
    return load_candidate("bsr_spmv", params, tmp_path_factory)


def block_pruned(m: int, k: int, b: int, keep: float, seed: int, holes: float = 0.0) -> SparseMatrix:
    """Random b x b blocks kept with probability `keep` (shapes need not be multiples of b); `holes`
    zeroes that share of the kept values too (blocks that are not full). The values are fp16 numbers
    (as the harness hands a template the values it verifies with)."""
    rng = np.random.default_rng(seed)
    blocks = rng.random((-(-m // b), -(-k // b))) < keep
    mask = np.kron(blocks, np.ones((b, b), dtype=bool))[:m, :k]
    w = rng.standard_normal((m, k)).astype(np.float16).astype(np.float64) * mask * (rng.random((m, k)) >= holes)
    return SparseMatrix.from_scipy(sp.csr_array(w))


def _kernel_walk(packed: dict, B: np.ndarray, warps: int, unroll: int, nn: int) -> np.ndarray:
    """C = A @ B the way bsr_spmv.cu computes it (float64)."""
    blocks = packed["blocks"].float().numpy().astype(np.float64)
    brow_ptr, bcol = packed["brow_ptr"].numpy(), packed["bcol"].numpy()
    (M, K), bs, N = packed["shape"], packed["bs"], B.shape[1]
    epv, vpr = 8, bs // 8
    step, rpl, xs = 32 // vpr, bs // (32 // vpr), bs + 1
    C = np.full((M, N), np.nan)
    for br in range(packed["block_rows"]):
        lo, hi = int(brow_ptr[br]), int(brow_ptr[br + 1])
        for n0 in range(0, N, nn):
            part = np.zeros((warps, bs, nn))
            for warp in range(warps):
                acc = np.zeros((32, rpl, nn))
                for b in range(lo + warp, hi, warps * unroll):
                    for u in range(unroll):
                        bb = b + u * warps
                        if bb >= hi:
                            continue
                        stage = np.zeros(nn * xs)                 # [NN][BS + 1] floats
                        for lane in range(32):
                            for t in range(lane, bs * nn, 32):
                                j, n = t // nn, t % nn
                                k, c = int(bcol[bb]) * bs + j, n0 + n
                                stage[n * xs + j] = B[k, c] if k < K and c < N else 0.0
                        flat = blocks[bb].reshape(-1)
                        for lane in range(32):
                            cg, r0 = lane % vpr, lane // vpr
                            for v in range(rpl):
                                start = (r0 + v * step) * bs + cg * epv
                                w = flat[start:start + epv]               # the lane's 16-byte vector
                                x = np.array([[stage[n * xs + cg * epv + e] for n in range(nn)] for e in range(epv)])
                                acc[lane, v] += w @ x
                off = vpr // 2
                while off >= 1:                                       # the butterfly over a row's lanes
                    acc = acc + acc[np.arange(32) ^ off]
                    off //= 2
                for lane in range(0, 32, vpr):                        # cg == 0 lanes hold the rows
                    for v in range(rpl):
                        part[warp, lane // vpr + v * step] = acc[lane, v]
            sums = part.sum(axis=0)                                   # in warp order in the kernel
            for row in range(bs):
                m = br * bs + row
                for n in range(nn):
                    if m < M and n0 + n < N:
                        C[m, n0 + n] = sums[row, n]
    return C


def test_candidate_inlines_the_shared_header_then_the_kernel_and_passes_static_checks():
    assert_inlines_header_then_kernel("bsr_spmv")


@pytest.mark.parametrize("bs_param,b,expect", [("auto", 32, 32), ("auto", 16, 16), (16, 32, 16), (32, 16, 32)])
def test_prepare_stores_the_blocks_that_round_trip_to_the_matrix(bs_param, b, expect, tmp_path_factory):
    module = _load({"BS": bs_param}, tmp_path_factory)
    A = block_pruned(250, 320, b, 0.4, seed=1, holes=0.2)     # M not a multiple of 16 or 32 (K: the walk test)
    packed = module.prepare(A, "float16", "cpu")
    assert packed["kernels"] == {} and packed["bs"] == expect
    blocks = packed["blocks"]
    assert blocks.dtype == torch.float16 and blocks.shape == (packed["nblocks"], expect, expect)
    mb = -(-250 // expect)
    dense = np.zeros((mb * expect, -(-320 // expect) * expect))
    ptr, cols = packed["brow_ptr"].numpy(), packed["bcol"].numpy()
    assert ptr.dtype == np.int32 and cols.dtype == np.int32 and ptr.shape == (mb + 1,) and ptr[-1] == packed["nblocks"]
    for br in range(mb):
        for i in range(ptr[br], ptr[br + 1]):
            dense[br * expect:(br + 1) * expect, cols[i] * expect:(cols[i] + 1) * expect] = blocks[i].double().numpy()
    want = A.to_scipy().toarray().astype(np.float16).astype(np.float64)
    np.testing.assert_array_equal(dense[:250, :320], want)
    assert not dense[250:].any() and not dense[:, 320:].any(), "padding past M stays zero"
    assert packed["nblocks"] * expect * expect == module.stored_values(A, expect)


@pytest.mark.parametrize("params,b,n", [({}, 32, 1), ({}, 32, 3), ({"WARPS": 4, "UNROLL": 1}, 16, 8),
                                        ({"BS": 16, "WARPS": 16}, 32, 5), ({"NN": 2}, 32, 5),
                                        ({"BS": 32, "NN": 8, "WARPS": 4}, 16, 11)])
def test_the_kernels_walk_over_the_packed_blocks_gives_the_exact_product(params, b, n, tmp_path_factory):
    module = _load(params, tmp_path_factory)
    A = block_pruned(75, 90, b, 0.45, seed=3, holes=0.1)
    packed = module.prepare(A, "bfloat16", "cpu")
    plan = module.plan_launch(packed, n, torch.bfloat16)
    warps, unroll = plan["block"][0] // 32, module.PARAMS["UNROLL"]
    B = torch.randn(90, n).to(torch.bfloat16).double().numpy()   # the values the kernel reads
    got = _kernel_walk(packed, B, warps, unroll, plan["nn"])
    assert not np.isnan(got).any(), "a row of C that no CTA writes"
    values = packed["blocks"].double().numpy()                      # A as prepare rounded it
    ptr, cols, bs = packed["brow_ptr"].numpy(), packed["bcol"].numpy(), packed["bs"]
    padded = np.zeros((packed["block_rows"] * bs, -(-90 // bs) * bs))
    for br in range(packed["block_rows"]):
        for i in range(ptr[br], ptr[br + 1]):
            padded[br * bs:(br + 1) * bs, cols[i] * bs:(cols[i] + 1) * bs] = values[i]
    exact = padded[:75, :90] @ B
    np.testing.assert_allclose(got, exact, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("params", [{}, {"NN": 4}, {"BS": 16, "WARPS": 4, "UNROLL": 1}])
def test_every_planned_kernel_is_compiled_and_the_grid_covers_block_rows_and_columns(params, tmp_path_factory):
    module = _load(params, tmp_path_factory)
    A = block_pruned(100, 64, 32, 0.5, seed=4)
    for dtype in (torch.float16, torch.bfloat16):
        packed = module.prepare(A, dtype, "cpu")
        compiled = set(module.reachable_kernels(dtype, packed["bs"]))
        for n in list(range(1, 70)) + [128, 1000]:
            plan = module.plan_launch(packed, n, dtype)
            assert plan["name"] in compiled, (dtype, n)
            assert plan["grid"][0] == packed["block_rows"] == -(-100 // packed["bs"])
            assert plan["grid"][1] * plan["nn"] >= n > (plan["grid"][1] - 1) * plan["nn"]
            assert plan["block"] == (module.PARAMS["WARPS"] * 32, 1, 1)
            if not params:
                assert plan["nn"] == min(8, 1 << (n - 1).bit_length())


def test_bad_dtype_and_cpu_operands_are_clear_errors(tmp_path_factory):
    module = _load({}, tmp_path_factory)
    A = block_pruned(40, 40, 16, 0.5, seed=0)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        module.prepare(A, torch.float32, "cpu")
    assert_refuses_cpu_and_misshapen_operands(module, module.prepare(A, "float16", "cpu"), torch.float16)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_source_compiles_for_sm90_without_spills(tmp_path):
    """The candidate's CUDA_SRC through ptxas with every instantiation: no spills, the blocks read as
    16-byte vectors."""
    entries, spills, ptx = compile_every_instantiation("bsr_spmv", tmp_path)
    assert len([e for e in entries if "bsr_spmv" in e]) == 2 * 2 * 4 * 3 * 2   # dtypes x BS x NN x WARPS x UNROLL
    assert spills and max(spills) == 0, "register spills in bsr_spmv"
    assert re.search(r"ld\.global\.nc\.v4\.(u|b)32", ptx), "the blocks' 16-byte loads"


def test_planner_explores_it_second_on_block_weights_at_decode_n(tmp_path_factory):
    from sparseditto.agents.expert import pattern_preferences
    from sparseditto.analysis import analyze

    A = block_pruned(512, 512, 32, 0.25, seed=2)
    report = analyze(A).model_dump()
    assert report["pattern"] == "block"
    for n in (1, 4, 8):
        assert pattern_preferences(report, n)[:2] == ("bsr_tc", "bsr_spmv")
    assert "bsr_spmv" not in pattern_preferences(report, 16)
    t = get_template("bsr_spmv")
    ok, why = t.applicable(report)
    assert ok and "block" in why
    cost = t.cost(report, 1, "float16", "H200", {})
    packed = _load({}, tmp_path_factory).prepare(A, "float16", "cpu")       # the blocks the cost model counts
    assert f"{packed['nblocks']} nonzero 32x32 blocks" in cost.notes and packed["bs"] == 32
    assert cost.a_bytes == packed["nblocks"] * 1024 * 2 + 4 * packed["nblocks"] + 4 * (512 // 32 + 1)
    # past N = 8 every strip of 8 columns reads the blocks again
    assert t.cost(report, 8, "float16", "H200", {}).a_bytes == cost.a_bytes
    assert t.cost(report, 17, "float16", "H200", {}).a_bytes == 3 * cost.a_bytes
    assert t.cost(report, 4, "float16", "H200", {"NN": 2}).a_bytes == 2 * cost.a_bytes


@gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("params,b", [({}, 32), ({}, 16), ({"WARPS": 16, "UNROLL": 1}, 32), ({"NN": 2, "WARPS": 4}, 16),
                                      ({"BS": 32}, 16)])
def test_gpu_verifies_against_fp64(params, b, dtype):
    from sparseditto.harness.verify import run_and_verify

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    result = run_and_verify(get_template("bsr_spmv").instantiate(params), block_pruned(1000, 1500, b, 0.3, seed=5),
                            n_values=(1, 2, 3, 8, 9, 16, 17, 64), dtype=dtype, backend="cuda", timeout=600)
    assert result.ok, result.message


CHILD_EXPORT = CHILD_LOADS_EXPORT + r'''
W = np.load("w.npy")
k = kernel.SpMM(W, device="cpu")
np.savez("packed.npz", blocks=k.packed["blocks"].float().numpy(), brow_ptr=k.packed["brow_ptr"].numpy(),
         bcol=k.packed["bcol"].numpy(), bs=k.packed["bs"])
print(json.dumps({"modules": sorted(m for m in sys.modules if m.startswith(("sparseditto", "scipy")))}))
'''


def test_the_exported_kernel_packs_the_same_blocks_without_sparseditto(tmp_path, tmp_path_factory):
    """`sparseditto export` of a bsr_spmv kernel imports torch, numpy (CuPy only to launch): in an
    isolated interpreter that refuses SparseDitto and scipy, SpMM(W) packs the blocks prepare packs here."""
    import json
    import sys

    from sparseditto.batch.export import module_text
    from sparseditto.batch.standalone import third_party_imports
    from sparseditto.pattern_features import structure_signature

    A = block_pruned(100, 96, 16, 0.4, seed=6)
    candidate = get_template("bsr_spmv").instantiate({})
    fields = {"source": candidate.source, "template": "bsr_spmv", "layer": "w", "params": {},
              "matrix_shape": [100, 96], "dtype": "float16", "verified_ns": [1, 8], "verification": {},
              "signature": structure_signature(A), "density": A.nnz / (100 * 96), "structure": {"kind": "block"}}
    text = module_text(fields)
    assert third_party_imports(text) == {"torch", "numpy", "cupy"}
    (tmp_path / "kernel.py").write_text(text)
    np.save(tmp_path / "w.npy", A.to_dense().astype(np.float32))
    done = subprocess.run([sys.executable, "-I", "-c", CHILD_EXPORT, str(tmp_path / "kernel.py")], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["modules"] == []
    got = np.load(tmp_path / "packed.npz")
    here = _load({}, tmp_path_factory).prepare(A, "float16", "cpu")
    assert int(got["bs"]) == here["bs"] == 16
    for name in ("brow_ptr", "bcol"):
        assert np.array_equal(got[name], here[name].numpy()), name
    assert np.array_equal(got["blocks"], here["blocks"].float().numpy())
