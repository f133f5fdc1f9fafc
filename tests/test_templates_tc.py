"""The tensor-core "load as sparse, compute as dense" Triton templates against a float64 reference:
bsr_tc (block sparse), nm_compressed (2:4 and other n:m, with residual), bitmap_tiles (unstructured).

Each case instantiates the template through the registry, writes the candidate source to a file
(Triton needs real source files), imports it, runs prepare() + spmm() into a NaN-filled output and
compares, element by element, with float64 numpy on the *same rounded* inputs (A's values and B
cast to the kernel's dtype), within a bound scaled by |A| @ |B|. On the CPU the kernels run in the
Triton interpreter, so shapes stay <= 128 x 300 and N <= 33; the `gpu` tests run 4096 x 4096 at
N = 16 and N = 2048 on a real device (including the PTX-only paths: packed 2:4 expand, popc).
"""
from __future__ import annotations

import gzip
import importlib.util

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from sparseditto.matrix import SparseMatrix

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Bound per element: TOL * (|A| @ |B| + |ref|). fp32 runs an IEEE fp32 dot (FP32_DOT="ieee").
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


# the NumPy >= 2.4 interpreter fix is applied by tests/conftest.py for in-process runs
from template_instances import load_candidate  # noqa: E402


# ---- matrices -----------------------------------------------------------------------------------

def _csr(dense: np.ndarray, name: str) -> SparseMatrix:
    return SparseMatrix.from_scipy(sp.csr_array(dense), name=name)


