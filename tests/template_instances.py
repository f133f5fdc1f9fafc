"""Load template instances in-process for the kernel tests (shared by the CSR and tensor-core tests).

Triton's JIT needs real source files, so an instance's source is written to a temporary file and
imported under a name derived from its hash; modules are cached per source hash so a parameter set
compiles once per session.
"""
from __future__ import annotations

import importlib.util
import sys

from sparseditto.kernel_templates.registry import get_template

_LOADED: dict[str, object] = {}


def load_candidate(name: str, params: dict, tmp_path_factory):
    """Instantiate (the registry rewrites PARAMS), write and import a template instance, cached."""
    cand = get_template(name).instantiate(params)
    if cand.source_hash not in _LOADED:
        path = tmp_path_factory.mktemp("cand") / f"cand_{cand.source_hash[:16]}.py"
        path.write_text(cand.source)
        modname = f"sparseditto_test_cand_{cand.source_hash[:16]}"
        spec = importlib.util.spec_from_file_location(modname, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[modname] = module
        spec.loader.exec_module(module)
        _LOADED[cand.source_hash] = module
    return _LOADED[cand.source_hash]


def assert_inlines_header_then_kernel(name: str) -> None:
    """A CUDA C++ template's candidate: dtypes.cuh inlined ahead of its own .cu file (no placeholder
    left), and the source passes the static checks a generated kernel must pass."""
    from sparseditto.harness.static_checks import check_source
    from sparseditto.kernel_templates.registry import TEMPLATE_ROOT

    cand = get_template(name).instantiate({})
    header = (TEMPLATE_ROOT / "cuda" / "dtypes.cuh").read_text().strip("\n")
    kernel = (TEMPLATE_ROOT / "cuda" / f"{name}.cu").read_text().strip("\n")
    assert cand.source.index(header) < cand.source.index(kernel)
    assert 'CUDA_SRC = r"""@SPARSEDITTO_INLINE' not in cand.source
    result = check_source(cand.source)
    assert result.ok, result.violations


def assert_refuses_cpu_and_misshapen_operands(module, packed, dtype=None) -> None:
    """A CUDA C++ template's spmm on CPU tensors names the CUDA device; a B whose row count is not A's
    column count names the shape."""
    import pytest
    import torch

    m, k = packed["shape"]
    kw = {} if dtype is None else {"dtype": dtype}
    with pytest.raises(ValueError, match="CUDA device"):
        module.spmm(packed, torch.zeros(k, 2, **kw), torch.zeros(m, 2, **kw))
    with pytest.raises(ValueError, match="shape"):
        module.spmm(packed, torch.zeros(k + 1, 2, **kw), torch.zeros(m, 2, **kw))


# The start of a script run in a fresh interpreter (`python -I -c SCRIPT kernel.py ...`) on an exported
# kernel module: importing SparseDitto or scipy fails loudly, then the module is loaded as `kernel`.
CHILD_LOADS_EXPORT = r'''
import importlib.abc, importlib.util, json, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("sparseditto", "scipy", "kernel_templates"):
            raise ImportError(f"the exported kernel imported {name}")
sys.meta_path.insert(0, Refuse())
import numpy as np, torch
spec = importlib.util.spec_from_file_location("kernel", sys.argv[1])
kernel = sys.modules["kernel"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kernel)
'''


def compile_every_instantiation(name: str, tmp_path) -> tuple[list[str], list[int], str]:
    """A CUDA C++ template's candidate CUDA_SRC through nvcc for sm_90 with every instantiation
    (SPARSEDITTO_INSTANTIATE_ALL): (the kernels ptxas compiled, their spill-store bytes, the PTX).
    The caller skips when nvcc is not on PATH."""
    import re
    import subprocess

    from sparseditto.harness.source_loader import cuda_sources

    src = tmp_path / f"{name}.cu"
    src.write_text(cuda_sources(get_template(name).instantiate({}).source)["CUDA_SRC"])
    proc = subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "-DSPARSEDITTO_INSTANTIATE_ALL", "-cubin",
                           "-Xptxas", "-v", "-keep", "-keep-dir", str(tmp_path), str(src),
                           "-o", str(tmp_path / f"{name}.cubin")], capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    entries = re.findall(r"Compiling entry function '(\w+)'", proc.stderr)
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", proc.stderr)]
    return entries, spills, "".join(p.read_text() for p in tmp_path.glob("*.ptx"))
