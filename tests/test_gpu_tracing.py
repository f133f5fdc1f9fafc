"""Launch tracing on a real GPU: a candidate reaching cuBLAS/cuSPARSE by any route is refused, the
real Triton and CuPy templates pass. Skipped without CUDA (run on the H200 with `-m gpu`)."""
from __future__ import annotations

import pytest
import scipy.sparse as sp

from sparseditto.harness import bench, run_and_verify
from sparseditto.matrix import SparseMatrix

pytestmark = pytest.mark.gpu

DENSE = '''
import numpy as np
import torch
import functools


def _get(obj, *names):
    return functools.reduce(getattr, names, obj)


def prepare(A, dtype, device):
    return {"dense": torch.from_numpy(A.to_dense()).to(device=device, dtype=dtype)}
'''

ROUTES = {
    "torch.mm alias": DENSE + '''
def spmm(packed, B, out):
    out.copy_(_get(torch, "m" + "m")(packed["dense"], B))
''',
    "torch.overrides table": DENSE + '''
def spmm(packed, B, out):
    table = _get(torch, "overrides", "get_overridable_functions")()[torch]
    fn = [f for f in table if repr(f).startswith("<built-in method matmul of")][0]
    out.copy_(fn(packed["dense"], B))
''',
    "F.conv1d": DENSE + '''
def spmm(packed, B, out):
    y = _get(torch, "nn", "functional", "conv1d")(B.t()[:, :, None], packed["dense"][:, :, None])
    out.copy_(y[:, :, 0].t())
''',
    "torch.compile": DENSE + '''
def spmm(packed, B, out):
    out.copy_(_get(torch, "compile")(lambda a, b: a.matmul(b))(packed["dense"], B))
''',
    "cupy.matmul": DENSE + '''
import cupy


def spmm(packed, B, out):
    a, b = cupy.from_dlpack(packed["dense"]), cupy.from_dlpack(B)
    out.copy_(torch.from_dlpack(_get(cupy, "mat" + "mul")(a, b)))
''',
    "cupy dot on a stream view": DENSE + '''
import cupy


def spmm(packed, B, out):
    c = cupy.from_dlpack(packed["dense"]).dot(cupy.from_dlpack(B))
    out.copy_(torch.from_dlpack(c))
''',
    "cupyx sparse": DENSE + '''
import cupy


def spmm(packed, B, out):
    cusp = _get(torch, "importlib", "import_module")("cupyx.scipy.sparse")
    m = cusp.csr_matrix(cupy.from_dlpack(packed["dense"].float()))
    out.copy_(torch.from_dlpack(m @ cupy.from_dlpack(B.float())))
''',
    "a dummy kernel named like cuBLAS": DENSE + '''
import triton
import triton.language as tl


@triton.jit
def ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_nn(x):
    pass


def spmm(packed, B, out):
    out.copy_(_get(torch, "mat" + "mul")(packed["dense"], B))
''',
}


@pytest.fixture(scope="module")
def matrix():
    return SparseMatrix.from_scipy(sp.random(512, 512, density=0.1, random_state=0, format="csr"), name="gpu")


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_a_candidate_reaching_a_vendor_library_is_refused_on_the_gpu(pool, matrix, route):
    result = run_and_verify(ROUTES[route], matrix, backend="cuda", pool=pool, check_static=False, n_values=(16,),
                            timeout=300)
    assert result.status == "refused", (route, result.status, result.message)
    # the CuPy routes are already stopped where the tensor leaves torch (DLPack export: host_export)
    assert result.failure_class in ("vendor_op", "vendor_kernel", "foreign_kernel", "sandbox_violation",
                                    "host_export"), result.message


@pytest.mark.parametrize("template", ["csr_rowsplit", "csr_balanced", "bsr_tc", "nm_compressed", "csr_vector"])
def test_real_templates_pass_verification_and_timed_checks_on_the_gpu(pool, matrix, template):
    from sparseditto import generate
    from sparseditto.kernel_templates.registry import get_template

    if template == "csr_vector":
        pytest.importorskip("cupy")
    if template == "nm_compressed":
        matrix = generate.nm_sparse(512, 512, dtype="float16", seed=0)
    cand = get_template(template).instantiate({})
    result = run_and_verify(cand, matrix, backend="cuda", pool=pool, n_values=(1, 16, 128), timeout=600)
    assert result.status == "verified", (template, result.message, result.log[-2000:])
    timed = bench(cand, matrix, 16, backend="cuda", pool=pool, repeats=5, warmup=2, baselines=False, timeout=600)
    assert timed.reverified, timed.reverify_message
    assert result.sandbox.get("audit_hook") is True
