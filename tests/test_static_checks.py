"""AST static checks: every cheat is refused with a precise reason, honest kernels are not."""
from pathlib import Path

import pytest

from sparseditto.harness import check_source

CANDIDATES = Path(__file__).parent / "candidates"
ROOT = Path(__file__).resolve().parents[1]

GOOD = """
import math
import numpy as np
import torch
import triton
import triton.language as tl
from functools import lru_cache
from sparseditto.formats import CSR

META = {"name": "x"}
PARAMS = dict(META)
PARAMS["BLOCK"] = 32

@triton.jit
def _k(a_ptr, b_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    a = tl.load(a_ptr + offs[:, None] * BLOCK + offs[None, :])
    b = tl.load(b_ptr + offs[:, None] * BLOCK + offs[None, :])
    tl.store(out_ptr + offs[:, None] * BLOCK + offs[None, :], tl.dot(a, b))

@lru_cache(maxsize=None)
def _setup():
    return math.sqrt(2.0)

def prepare(A, dtype, device=torch.device("cpu")):
    t = CSR.from_matrix(A).to_torch(device=device, dtype=dtype)
    t["scale"] = _setup()
    return t

def spmm(packed, B, out):
    cache = {}
    cache["x"] = 1
    out.zero_()
"""


def violations(src: str) -> list[str]:
    result = check_source(src)
    assert result.ok == (not result.violations)
    return result.violations


def test_an_honest_kernel_passes():
    assert violations(GOOD) == []


@pytest.mark.parametrize("name", ["good_triton_csr.py", "good_torch_scatter.py"])
def test_good_test_candidates_pass(name):
    assert violations((CANDIDATES / name).read_text()) == []


def test_template_files_pass_static_checks():
    files = sorted(p for p in (ROOT / "kernel_templates").glob("*/*.py") if not p.name.startswith("_"))
    if not files:
        pytest.skip("no kernel templates in this checkout yet")
    for path in files:
        assert violations(path.read_text()) == [], path.name


def test_registry_instances_pass_static_checks():
    registry = pytest.importorskip("sparseditto.kernel_templates.registry")
    names = [getattr(t, "name", t) for t in registry.list_templates()]
    assert names
    for name in names:
        cand = registry.get_template(name).instantiate({})
        if cand.backend == "builtin":  # the dense floor runs inside the harness, it has no source
            continue
        assert violations(cand.source) == [], name


# candidate file -> a fragment the violation must contain
REJECTED_FILES = {
    "cheat_torch_mm.py": "'torch.mm' is a vendor matmul path",
    "cheat_matmul_operator.py": "'@' operator",
    "cheat_linear.py": "torch.nn",
    "cheat_torch_sparse.py": "to_sparse_csr",
    "cheat_cached_output.py": "module-level '_CACHE'",
    "cheat_side_stream.py": "torch.cuda.Stream",
    "cheat_reads_file.py": "'open' is not allowed",
    "cheat_subprocess.py": "import of 'subprocess'",
    "cheat_eval.py": "'eval' is not allowed",
    "cheat_getattr_matmul.py": "getattr with a computed attribute name",
    "cheat_dunder_import.py": "'__import__'",
    "broken_os_exit.py": "import of 'os'",
    "broken_segfault_ctypes.py": "import of 'ctypes'",
}


@pytest.mark.parametrize("name,fragment", sorted(REJECTED_FILES.items()))
def test_cheating_candidates_are_rejected(name, fragment):
    found = violations((CANDIDATES / name).read_text())
    assert any(fragment in v for v in found), found


def test_syntax_error_is_reported_as_such():
    result = check_source((CANDIDATES / "broken_syntax.py").read_text())
    assert not result.ok and result.syntax_error and "line 4" in result.syntax_error


BASE = "import torch\nimport triton.language as tl\nimport numpy as np\n\ndef prepare(A, dtype, device):\n    return {}\n\n"


