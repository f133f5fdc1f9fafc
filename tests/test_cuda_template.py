"""The CUDA C++ template csr_vector: the embedded source compiles with nvcc, the launch planning is
consistent with what prepare() compiles, and (GPU) the kernels match a float64 reference.

CuPy cannot run without a GPU, so on the CPU the kernels are compiled with `nvcc -ptx` (skipped
when nvcc is absent) and the Python side is exercised without launching anything.
"""
from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from sparseditto.kernel_templates.registry import TEMPLATE_ROOT, get_template
from sparseditto.matrix import SparseMatrix

CU_FILE = TEMPLATE_ROOT / "cuda" / "csr_vector.cu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _cuda_src(source: str) -> str:
    """The CUDA_SRC string literal of a candidate source, read without importing it."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "CUDA_SRC" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("candidate source has no CUDA_SRC")


def _load(params: dict, tmp_path, tag: str):
    cand = get_template("csr_vector").instantiate(params)
    path = tmp_path / f"csr_vector_{tag}_{cand.source_hash[:12]}.py"
    path.write_text(cand.source)
    name = f"sparseditto_test_cuda_{tag}_{cand.source_hash[:12]}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _matrix(m, k, density, seed, empty_rows=()) -> SparseMatrix:
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((m, k)) * (rng.random((m, k)) < density)
    dense[list(empty_rows), :] = 0
    return SparseMatrix.from_scipy(sp.csr_array(dense))


def test_candidate_embeds_the_cu_file_verbatim():
    cand = get_template("csr_vector").instantiate({})
    assert cand.backend == "cuda"
    header = (TEMPLATE_ROOT / "cuda" / "dtypes.cuh").read_text().strip("\n")
    assert _cuda_src(cand.source).strip("\n") == header + "\n\n" + CU_FILE.read_text().strip("\n")
    assert 'CUDA_SRC = r"""@SPARSEDITTO_INLINE' not in cand.source


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_cuda_source_compiles_with_nvcc(tmp_path):
    """Compile the candidate's embedded source with every kernel instantiated (sm_90 PTX)."""
    src = tmp_path / "csr_vector_candidate.cu"
    src.write_text(_cuda_src(get_template("csr_vector").instantiate({}).source))
    ptx = tmp_path / "csr_vector.ptx"
    proc = subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "-DSPARSEDITTO_INSTANTIATE_ALL", "-ptx",
                           str(src), "-o", str(ptx)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = ptx.read_text()
    entries = re.findall(r"^\.visible \.entry (\S+)\(", text, flags=re.MULTILINE)
    nnz = [e for e in entries if "csr_vector_nnz" in e]
    cols = [e for e in entries if "csr_vector_cols" in e]
    assert len(nnz) == 3 * 5 * 5, "nnz kernels: 3 dtypes x 5 groups x 5 tiles"
    assert len(cols) == 3 + 4 + 4, "cols kernels: fp32 VEC 1/2/4, fp16 and bf16 VEC 1/2/4/8"
    assert "ld.global.nc.v4" in text, "expected 16-byte vector loads of B"


