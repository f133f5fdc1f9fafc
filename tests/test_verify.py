"""run_and_verify / compile_candidate on the interpreter: honest kernels pass, each cheat is caught."""
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.sparse as sp

from sparseditto.harness import compile_candidate, run_and_verify
from sparseditto.harness.numerics import RTOL, Reference, compare, describe_locations, draw_matrix_values
from sparseditto.matrix import SparseMatrix

CANDIDATES = Path(__file__).parent / "candidates"


def source(name: str) -> str:
    return (CANDIDATES / name).read_text()


def random_matrix(m=12, k=20, density=0.3, seed=0, empty_rows=()):
    dense = sp.random(m, k, density=density, random_state=seed, format="csr").toarray()
    dense[list(empty_rows)] = 0.0
    return SparseMatrix.from_scipy(sp.csr_array(dense), name=f"rand{m}x{k}")


MATRICES = {
    "random": random_matrix(seed=1),
    "empty_rows": random_matrix(seed=2, empty_rows=(0, 5, 11)),
}


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("kind", sorted(MATRICES))
def test_triton_csr_candidate_verifies(pool, kind, dtype):
    result = run_and_verify(source("good_triton_csr.py"), MATRICES[kind], dtype=dtype, pool=pool)
    assert result.ok and result.status == "verified", result.message
    assert [c.n for c in result.checks if c.kind == "base"] == [1, 3, 7, 16]   # odd N=1, 3 added
    assert {c.kind for c in result.checks} == {"base", "refill", "repeat", "perturb"}
    assert {c.prefill for c in result.checks} == {"nan", "garbage"}
    assert len({c.dist for c in result.checks}) >= 4   # B from (nearly) every distribution
    assert all(c.ok and c.tol_ratio <= 1.0 and c.tol == RTOL[dtype] for c in result.checks)
    assert result.backend == "interpret" and result.gpu_timings is False
    assert result.seed is not None and result.sandbox.get("audit_hook") is True


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_torch_candidate_verifies_on_every_dtype(pool, dtype):
    for matrix in MATRICES.values():
        result = run_and_verify(source("good_torch_scatter.py"), matrix, dtype=dtype, pool=pool)
        assert result.status == "verified", result.message


def test_all_zero_matrix_and_builtin_dense(pool):
    zero = SparseMatrix.from_scipy(sp.csr_array((6, 9)), name="zero")
    assert run_and_verify(source("good_triton_csr.py"), zero, pool=pool).status == "verified"
    builtin = SimpleNamespace(source="", backend="builtin", template="dense", params={}, source_hash="")
    assert run_and_verify(builtin, MATRICES["random"], pool=pool, dtype="float32").status == "verified"


def test_registry_template_candidate_verifies(pool):
    registry = pytest.importorskip("sparseditto.kernel_templates.registry")
    cand = registry.get_template("csr_rowsplit").instantiate({})
    result = run_and_verify(cand, MATRICES["empty_rows"], pool=pool, n_values=(1, 7))
    assert result.status == "verified", result.message


# candidate -> (status, failure_class) caught at run time (the static checks pass these)
DYNAMIC = {
    "cheat_zeros.py": ("wrong_result", "wrong_values"),
    "cheat_zeros_when_tiny.py": ("wrong_result", "wrong_values"),
    "broken_modifies_input.py": ("input_modified", "input_modified"),
    "broken_modifies_packed.py": ("input_modified", "input_modified"),
    "broken_unwritten_rows.py": ("unwritten_output", "unwritten_output"),
    "broken_off_by_one.py": ("wrong_result", "wrong_values"),
    "broken_unstable.py": ("unstable", "nondeterministic"),
    "broken_raises.py": ("runtime_error", "python_exception"),
    "broken_syntax.py": ("compile_error", "syntax_error"),
}


@pytest.mark.parametrize("name", sorted(DYNAMIC))
def test_broken_candidates_get_their_status(pool, name):
    result = run_and_verify(source(name), MATRICES["random"], pool=pool, n_values=(1, 7))
    assert (result.status, result.failure_class) == DYNAMIC[name], result.message
    assert not result.ok


def test_specific_failure_messages(pool):
    m = MATRICES["random"]
    tiny = run_and_verify(source("cheat_zeros_when_tiny.py"), m, pool=pool, n_values=(7,))
    assert "B tiny" in tiny.message and "all zeros" in tiny.message
    assert not tiny.checks[-1].ok and tiny.checks[-1].dist == "tiny" and all(c.ok for c in tiny.checks[:-1])
    unwritten = run_and_verify(source("broken_unwritten_rows.py"), m, pool=pool, n_values=(1,))
    assert "never written" in unwritten.message and "trailing rows 6..11" in unwritten.message
    modified = run_and_verify(source("broken_modifies_packed.py"), m, pool=pool, n_values=(1,))
    assert "packed['values'] contents changed" in modified.message