@pytest.mark.parametrize("body,fragment", [
    ("def spmm(packed, B, out):\n    import torch as t\n    out.copy_(t.matmul(packed['a'], B))\n", "matmul"),
    ("from torch import mm as f\ndef spmm(packed, B, out):\n    out.copy_(f(packed['a'], B))\n", "torch.mm"),
    ("def spmm(packed, B, out):\n    out.copy_(B.T.matmul(packed['a']))\n", "matmul"),
    ("def spmm(packed, B, out):\n    out.copy_(packed['a'].__matmul__(B))\n", "__matmul__"),
    ("def spmm(packed, B, out):\n    out.copy_(torch.ops.aten.mm(packed['a'], B))\n", "torch.ops"),
    ("def spmm(packed, B, out):\n    out.copy_(torch._C._nn.linear(B, packed['a']))\n", "_C"),
    ("def spmm(packed, B, out):\n    out.copy_(torch.einsum('ik,kn->in', packed['a'], B))\n", "einsum"),
    ("def spmm(packed, B, out):\n    out.copy_(torch.from_numpy(np.dot(packed['a'], B.numpy())))\n", "dot"),
    ("def spmm(packed, B, out):\n    x = B\n    x @= B\n", "'@='"),
    ("def spmm(packed, B, out):\n    torch.os.system('ls')\n", "'os' module"),
    ("def spmm(packed, B, out):\n    torch.save(B, 'b.pt')\n", "torch.save"),
    ("def spmm(packed, B, out):\n    out.copy_(torch.load('ref.pt'))\n", "torch.load"),
    ("def spmm(packed, B, out):\n    out.copy_(torch.from_numpy(np.load('ref.npy')))\n", "numpy.load"),
    ("def spmm(packed, B, out):\n    B.numpy().tofile('b.bin')\n", "file I/O"),
    ("def spmm(packed, B, out):\n    t = torch\n", "used as a value"),
    ("def spmm(packed, B, out):\n    c = torch.cuda\n    c.synchronize()\n", "used as a value"),
    ("def spmm(packed, B, out):\n    f = globals()\n", "globals"),
    ("def spmm(packed, B, out):\n    setattr(out, 'x', 1)\n", "setattr"),
    ("def spmm(packed, B, out):\n    g = getattr\n", "getattr may only be called directly"),
    ("def spmm(packed, B, out):\n    out.__class__\n", "__class__"),
    ("def spmm(packed, B, out):\n    e = torch.cuda.Event(enable_timing=True)\n", "Event"),
    ("def spmm(packed, B, out):\n    g = torch.cuda.CUDAGraph()\n", "CUDAGraph"),
    ("def spmm(packed, B, out):\n    torch.backends.cuda.matmul.allow_tf32 = True\n", "torch.backends"),
    ("def spmm(packed, B, out):\n    torch.set_float32_matmul_precision('medium')\n", "global torch state"),
    ("def spmm(packed, B, out):\n    torch.matmul = None\n", "monkeypatches"),
    ("_STATE = []\ndef spmm(packed, B, out):\n    _STATE.append(out.clone())\n", "mutates module-level '_STATE'"),
    ("_BUF = torch.zeros(4)\ndef spmm(packed, B, out):\n    _BUF.copy_(out[0, :4])\n", "mutates module-level '_BUF'"),
    ("def spmm(packed, B, out):\n    spmm.last = out.clone()\n", "module-level 'spmm'"),
    ("def spmm(packed, B, out, _memo={}):\n    out.zero_()\n", "mutable default"),
    ("import functools\n@functools.lru_cache(maxsize=8)\ndef _run(key):\n    return key\ndef spmm(packed, B, out):\n    out.zero_()\n",
     "caches results between calls"),
    ("_N = 0\ndef spmm(packed, B, out):\n    global _N\n    _N += 1\n", "'global _N'"),
    ("class _Holder:\n    def put(self, x):\n        self.x = x\n_H = _Holder()\ndef spmm(packed, B, out):\n    _H.put(out)\n",
     "stores state on the instance"),
    ("from .helpers import thing\ndef spmm(packed, B, out):\n    out.zero_()\n", "relative import"),
    ("from torch import *\ndef spmm(packed, B, out):\n    out.zero_()\n", "wildcard import"),
    ("import sparseditto.formats\ndef spmm(packed, B, out):\n    sparseditto.matrix.SparseMatrix\n", "sparseditto.formats and"),
    ("CUDA_SRC = '#include \"/etc/passwd\"\\n__global__ void k() {}'\ndef spmm(packed, B, out):\n    out.zero_()\n",
     "reads a local file"),
    ("import cupy\ndef spmm(packed, B, out):\n    s = cupy.cuda.Stream()\n", "cupy.cuda.Stream"),
    ("import cupy\ndef spmm(packed, B, out):\n    cupy.cuda.runtime.memcpy(0, 0, 0, 0)\n", "cupy.cuda.runtime"),
    ("import cupy\ndef spmm(packed, B, out):\n    m = cupy.RawModule(path='k.cubin')\n", "loads code from a file"),
    ("def spmm(packed, B, out):\n    out.copy_(torch.compile(lambda x: x)(B))\n", "torch.compile"),
    ("def spmm(packed, B, out):\n    x = torch.sparse_csr_tensor\n", "sparse_csr_tensor"),
    ("def _make():\n    store = {}\n    def f(k, v):\n        store[k] = v\n    return f\n_F = _make()\n"
     "def spmm(packed, B, out):\n    _F(1, out)\n", "closure created by '_make'"),
    ("def _gen():\n    last = None\n    while True:\n        last = yield last\n_G = _gen()\n"
     "def spmm(packed, B, out):\n    _G.send(out)\n", "generator '_gen'"),
    ("import functools\ndef _impl(cache, B, out):\n    cache[0] = out\n_P = functools.partial(_impl, {})\n"
     "def spmm(packed, B, out):\n    _P(B, out)\n", "bound into a function at import time"),
])
def test_bypass_attempts_are_rejected(body, fragment):
    found = violations(BASE + body)
    assert any(fragment in v for v in found), found


