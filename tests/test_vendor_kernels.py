"""Vendor paths as candidate kernels: the harness verifies and times them like generated code.

On the CPU (interpreter backend) dense and torch's CSR run for real; the GPU-only paths say why
they cannot run. GPU tests (marked ``gpu``) run every vendor path through the same protocol.
"""
import numpy as np
import pytest
import torch

from sparseditto import generate
from sparseditto.harness import (VENDOR_NAMES, bench, compile_candidate, is_vendor_kernel, run_and_verify,
                                 unavailable_reason, vendor_kernel, vendor_spec)


def matrix():
    return generate.unstructured(40, 36, 0.85, seed=3)


@pytest.mark.parametrize("name", ["dense", "cusparse_csr_torch"])
def test_cpu_vendor_paths_pass_the_full_verification_and_the_bench(pool, name):
    A = matrix()
    spec = vendor_spec(name)
    assert spec.is_builtin and compile_candidate(spec, backend="interpret").ok
    v = run_and_verify(spec, A, n_values=(8,), dtype="float32", backend="interpret", pool=pool)
    assert v.ok, v.message
    assert {c.n for c in v.checks} >= {8, 1}          # the requested N plus the odd ones
    assert {c.prefill for c in v.checks} == {"nan", "garbage"}
    r = bench(spec, A, 8, dtype="float32", backend="interpret", repeats=3, warmup=1, baselines=False, pool=pool)
    assert r.reverified and r.candidate.median_ms > 0 and r.candidate.repeats == 3


def test_the_kernels_compute_a_times_b_in_process():
    A = matrix()
    B = torch.randn(A.shape[1], 5, dtype=torch.float64)
    ref = A.to_scipy().astype(np.float64) @ B.numpy()
    for name in ("dense", "cusparse_csr_torch"):
        kernel = vendor_kernel(name)
        packed = kernel.prepare(A, torch.float64, "cpu")
        out = torch.full((A.shape[0], 5), float("nan"), dtype=torch.float64)
        kernel.spmm(packed, B, out)          # NaN in out must not leak (beta = 0 for the CSR path)
        np.testing.assert_allclose(out.numpy(), ref, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(kernel.apply(packed, B).numpy(), ref, rtol=1e-12, atol=1e-12)


def test_unavailable_paths_say_why_without_a_gpu():
    A = generate.nm_sparse(16, 32, 2, 4, seed=0)
    assert unavailable_reason("dense", A, "float16", "interpret") is None
    assert "float16" in unavailable_reason("cusparse_csr_torch", A, "float16", "interpret")
    assert unavailable_reason("cusparse_csr_torch", A, "float32", "interpret") is None
    for name in ("cusparse_csr_cupy", "cusparselt_2to4", "triton_bsr_torch"):
        assert "GPU" in unavailable_reason(name, A, "float16", "interpret")
    assert "not 2:4" in unavailable_reason("cusparselt_2to4", matrix(), "float16", "cuda")
    assert unavailable_reason("cusparselt_2to4", A, "float16", "cuda") is None
    assert is_vendor_kernel("dense") and not is_vendor_kernel("csr_rowsplit")
    assert vendor_kernel("cublas_dense") is vendor_kernel("dense")     # by baseline name too
    with pytest.raises(ValueError, match="Unknown vendor kernel"):
        vendor_spec("mkl")


@pytest.mark.gpu
@pytest.mark.parametrize("name", VENDOR_NAMES)
def test_every_vendor_path_verifies_and_times_on_the_gpu(name):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    A = generate.nm_magnitude_pruned(256, 512, 2, 4, seed=0) if name == "cusparselt_2to4" else \
        generate.unstructured(256, 512, 0.9, seed=0)
    if unavailable_reason(name, A, "float16", "cuda"):
        pytest.skip(unavailable_reason(name, A, "float16", "cuda"))
    v = run_and_verify(vendor_spec(name), A, n_values=(16, 64), dtype="float16", backend="cuda")
    assert v.ok, v.message
    r = bench(vendor_spec(name), A, 64, dtype="float16", backend="cuda", repeats=10, warmup=2, baselines=False)
    assert r.reverified and r.timings_are_gpu and r.candidate.median_ms > 0, r.reverify_message