def test_cached_output_is_caught_even_without_static_checks(pool):
    result = run_and_verify(source("cheat_cached_output.py"), MATRICES["random"], pool=pool,
                            n_values=(7,), check_static=False)
    assert (result.status, result.failure_class) == ("refused", "state_carried"), result.message
    assert "module-level '_CACHE'" in result.message


def test_a_recorded_seed_reproduces_the_verification(pool):
    first = run_and_verify(source("good_torch_scatter.py"), MATRICES["random"], pool=pool, n_values=(4,))
    again = run_and_verify(source("good_torch_scatter.py"), MATRICES["random"], pool=pool, n_values=(4,),
                           seed=first.seed)
    other = run_and_verify(source("good_torch_scatter.py"), MATRICES["random"], pool=pool, n_values=(4,))
    assert first.seed == again.seed != other.seed
    assert [(c.dist, c.max_abs_err) for c in first.checks] == [(c.dist, c.max_abs_err) for c in again.checks]


def test_kernel_that_writes_nan_is_wrong_not_unwritten(pool):
    src = ("import torch\n\ndef prepare(A, dtype, device):\n    return {}\n\n"
           "def spmm(packed, B, out):\n    out.fill_(float('nan'))\n")
    result = run_and_verify(src, MATRICES["random"], pool=pool, n_values=(1,))
    assert (result.status, result.failure_class) == ("wrong_result", "nan_or_inf")


@pytest.mark.parametrize("name", ["cheat_torch_mm.py", "cheat_linear.py", "cheat_side_stream.py",
                                  "cheat_reads_file.py", "broken_segfault_ctypes.py"])
def test_static_rejection_happens_before_any_worker_runs(name):
    result = run_and_verify(source(name), MATRICES["random"], pool=None, backend="interpret")
    assert result.status == "static_rejected" and result.failure_class == "static_violation"
    assert result.violations and result.message


def test_bad_arguments_are_value_errors(pool):
    with pytest.raises(ValueError, match="positive N"):
        run_and_verify(source("good_torch_scatter.py"), MATRICES["random"], n_values=(), pool=pool)
    with pytest.raises(ValueError, match="non-negative int"):
        run_and_verify(source("good_torch_scatter.py"), MATRICES["random"], seed=-1, pool=pool)
    with pytest.raises(ValueError, match="maximum"):
        run_and_verify(source("good_torch_scatter.py"), MATRICES["random"], n_values=(10 ** 9,), pool=pool)
    with pytest.raises(ValueError, match="Unsupported dtype"):
        run_and_verify(source("good_torch_scatter.py"), MATRICES["random"], dtype="int8", pool=pool)
    with pytest.raises(ValueError, match="SparseMatrix"):
        run_and_verify(source("good_torch_scatter.py"), np.eye(3), pool=pool)
    with pytest.raises(ValueError, match="Candidate"):
        run_and_verify(object(), MATRICES["random"], pool=pool)


# ---- compile ---------------------------------------------------------------------------------------

def test_compile_good_and_broken_candidates(pool):
    ok = compile_candidate(source("good_triton_csr.py"), pool=pool)
    assert ok.ok and "first spmm" in ok.log and ok.backend == "interpret"
    syntax = compile_candidate(source("broken_syntax.py"), pool=pool)
    assert not syntax.ok and syntax.failure_class == "syntax_error"
    rejected = compile_candidate(source("cheat_torch_mm.py"), pool=pool)
    assert not rejected.ok and rejected.failure_class == "static_violation" and rejected.violations
    bad_triton = source("good_triton_csr.py").replace("tl.arange(0, BLOCK_NNZ)", "tl.arange(0, 3)")
    failed = compile_candidate(bad_triton, pool=pool)
    assert not failed.ok and failed.failure_class == "triton_compile_error"
    assert "power of 2" in failed.log


CUDA_CANDIDATE = '''
import torch

CUDA_SRC = r"""
extern "C" __global__ void scale(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
"""


def prepare(A, dtype, device):
    return {}


def spmm(packed, B, out):
    out.zero_()
'''


def test_cuda_candidate_without_gpu_and_nvcc(pool, tmp_path):
    import shutil

    import torch

    if torch.cuda.is_available():
        pytest.skip("covered by the GPU tests")
    no_gpu = compile_candidate(CUDA_CANDIDATE.replace("import torch", "import torch\nimport cupy"), pool=pool)
    assert not no_gpu.ok and no_gpu.failure_class == "backend_unavailable"
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    cand = SimpleNamespace(source=CUDA_CANDIDATE, backend="cuda", template="t", params={}, source_hash="")
    built = compile_candidate(cand, arch="sm_90", pool=pool, timeout=300)
    assert built.ok, built.log
    assert "nvcc -arch=sm_90 -cubin CUDA_SRC: ok" in built.log
    broken = SimpleNamespace(source=CUDA_CANDIDATE.replace("2.0f * x[i]", "2.0f * x[i] +"), backend="cuda",
                             template="t", params={}, source_hash="")
    failed = compile_candidate(broken, arch="sm_90", pool=pool, timeout=300)
    assert not failed.ok and failed.failure_class == "cuda_compile_error" and "error" in failed.log
    with pytest.raises(ValueError, match="CUDA arch"):
        compile_candidate(cand, arch="hopper", pool=pool)