def test_triton_dot_and_load_are_allowed_but_other_dots_are_not():
    src = BASE + ("@torch.no_grad()\ndef spmm(packed, B, out):\n    a = tl.dot\n    b = tl.load\n"
                  "    out.zero_()\n")
    assert violations(src) == []
    assert violations(BASE + "def spmm(packed, B, out):\n    out.copy_(torch.dot(B[0], B[1]))\n")


def test_cupy_external_stream_on_torch_stream_is_allowed():
    src = BASE.replace("import numpy as np", "import numpy as np\nimport cupy as cp") + (
        "def spmm(packed, B, out):\n"
        "    if cp is None:\n        return\n"
        "    with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):\n"
        "        packed['k']((1,), (32,), (out.data_ptr(),))\n")
    assert violations(src) == []
    other = src.replace("torch.cuda.current_stream().cuda_stream", "12345")
    assert any("ExternalStream" in v for v in violations(other))


def test_local_state_and_closures_are_not_flagged():
    src = BASE + ("def spmm(packed, B, out):\n    acc = {}\n    acc['a'] = B\n    rows = []\n"
                  "    rows.append(1)\n    def inner():\n        acc['b'] = 2\n    inner()\n"
                  "    tmp = torch.zeros(3)\n    tmp.add_(1)\n    out.zero_()\n")
    assert violations(src) == []


def test_missing_entry_points_and_wrong_arity():
    assert any("missing module-level function spmm" in v for v in violations("def prepare(A, dtype, device):\n    return {}\n"))
    assert any("missing module-level function prepare" in v for v in violations("def spmm(p, B, out):\n    pass\n"))
    found = violations("def prepare(A, dtype, device):\n    return {}\ndef spmm(packed, B):\n    pass\n")
    assert any("spmm must accept" in v for v in found)


def test_non_string_source_is_a_value_error():
    with pytest.raises(ValueError, match="Expected candidate source text"):
        check_source(b"def spmm(): pass")