def block_matrix(m, k, bm, bk, fill, seed, empty_block_rows=(), skew=False) -> SparseMatrix:
    """Dense (bm x bk) blocks at random block positions; `skew` makes a few block rows full."""
    rng = np.random.default_rng(seed)
    mb, kb = -(-m // bm), -(-k // bk)
    occ = rng.random((mb, kb)) < fill
    if skew:
        occ[::3] = False
        occ[1] = True
    occ[list(empty_block_rows)] = False
    dense = np.kron(occ, np.ones((bm, bk)))[:m, :k] * rng.standard_normal((m, k))
    return _csr(dense, f"block{bm}x{bk}")


def nm_matrix(m, k, n, g, seed, violations=0.0, empty_rows=()) -> SparseMatrix:
    """Exactly n nonzeros per group of g columns (the last group may be cut by K), plus optional
    extra entries that violate n:g (they must go to the residual)."""
    rng = np.random.default_rng(seed)
    groups = -(-k // g)
    keep = np.zeros((m, groups, g), dtype=bool)
    np.put_along_axis(keep, rng.random((m, groups, g)).argsort(axis=-1)[..., :n], True, axis=-1)
    keep = keep.reshape(m, groups * g)[:, :k] | (rng.random((m, k)) < violations)
    keep[list(empty_rows)] = False
    return _csr(keep * rng.standard_normal((m, k)), f"{n}:{g}")


def random_matrix(m, k, sparsity, seed, empty_rows=()) -> SparseMatrix:
    rng = np.random.default_rng(seed)
    dense = (rng.random((m, k)) >= sparsity) * rng.standard_normal((m, k))
    dense[list(empty_rows)] = 0
    return _csr(dense, f"random{sparsity}")


def single(value=1.5) -> SparseMatrix:
    return _csr(np.array([[value]]), "1x1")


def dlmc_slice(root, sparsity: str, rows: int, cols: int) -> SparseMatrix:
    """Top-left slice of a DLMC transformer weight (pattern file; N(0,1) values, fixed seed)."""
    folder = root / "dlmc" / "transformer" / "magnitude_pruning" / sparsity
    files = sorted(folder.glob("*.smtx*"))
    if not files:
        pytest.skip(f"no DLMC matrices under {folder}")
    try:
        from sparseditto.io import load_matrix

        A = load_matrix(files[0], seed=0)
        full = A.to_scipy()
    except ImportError:  # sparseditto.io absent: parse the 3-line .smtx format here
        opener = gzip.open if files[0].suffix == ".gz" else open
        with opener(files[0], "rt") as fh:
            m, k, _ = (int(x) for x in fh.readline().replace(",", " ").split())
            indptr = np.array(fh.readline().split(), dtype=np.int64)
            indices = np.array(fh.readline().split(), dtype=np.int64)
        vals = np.random.default_rng(0).standard_normal(indices.size)
        full = sp.csr_array((vals, indices, indptr), shape=(m, k))
    return SparseMatrix.from_scipy(full[:rows, :cols], name=f"dlmc{sparsity}")


# ---- the check ----------------------------------------------------------------------------------

def run_and_check(module, A: SparseMatrix, n: int, dtype, *, b_transposed=False, seed=0, device=DEVICE):
    """prepare + spmm into a NaN-filled output; every element written and within the bound."""
    gen = torch.Generator().manual_seed(seed)
    M, K = A.shape
    B = torch.randn(K, n, generator=gen).to(dtype)
    if b_transposed:  # same values, column-major storage: B.stride() == (1, K)
        B = B.t().contiguous().t()
    B = B.to(device)
    B_before = B.clone()
    packed = module.prepare(A, dtype, device)
    out = torch.full((M, n), float("nan"), dtype=dtype, device=device)
    module.spmm(packed, B, out)
    assert torch.equal(B, B_before), "spmm modified B"
    got = out.double()
    unwritten = int(torch.isnan(got).sum())
    assert unwritten == 0, f"{unwritten} output elements left unwritten (NaN)"
    a_vals = torch.from_numpy(A.data.astype(np.float32)).to(dtype).double().numpy()
    a64 = torch.from_numpy(A.with_values(a_vals).to_dense()).to(device)
    b64 = B.double()
    ref = a64 @ b64  # test code may use a dense matmul; candidates may not
    scale = a64.abs() @ b64.abs()
    err = (got - ref).abs()
    bound = TOL[dtype] * (scale + ref.abs()) + 1e-6
    if not bool((err <= bound).all()):
        worst = np.unravel_index(int(torch.argmax(err - bound)), tuple(err.shape))
        raise AssertionError(f"max error {float(err.max()):.3g} at {worst}: got {float(got[worst]):.6g}, "
                             f"expected {float(ref[worst]):.6g} (bound {float(bound[worst]):.3g})")
    return packed


# ---- interpreter cases --------------------------------------------------------------------------

MATRICES = {
    "blk16": lambda: block_matrix(70, 90, 16, 16, 0.4, seed=1, empty_block_rows=(2,)),
    "blk16x32": lambda: block_matrix(64, 100, 16, 32, 0.45, seed=2),
    "blk32": lambda: block_matrix(96, 128, 32, 32, 0.5, seed=3),
    "blk8": lambda: block_matrix(40, 56, 8, 8, 0.3, seed=4),
    "blk_skew": lambda: block_matrix(80, 256, 16, 16, 0.2, seed=5, skew=True),
    "blk64": lambda: block_matrix(128, 128, 64, 64, 0.5, seed=6),
    "24": lambda: nm_matrix(70, 90, 2, 4, seed=7, empty_rows=(3, 69)),
    "24_wide": lambda: nm_matrix(48, 300, 2, 4, seed=8),
    "24_viol": lambda: nm_matrix(64, 130, 2, 4, seed=9, violations=0.05),
    "12": lambda: nm_matrix(40, 64, 1, 2, seed=10),
    "48_viol": lambda: nm_matrix(40, 70, 4, 8, seed=11, violations=0.02),
    "14": lambda: nm_matrix(33, 72, 1, 4, seed=12),
    "28": lambda: nm_matrix(33, 72, 2, 8, seed=13),
    "u50": lambda: random_matrix(70, 90, 0.5, seed=14, empty_rows=(0, 23)),
    "u70": lambda: random_matrix(33, 100, 0.7, seed=15),
    "u90": lambda: random_matrix(64, 130, 0.9, seed=16),
    "u95": lambda: random_matrix(40, 200, 0.95, seed=17, empty_rows=(5,)),
    "zero": lambda: _csr(np.zeros((20, 40)), "zero"),
    "one": single,
    "row": lambda: random_matrix(1, 70, 0.5, seed=18),
    "col": lambda: random_matrix(40, 1, 0.3, seed=19),
}

# (template, params, matrix, n, dtype, b_transposed)
CASES = [
    # bsr_tc: auto block shape/group/split, rectangular blocks, re-blocked 8x8, grouped padding
    ("bsr_tc", {}, "blk16", 7, torch.float16, False),
    ("bsr_tc", {"BM": 16, "BK": 32, "SPLIT": 2}, "blk16x32", 33, torch.float16, False),
    ("bsr_tc", {"BM": 32, "BK": 32, "GROUP": 2, "ORDER": "natural"}, "blk32", 16, torch.float32, True),
    ("bsr_tc", {"BM": 8, "BK": 8}, "blk8", 5, torch.bfloat16, False),
    ("bsr_tc", {"BM": 16, "BK": 16, "GROUP": 4, "SPLIT": 4}, "blk_skew", 16, torch.float16, False),
    ("bsr_tc", {"BM": 64, "BK": 64, "BLOCK_N": 16, "num_stages": 2}, "blk64", 20, torch.float16, False),
    ("bsr_tc", {}, "zero", 3, torch.float16, False),
    ("bsr_tc", {}, "one", 1, torch.float32, False),
    ("bsr_tc", {}, "row", 16, torch.float16, False),
    ("bsr_tc", {}, "col", 2, torch.float16, False),
    # nm_compressed: bits (2:4 default), planes, select; residual; other n:m; split-K
    ("nm_compressed", {}, "24", 7, torch.float16, False),
    ("nm_compressed", {"BLOCK_M": 16, "BLOCK_G": 16, "SPLIT_K": 4}, "24_wide", 1, torch.float16, True),
    ("nm_compressed", {"EXPAND": "planes", "SPLIT_K": 2, "BLOCK_M": 16, "BLOCK_G": 16}, "24_viol", 16,
     torch.float32, False),
    ("nm_compressed", {"EXPAND": "select", "BLOCK_M": 32}, "24_viol", 33, torch.bfloat16, False),
    ("nm_compressed", {"NM": "1:2", "BLOCK_M": 16, "BLOCK_G": 16}, "12", 9, torch.float16, False),
    ("nm_compressed", {"NM": "1:2", "EXPAND": "select", "BLOCK_M": 16, "BLOCK_G": 16}, "12", 9,
     torch.float16, False),
    ("nm_compressed", {"NM": "4:8", "BLOCK_M": 16, "BLOCK_G": 16}, "48_viol", 5, torch.float16, False),
    ("nm_compressed", {"NM": "4:8", "EXPAND": "select", "BLOCK_M": 16, "BLOCK_G": 16}, "48_viol", 5,
     torch.float32, False),
    ("nm_compressed", {"NM": "1:4", "BLOCK_M": 16, "BLOCK_G": 16}, "14", 4, torch.float16, False),
    ("nm_compressed", {"NM": "auto", "BLOCK_M": 16, "BLOCK_G": 16}, "28", 3, torch.float16, False),
    ("nm_compressed", {"BLOCK_M": 16, "BLOCK_G": 16}, "zero", 2, torch.float16, False),
    ("nm_compressed", {"BLOCK_M": 16, "BLOCK_G": 16}, "one", 1, torch.float16, False),
    ("nm_compressed", {"BLOCK_M": 16, "BLOCK_G": 16}, "col", 3, torch.float16, False),
    # bitmap_tiles: running / stored offsets, split-K, KW, tiny shapes
    ("bitmap_tiles", {}, "u50", 7, torch.float16, False),
    ("bitmap_tiles", {"SPLIT_K": 2, "BLOCK_M": 16, "KW": 1}, "u90", 16, torch.float32, True),
    ("bitmap_tiles", {"OFFSETS": "stored", "BLOCK_M": 32}, "u70", 33, torch.bfloat16, False),
    ("bitmap_tiles", {"SPLIT_K": 4, "KW": 1, "BLOCK_M": 16}, "u95", 5, torch.float16, False),
    ("bitmap_tiles", {"SPLIT_K": 4, "KW": 1, "BLOCK_M": 16, "OFFSETS": "stored", "POPC": "swar"}, "u95", 5,
     torch.float16, False),
    ("bitmap_tiles", {"BLOCK_M": 16, "KW": 4, "GATHER": "direct"}, "u50", 1, torch.float16, False),
    ("bitmap_tiles", {"GATHER": "direct", "OFFSETS": "stored", "BLOCK_M": 16}, "u70", 9, torch.float32, True),
    ("bitmap_tiles", {"BLOCK_M": 16}, "zero", 3, torch.float16, False),
    ("bitmap_tiles", {"BLOCK_M": 16}, "one", 1, torch.float16, False),
    ("bitmap_tiles", {"BLOCK_M": 16}, "row", 16, torch.float32, False),
    ("bitmap_tiles", {"BLOCK_M": 16}, "col", 2, torch.float16, False),
]


@pytest.mark.parametrize("name,params,kind,n,dtype,bt", CASES,
                         ids=[f"{c[0]}-{c[2]}-n{c[3]}-{str(c[4])[6:]}-{i}" for i, c in enumerate(CASES)])
def test_template_matches_reference(name, params, kind, n, dtype, bt, tmp_path_factory):
    module = load_candidate(name, params, tmp_path_factory)
    run_and_check(module, MATRICES[kind](), n, dtype, b_transposed=bt)


@pytest.mark.parametrize("name,params,sparsity", [
    ("bsr_tc", {"BM": 16, "BK": 16}, "0.7"),
    ("nm_compressed", {"BLOCK_M": 32, "BLOCK_G": 16}, "0.5"),
    ("bitmap_tiles", {"BLOCK_M": 32}, "0.9"),
])
def test_dlmc_slice(name, params, sparsity, shared_data, tmp_path_factory):
    """A real pruned transformer weight (sliced to 96 x 128): unstructured, so BSR pads blocks and
    2:4 leaves a large residual CSR; both must stay exact."""
    A = dlmc_slice(shared_data, sparsity, 96, 128)
    assert A.nnz > 0
    run_and_check(load_candidate(name, params, tmp_path_factory), A, 8, torch.float16)


# ---- host-side logic ----------------------------------------------------------------------------

def test_split_k_counters_reset_between_launches(tmp_path_factory):
    """Split-K's arrival counters are reset by the reducing program, so a second launch on the
    same prepared matrix is exact too (and a fresh B gives a fresh result)."""
    module = load_candidate("bitmap_tiles", {"SPLIT_K": 4, "KW": 1, "BLOCK_M": 16}, tmp_path_factory)
    A = MATRICES["u95"]()
    packed = run_and_check(module, A, 5, torch.float16, seed=1)
    (plan,) = packed["scratch"].values()
    cnt = plan["cnt"]
    assert plan["config"]["SPLIT"] == 4 and cnt.numel() > 1
    assert int(cnt.abs().sum()) == 0
    B = torch.randn(A.shape[1], 5, generator=torch.Generator().manual_seed(2)).to(torch.float16).to(DEVICE)
    out = torch.full((A.shape[0], 5), float("nan"), dtype=torch.float16, device=DEVICE)
    module.spmm(packed, B, out)
    ref = A.to_dense() @ B.double().cpu().numpy()
    assert np.allclose(out.double().cpu().numpy(), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("expand", ["bits", "planes"])
def test_nm_packing_decodes_to_the_matrix(expand, tmp_path_factory):
    """The repacked slot-planar values + metadata words decode (numpy) back to exactly A's kept part:
    checks the layout the kernels read independently of any kernel."""
    module = load_candidate("nm_compressed", {"EXPAND": expand, "BLOCK_M": 16, "BLOCK_G": 16}, tmp_path_factory)
    from sparseditto.formats import NMCompressed

    A = MATRICES["24_wide"]()
    fmt = NMCompressed.from_matrix(A, n=2, m=4)
    nm = module.nm_arrays(A, 2, 4)   # the template's own O(nnz) path: must equal NMCompressed
    assert nm["residual"] is None and fmt.residual is None
    assert np.array_equal(nm["positions"], fmt.positions.reshape(A.shape[0], -1))
    assert np.array_equal(nm["values"], fmt.values.reshape(A.shape[0], -1).astype(np.float32))
    lay = module._layout(2, 4, expand)
    planar, words, steps, Mp = module._pack(nm, 16, 16, lay, expand)
    F, H = lay["F"], 16
    M, K = A.shape
    vals = planar.reshape(Mp, steps, 2, F, H)
    w = words.astype(np.int64).reshape(Mp, steps, 1, H)
    code = (w >> (np.arange(F).reshape(1, 1, F, 1) * lay["CB"])) & 0xF          # [Mp, steps, F, H]
    dense = np.zeros((Mp, steps, F, H, 4))
    for p in range(4):
        if expand == "bits":
            bit = (code >> p) & 1
            below = code & ((1 << p) - 1)
            is_slot0 = below == 0
            plane = np.where(bit == 1, np.where(is_slot0, vals[:, :, 0], vals[:, :, 1]), 0.0)
        else:
            plane = np.where((code & 3) == p, vals[:, :, 0], 0.0) + np.where((code >> 2) == p, vals[:, :, 1], 0.0)
        dense[..., p] = plane
    dense = dense.reshape(Mp, -1)[:M, :K]
    assert np.array_equal(dense, A.to_dense().astype(np.float32))


def test_bsr_auto_block_shape_and_group():
    """'auto' picks the true block shape of a block-sparse matrix (largest within 15% of the
    fewest stored elements) and a group that widens 16-column blocks to >= 64 columns."""
    spec = importlib.util.find_spec("sparseditto.kernel_templates.triton.bsr_tc")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    A = block_matrix(256, 256, 32, 64, 0.3, seed=20)
    assert module.choose_block_shape(A) == (32, 64)
    lengths = np.full(16, 12)
    assert module.choose_group(lengths, 16) == 4
    assert module.choose_group(np.array([1, 1, 1, 1]), 16) == 1   # padding would double the blocks


@pytest.mark.parametrize("name,params,message", [
    ("nm_compressed", {"NM": "4:8", "EXPAND": "bits"}, "specialized for 2:4"),
    ("bsr_tc", {"BM": 24}, "not one of"),
])
def test_bad_params_raise(name, params, message, tmp_path_factory):
    spec = importlib.util.find_spec(f"sparseditto.kernel_templates.triton.{name}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.PARAMS = dict(module.META["defaults"], **params)   # bypass the registry's own validation
    with pytest.raises(ValueError, match=message):
        module.prepare(MATRICES["24"](), torch.float16, DEVICE)


def test_spmm_rejects_mismatched_shapes(tmp_path_factory):
    module = load_candidate("bitmap_tiles", {"BLOCK_M": 16}, tmp_path_factory)
    A = MATRICES["u50"]()
    packed = module.prepare(A, torch.float16, DEVICE)
    B = torch.zeros(A.shape[1] + 1, 4, dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match=r"Expected B of shape \(90, N\)"):
        module.spmm(packed, B, torch.empty(A.shape[0], 4, dtype=torch.float16, device=DEVICE))


# ---- GPU (H100/H200): full-size correctness, including the PTX-only code paths ------------------

def _big(kind: str) -> SparseMatrix:
    if kind == "block":
        return block_matrix(4096, 4096, 32, 32, 0.1, seed=30)
    if kind == "24":
        return nm_matrix(4096, 4096, 2, 4, seed=31)
    return random_matrix(4096, 4096, 0.7, seed=32)


GPU_CASES = [
    ("bsr_tc", {}, "block", torch.float16),
    ("bsr_tc", {"BM": 16, "BK": 16}, "block", torch.float16),
    ("nm_compressed", {}, "24", torch.float16),                       # bits, PTX expand
    ("nm_compressed", {}, "24", torch.bfloat16),                      # bits, PTX expand, bf16 lanes
    ("nm_compressed", {"BITS_LOGIC": "triton"}, "24", torch.float16),
    ("nm_compressed", {"EXPAND": "planes"}, "24", torch.float16),
    ("nm_compressed", {"EXPAND": "select"}, "24", torch.float16),
    ("bitmap_tiles", {}, "unstructured", torch.float16),              # hardware popc
    ("bitmap_tiles", {"OFFSETS": "stored", "POPC": "swar"}, "unstructured", torch.float16),
    ("bitmap_tiles", {"GATHER": "direct"}, "unstructured", torch.bfloat16),
]


@pytest.mark.gpu
@pytest.mark.parametrize("n", [16, 2048])
@pytest.mark.parametrize("name,params,kind,dtype", GPU_CASES,
                         ids=[f"{c[0]}-{'-'.join(f'{k}={v}' for k, v in c[1].items()) or 'default'}-{str(c[3])[6:]}"
                              for c in GPU_CASES])
def test_gpu_4096(name, params, kind, dtype, n, tmp_path_factory):
    run_and_check(load_candidate(name, params, tmp_path_factory), _big(kind), n, dtype, device="cuda")


@pytest.mark.gpu
def test_gpu_nm_residual_and_odd_shapes(tmp_path_factory):
    """Violations spill to the residual CSR; odd M, K, N exercise the masked edges on the device."""
    module = load_candidate("nm_compressed", {}, tmp_path_factory)
    run_and_check(module, nm_matrix(1000, 1030, 2, 4, seed=33, violations=0.01), 7, torch.float16, device="cuda")


# ---- the compiled-kernel launch path (GPU only at run time; its Python side checked here) -------

def launch_through_compiled_kernel(module, packed, B, out, monkeypatch):
    """Run spmm's fast path through Triton's real CompiledKernel launcher code with the device
    parts stubbed: after the first (JIT) launch a plan keeps the CompiledKernel and later calls do
    `compiled[grid](*args)`. Returns what reached the low-level launcher, per launch."""
    import triton.compiler.compiler as tcc

    calls = []

    class _Active:
        @staticmethod
        def get_current_device():
            return 0

        @staticmethod
        def get_current_stream(device):
            return 1234

    class _Driver:
        active = _Active()

    def fake_compiled():
        ck = object.__new__(tcc.CompiledKernel)
        ck.module, ck.function, ck.packed_metadata, ck.name = object(), "fn", "meta", "k"
        ck._run = lambda *a: calls.append(a)
        return ck

    monkeypatch.setattr(tcc, "driver", _Driver())
    monkeypatch.setattr(tcc.knobs.runtime, "launch_enter_hook", None)
    plans = [p for v in packed["scratch"].values() for p in (v if isinstance(v, list) else [v])
             if isinstance(p, dict) and "compiled" in p]
    assert plans, "spmm cached no launch plan"
    for plan in plans:
        plan["compiled"] = fake_compiled()
    module.spmm(packed, B, out)
    assert len(calls) == len(plans)
    for plan, call in zip(plans, calls):
        grid, stream, fn, meta, _md, _enter, _exit, args = call[:3], call[3], call[4], call[5], call[6], call[7], \
            call[8], call[9:]
        assert grid == tuple(plan["grid"]) and len(grid) == 3 and all(isinstance(g, int) and g >= 1 for g in grid)
        assert (stream, fn, meta) == (1234, "fn", "meta")
        names = list(plan["kernel"].arg_names)
        assert len(args) == len(names), "every kernel parameter (constexprs included) is passed, in order"
        if plan["b_at"] is not None:
            assert args[names.index("b_ptr")] is B
        assert args[names.index("out_ptr")] is out
    return calls


@pytest.mark.parametrize("name,params,kind", [
    ("bsr_tc", {"SPLIT": 2}, "blk16"), ("nm_compressed", {"BLOCK_M": 16, "BLOCK_G": 16}, "24"),
    ("bitmap_tiles", {"BLOCK_M": 16, "SPLIT_K": 2}, "u50"),
    # the CSR-family Triton templates share the launch path
    ("csr_rowsplit", {"ROWS_PER_PROGRAM": 2}, "u70"), ("csr_balanced", {"NNZ_PER_PROGRAM": 64, "FIXUP": "launch"}, "u50"),
    ("compact_rows_cols", {"SPLIT_K": 2, "BLOCK_M": 16, "BLOCK_K": 16}, "u95")])
def test_compiled_launch_path(name, params, kind, tmp_path_factory, monkeypatch):
    """Every Triton template's cached-plan fast path, through Triton's real CompiledKernel runner
    (this is the path every GPU call after the first takes; a 2-D grid used to break it)."""
    module = load_candidate(name, params, tmp_path_factory)
    A = MATRICES[kind]()
    B = torch.randn(A.shape[1], 5, generator=torch.Generator().manual_seed(0)).to(torch.float16)
    packed = module.prepare(A, torch.float16, "cpu")
    out = torch.empty(A.shape[0], 5, dtype=torch.float16)
    module.spmm(packed, B, out)             # plans the launch (interpreter: JIT path)
    launch_through_compiled_kernel(module, packed, B, out, monkeypatch)
    # a different N (or layout of B) is a different plan, never the cached kernel of another
    B2 = torch.randn(A.shape[1], 9).to(torch.float16)
    module.spmm(packed, B2, torch.empty(A.shape[0], 9, dtype=torch.float16))
    assert len(packed["scratch"]) == 2


# ---- launch configuration rules (pure Python) ---------------------------------------------------

def _module(name):
    spec = importlib.util.find_spec(f"sparseditto.kernel_templates.triton.{name}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_nm_shared_memory_fits_at_large_n():
    """The H200 failure this guards against: N = 2048 with 3 stages of 128-column B tiles asked
    for 233472 B of shared memory (limit 232448). The estimate reproduces the sm_90 compiles
    (61440 B at N = 16; 149504 / 167936 B at 2 stages for BLOCK_M 64 / 128) and the chosen
    depth (and, when "auto", BLOCK_N) keeps every N under the limit."""
    module = _module("nm_compressed")
    packed = module.prepare(nm_matrix(256, 256, 2, 4, seed=40), torch.float16, "cpu")
    assert module.smem_estimate(packed, 64, 16, 3) == 61440
    assert module.smem_estimate(packed, 64, 128, 3) == 233472
    assert module.smem_estimate(packed, 64, 128, 2) == 149504
    assert module.smem_estimate(packed, 128, 128, 2) == 167936
    for n in (1, 16, 33, 256, 2048, 8192):
        cfg = module.launch_config(packed, n)
        assert cfg["smem_estimate"] <= module._SMEM_LIMIT - module._SMEM_MARGIN, (n, cfg)
    small, large = module.launch_config(packed, 16), module.launch_config(packed, 2048)
    assert (small["BLOCK_M"], small["num_stages"], small["num_warps"]) == (64, 3, 4)
    assert (large["BLOCK_M"], large["BLOCK_N"], large["num_stages"], large["num_warps"]) == (128, 128, 2, 8)
    module.PARAMS = dict(module.META["defaults"], num_stages=4)     # an explicit depth is lowered too
    assert module.launch_config(packed, 2048)["num_stages"] == 2


def test_triton_pipelines_fit_the_devices_shared_memory():
    """The Triton templates size their pipelines to the device's opt-in shared memory per block
    (kernel_templates.runtime.smem_per_block), not the H200's 227 KB: on an Ada card (99 KB) or an
    A100 (163 KB) a deeper pipeline fails to launch. H200 configurations are unchanged."""
    from sparseditto.kernel_templates import runtime as rt

    assert rt.smem_optin_for((9, 0)) == 232448 == rt.DEFAULT_SMEM_PER_BLOCK
    assert (rt.smem_optin_for((8, 0)), rt.smem_optin_for((8, 9)), rt.smem_optin_for((8, 6))) == (166912, 101376, 101376)
    assert rt.smem_optin_for((8, 8)) == 101376 and rt.smem_optin_for((7, 5)) == 49152   # unlisted: the major's least
    assert rt.smem_per_block(torch.device("cpu")) == rt.DEFAULT_SMEM_PER_BLOCK
    assert rt.stage_budget(160 * 1024, 232448) == 160 * 1024 and rt.stage_budget(160 * 1024, 101376) == 84992
    nm = _module("nm_compressed")
    packed = nm.prepare(nm_matrix(256, 256, 2, 4, seed=40), torch.float16, "cpu")
    for limit in (232448, 166912, 101376):
        for n in (16, 256, 2048):
            cfg = nm.launch_config(packed, n, smem_limit=limit)
            assert cfg["smem_estimate"] <= limit - nm._SMEM_MARGIN, (limit, n, cfg)
    assert nm.launch_config(packed, 2048, smem_limit=232448) == nm.launch_config(packed, 2048)
    assert nm.launch_config(packed, 2048, smem_limit=101376)["BLOCK_N"] < nm.launch_config(packed, 2048)["BLOCK_N"]
    bitmap = _module("bitmap_tiles")
    packed = bitmap.prepare(MATRICES["u70"](), torch.float16, "cpu")
    for limit in (232448, 101376):
        cfg = bitmap.launch_config(packed, 2048, smem_limit=limit)
        assert bitmap.smem_estimate(packed, cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["num_stages"]) <= limit - 16 * 1024
    crc = _module("compact_rows_cols")
    rows = crc.prepare(MATRICES["u95"](), torch.float16, "cpu")
    # N = 2048: 128x128x64 fp16 steps of 32 KB; 3 stages (96 KB) fit the H200's budget, not an Ada card's 83 KB
    assert [crc.launch_config(rows, n)["num_stages"] for n in (16, 2048)] == [4, 3]
    assert [crc.launch_config(rows, n, smem_limit=101376)["num_stages"] for n in (16, 2048)] == [4, 2]


def test_bitmap_block_m_per_n_and_shared_memory():
    module = _module("bitmap_tiles")
    packed = module.prepare(MATRICES["u70"](), torch.float16, "cpu")
    assert packed["pad_m"] == 64
    assert module.launch_config(packed, 16)["BLOCK_M"] == 64 and module.launch_config(packed, 256)["BLOCK_M"] == 32
    for n in (16, 2048, 8192):
        cfg = module.launch_config(packed, n)
        assert module.smem_estimate(packed, cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["num_stages"]) <= \
            module._SMEM_LIMIT - module._SMEM_MARGIN


def test_bsr_slot_order_storage_and_auto_rules():
    """Groups are stored in launch order (longest block row first), so a slot's extent needs no
    block-row lookup; ORDER="natural" stores rows in order. The split only kicks in when fewer
    than half the SMs would have a tile; N >= 256 uses 256-column tiles and 8 warps."""
    module = _module("bsr_tc")
    A = MATRICES["blk_skew"]()
    packed = module.prepare(A, torch.float16, "cpu")
    order = packed["order"].numpy()
    sptr = packed["gptr"].numpy()
    counts = np.diff(sptr)
    assert (np.diff(counts) <= 0).all(), "slots are not longest first"
    bm, bk = packed["block_shape"]
    group = packed["group"]
    dense = A.to_dense()
    blocks = packed["blocks"].float().numpy()
    gidx = packed["gidx"].numpy().reshape(-1, group)
    for slot in range(order.size):   # every stored group is the right block of the slot's row
        brow = order[slot]
        for g in range(sptr[slot], sptr[slot + 1]):
            for j in range(group):
                col = gidx[g, j]
                tile = blocks[g][:, j * bk:(j + 1) * bk]
                if col < 0:
                    assert not tile.any()
                else:
                    want = np.zeros((bm, bk))
                    part = dense[brow * bm:(brow + 1) * bm, col * bk:(col + 1) * bk]
                    want[:part.shape[0], :part.shape[1]] = part
                    assert np.allclose(tile, want, atol=1e-2, rtol=1e-2)
    big = {"block_shape": (32, 32), "block_rows": 128, "group": 2, "max_row_groups": 8, "dtype": torch.float16}
    assert module.launch_config(big, 16)["SPLIT"] == 1                       # 128 tiles on 132 SMs
    assert module.launch_config({**big, "block_rows": 32}, 16)["SPLIT"] > 1   # 32 tiles: split
    wide = module.launch_config(big, 2048)
    assert (wide["BLOCK_N"], wide["num_warps"], wide["num_stages"]) == (256, 8, 3)