# ---- numerics (in process) ---------------------------------------------------------------------------

def test_tolerance_formula_and_failure_description():
    m = MATRICES["empty_rows"]
    rng = np.random.default_rng(0)
    values = draw_matrix_values(m, rng, "float16")
    lengths = m.row_lengths()
    # per-row scaling: |a_ij| * sqrt(k_i) lies in [0.5, 1.5]
    scaled = np.abs(values) * np.sqrt(np.repeat(np.maximum(lengths, 1), lengths))
    assert scaled.min() >= 0.49 and scaled.max() <= 1.51
    b = rng.uniform(-1, 1, (m.shape[1], 5))
    ref = Reference.compute(m, values, b, "float16")
    k = lengths[:, None].astype(float)
    expected_tol = 1e-6 + (2.0 ** -9 + 4.0 * np.sqrt(k) * 2.0 ** -24) * ref.bound
    assert np.allclose(ref.tol, expected_tol)
    assert np.all(ref.value[lengths == 0] == 0) and np.all(ref.tol[lengths == 0] == 1e-6)
    good = compare(ref.value + 0.5 * ref.tol, ref.value, ref)
    assert good.ok and good.tol_ratio <= 0.5 + 1e-9
    bad_values = ref.value.copy()
    bad_values[:, 3:] += 10 * ref.tol[:, 3:] + 1e-3
    bad = compare(bad_values, ref.value, ref)
    assert not bad.ok and bad.n_bad == bad_values[:, 3:].size
    assert "trailing columns 3..4" in bad.message
    mask = np.zeros((4, 4), bool)
    mask[2:, :] = True
    assert "trailing rows 2..3" in describe_locations(mask)


def test_garbage_prefill_never_draws_from_torchs_default_generator():
    """A library's failed CUDA graph capture poisons torch's default CUDA generator (every later draw
    raises "Offset increment outside graph capture encountered unexpectedly"): on the H200 that made
    two vendor paths look broken. The verifier's garbage prefill has its own seeded generator, so the
    default one is neither read nor advanced, and the garbage is reproducible from the seed."""
    import torch

    from sparseditto.harness.verify import _Run

    class Shape:
        shape = (6, 9)

    before = torch.random.get_rng_state().clone()
    first = _Run(None, Shape(), 5, "float32", "interpreter", None, seed=42)._prefilled(True)
    again = _Run(None, Shape(), 5, "float32", "interpreter", None, seed=42)._prefilled(True)
    other = _Run(None, Shape(), 5, "float32", "interpreter", None, seed=43)._prefilled(True)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert first.shape == (6, 5) and torch.equal(first, again) and not torch.equal(first, other)
    assert float(first.abs().max()) > 1.0          # garbage, not zeros


def test_the_references_device_copies_are_narrow_and_exact():
    """The fp64 reference on a GPU copies A's positions as int32 and its values as float32 when that
    holds them exactly (half the bytes over PCIe, widened exactly on the GPU); values float32 cannot
    hold stay float64; the arrays are kept for the last matrix / value draw only."""
    from sparseditto import generate
    from sparseditto.harness import numerics

    A = generate.unstructured(300, 700, 0.9, seed=4, dtype="float16")
    flat = numerics._flat_positions(A)
    assert flat.dtype == np.int32 and numerics._flat_positions(A) is flat
    np.testing.assert_array_equal(flat.astype(np.int64), A.row_ids() * 700 + A.indices)
    v16 = numerics.round_to_dtype(np.random.default_rng(0).standard_normal(A.nnz), "float16")
    narrow = numerics._narrow_values(v16)
    assert narrow.dtype == np.float32 and np.array_equal(narrow.astype(np.float64), v16)
    assert numerics._narrow_values(v16) is narrow
    wide = np.full(A.nnz, 1.0 + 2.0 ** -40)                        # not a float32
    assert numerics._narrow_values(wide).dtype == np.float64


@pytest.mark.gpu
def test_gpu_reference_from_narrow_copies_matches_scipys_fp64_product():
    import scipy.sparse as sp
    import torch

    from sparseditto import generate
    from sparseditto.harness import numerics

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    A = generate.magnitude_pruned(1100, 4160, 0.5, seed=2, dtype="float16")
    values = numerics.round_to_dtype(np.random.default_rng(1).standard_normal(A.nnz), "float16")
    b = np.random.default_rng(2).standard_normal((4160, 17))
    value, bound = numerics._products_fp64(A, values, b)
    ref = sp.csr_array((values, A.indices, A.indptr), shape=A.shape) @ b
    np.testing.assert_allclose(value, ref, rtol=1e-12, atol=1e-12)
    assert np.all(bound >= np.abs(value) - 1e-9)