def test_prepare_and_launch_plan_on_cpu(tmp_path):
    module = _load({}, tmp_path, "auto")
    A = _matrix(50, 70, 0.2, seed=0, empty_rows=(3, 4))
    packed = module.prepare(A, "float16", "cpu")
    assert packed["kernels"] == {}  # nothing is compiled without a GPU
    assert packed["indptr"].dtype == torch.int32 and packed["values"].dtype == torch.float16
    assert 8 < A.nnz / 50 <= 16 and packed["group"] == 16  # lanes per row: next power of two of the mean row
    spmv = module.plan_launch(packed, 1, torch.float16, 0, 1)
    assert spmv["layout"] == "nnz" and spmv["name"].endswith(", 1>") and spmv["grid"][1] == 1
    small = module.plan_launch(packed, 5, torch.float16, 0, 5)
    assert small["name"].endswith(", 8>") and small["vec_ok"] == 0  # ldb 5 is not a multiple of 8
    decode = module.plan_launch(packed, 16, torch.float16, 256, 16)   # 32 bytes of a B row per lane
    assert decode["layout"] == "nnz" and decode["name"].endswith(", 16>") and decode["grid"][1] == 1
    assert decode["vec_ok"] == 1
    decode32 = module.plan_launch(packed, 16, torch.float32, 256, 16)
    assert decode32["name"] == "csr_vector_nnz<F32, 16, 8>" and decode32["grid"][1] == 2
    assert module.plan_launch(packed, 17, torch.float16, 0, 17)["layout"] == "cols"
    wide = module.plan_launch(packed, 4096, torch.float16, 256, 4096)
    assert wide["name"] == "csr_vector_cols<F16, 8>" and wide["vec_ok"] == 1
    assert wide["grid"] == (-(-50 // 4), 4096 // 256, 1) and wide["block"] == (128, 1, 1)
    fp32 = module.plan_launch(packed, 4096, torch.float32, 256, 4096)
    assert fp32["name"] == "csr_vector_cols<F32, 4>"  # one 16-byte vector per lane at most
    misaligned = module.plan_launch(packed, 64, torch.float16, 258, 64)
    assert misaligned["vec_ok"] == 0


@pytest.mark.parametrize("params", [{}, {"LAYOUT": "nnz", "GROUP": 8, "TILE_N": 2},
                                    {"LAYOUT": "cols", "VEC": 8, "WARPS_PER_BLOCK": 2}])
def test_every_planned_kernel_is_compiled(params, tmp_path):
    """prepare() compiles reachable_kernels(); plan_launch must never pick anything else."""
    module = _load(params, tmp_path, "reach")
    A = _matrix(40, 60, 0.3, seed=1)
    for dtype in DTYPES:
        packed = module.prepare(A, dtype, "cpu")
        compiled = set(module.reachable_kernels(dtype, packed["group"]))
        for n in list(range(1, 70)) + [255, 256, 257, 1000, 8192]:
            plan = module.plan_launch(packed, n, dtype, 0, n)
            assert plan["name"] in compiled, (dtype, n, plan["name"])


def test_spmm_refuses_cpu_tensors(tmp_path):
    module = _load({}, tmp_path, "cpu")
    packed = module.prepare(_matrix(8, 8, 0.5, seed=2), "float32", "cpu")
    with pytest.raises(ValueError, match="runs on a CUDA device"):
        module.spmm(packed, torch.zeros(8, 2), torch.zeros(8, 2))
    with pytest.raises(ValueError, match=r"Expected B of shape \(8, N\)"):
        module.spmm(packed, torch.zeros(7, 2), torch.zeros(8, 2))


# ---- GPU: run through CuPy --------------------------------------------------------------------

TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _check_gpu(module, A: SparseMatrix, n: int, dtype, *, misalign=False, transposed=False):
    gen = torch.Generator().manual_seed(n)
    M, K = A.shape
    B = torch.randn(K, n + (1 if misalign else 0), generator=gen).to(dtype).cuda()
    if misalign:  # a column slice: base pointer off by one element, ldb odd
        B = B[:, 1:]
    if transposed:
        B = B.t().contiguous().t()
    packed = module.prepare(A, dtype, "cuda")
    out = torch.full((M, n), float("nan"), dtype=dtype, device="cuda")
    module.spmm(packed, B, out)
    torch.cuda.synchronize()
    got = out.double().cpu().numpy()
    assert not np.isnan(got).any()
    a = A.with_values(torch.from_numpy(A.data.astype(np.float32)).to(dtype).double().numpy()).to_dense()
    b = B.double().cpu().numpy()
    ref = a @ b
    bound = TOL[dtype] * (np.abs(a) @ np.abs(b) + np.abs(ref)) + 1e-6
    assert (np.abs(got - ref) <= bound).all(), f"max error {np.abs(got - ref).max():.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("params", [{}, {"LAYOUT": "nnz", "GROUP": 4, "TILE_N": 8},
                                    {"LAYOUT": "nnz", "GROUP": 8, "TILE_N": 16},
                                    {"LAYOUT": "nnz", "GROUP": 32, "TILE_N": 1},
                                    {"LAYOUT": "cols", "VEC": 1}, {"LAYOUT": "cols", "VEC": 8, "WARPS_PER_BLOCK": 8}])
def test_gpu_matches_reference(params, dtype, tmp_path):
    pytest.importorskip("cupy")
    module = _load(params, tmp_path, "gpu")
    A = _matrix(777, 1030, 0.05, seed=3, empty_rows=range(0, 777, 9))
    for n in (1, 3, 8, 16, 33, 128, 1000):
        _check_gpu(module, A, n, dtype)
    _check_gpu(module, A, 64, dtype, misalign=True)
    _check_gpu(module, A, 17, dtype, transposed=True)
    _check_gpu(module, _matrix(1, 300, 0.3, seed=4), 5, dtype)
    _check_gpu(module, _matrix(300, 1, 0.3, seed=5), 40, dtype)
    _check_gpu(module, SparseMatrix.from_scipy(sp.csr_array((20, 30))), 9, dtype)
