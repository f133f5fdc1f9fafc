"""runtime.DirectLaunch: a planned CUDA C++ kernel launched through cuLaunchKernel with its argument
block built once (SPARSEDITTO_DIRECT_LAUNCH=1; off by default until measured on the H200).

On the CPU the argument block is checked through a stand-in for cuLaunchKernel that reads every
parameter back through its pointer; on a GPU every CUDA C++ family must give the same bits both ways,
eager and inside a CUDA graph."""
from __future__ import annotations

import ctypes
import types

import numpy as np
import pytest
import torch

from sparseditto.kernel_templates import runtime


def _fake_launch(calls, rc=0):
    def launch(func, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        calls.append({"func": func.value, "dims": (gx, gy, gz, bx, by, bz), "smem": smem, "stream": stream,
                      "params": params, "extra": extra})
        return rc
    return launch


def _read(params, i, ctype):
    return ctypes.cast(params[i], ctypes.POINTER(ctype)).contents.value


def test_the_argument_block_holds_each_scalar_at_its_width_and_the_pointer_slots_change(monkeypatch):
    calls = []
    monkeypatch.setattr(runtime, "_cu_launch_kernel", lambda: _fake_launch(calls))
    fn = types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=0x1234))
    args = (np.uint64(7), None, None, np.int32(-3), np.int64(1 << 40), np.float32(1.5), np.uint32(9))
    launch = runtime.DirectLaunch(fn, (5, 2), (256,), 1024, args, (1, 2))
    launch(99, 0xAAA0, 0xBBB0)
    launch(98, 0xCCC0, 0xDDD0)
    first, second = calls
    assert first["func"] == 0x1234 and first["dims"] == (5, 2, 1, 256, 1, 1) and first["smem"] == 1024
    assert (first["stream"], second["stream"]) == (99, 98) and first["extra"] is None
    p = second["params"]
    assert len(p) == len(args)
    assert _read(p, 0, ctypes.c_uint64) == 7 and _read(p, 3, ctypes.c_int32) == -3
    assert _read(p, 4, ctypes.c_int64) == 1 << 40 and _read(p, 5, ctypes.c_float) == 1.5
    assert _read(p, 6, ctypes.c_uint32) == 9
    assert (_read(p, 1, ctypes.c_uint64), _read(p, 2, ctypes.c_uint64)) == (0xCCC0, 0xDDD0)   # the last call's


def test_what_direct_launch_refuses_and_a_driver_error(monkeypatch):
    calls = []
    monkeypatch.setattr(runtime, "_cu_launch_kernel", lambda: _fake_launch(calls, rc=700))
    fn = types.SimpleNamespace(ptr=0x10)                      # a Function itself (no .kernel)
    with pytest.raises(ValueError, match="fixed-width numpy scalars"):
        runtime.DirectLaunch(fn, (1,), (32,), 0, (np.uint64(1), 5), ())          # a Python int
    with pytest.raises(ValueError, match="fixed-width numpy scalars"):
        runtime.DirectLaunch(fn, (1,), (32,), 0, (np.zeros(16, dtype=np.uint8),), ())   # a tensor map block
    with pytest.raises(ValueError, match="CUfunction"):
        runtime.DirectLaunch(types.SimpleNamespace(), (1,), (32,), 0, (), ())
    launch = runtime.DirectLaunch(fn, (1,), (32,), 0, (None,), (0,))
    with pytest.raises(RuntimeError, match="error 700"):
        launch(0, 0x100)
    assert len(calls) == 1


def test_direct_launch_is_off_unless_asked(monkeypatch):
    monkeypatch.delenv("SPARSEDITTO_DIRECT_LAUNCH", raising=False)
    assert not runtime.direct_launch_enabled()
    monkeypatch.setenv("SPARSEDITTO_DIRECT_LAUNCH", "1")
    assert runtime.direct_launch_enabled()


FAMILIES = [("delta_spmv", {}, 0.7, 1), ("csr_vector", {}, 0.9, 8), ("tc_words", {}, 0.7, 16),
            ("tc_sp24", {}, "2:4", 16), ("csr_rowdecomp", {}, 0.95, 32)]


@pytest.mark.gpu
@pytest.mark.parametrize("template,params,sparsity,n", FAMILIES)
def test_gpu_direct_launch_gives_cupys_bits_eager_and_in_a_graph(template, params, sparsity, n, monkeypatch):
    from sparseditto import generate
    from sparseditto.harness.source_loader import load_module
    from sparseditto.kernel_templates.registry import get_template

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    monkeypatch.setenv("SPARSEDITTO_DIRECT_LAUNCH", "1")
    if sparsity == "2:4":
        A = generate.nm_sparse(1100, 4160, 2, 4, seed=1, dtype="float16")
    else:
        A = generate.magnitude_pruned(1100, 4160, sparsity, seed=1, dtype="float16")
    mod = load_module(get_template(template).instantiate(params).source)
    packed = mod.prepare(A, torch.float16, torch.device("cuda"))
    B = torch.randn(A.shape[1], n, device="cuda", dtype=torch.float16)
    first = torch.full((A.shape[0], n), float("nan"), device="cuda", dtype=torch.float16)
    mod.spmm(packed, B, first)                       # CuPy's launch; the plan gets its DirectLaunch
    plans = [v for v in packed["scratch"].values() if isinstance(v, dict) and "direct" in v]
    assert plans and all(p["direct"] for p in plans), "no direct launch was built"
    again = torch.full_like(first, float("nan"))
    mod.spmm(packed, B, again)                       # cuLaunchKernel
    torch.cuda.synchronize()
    assert torch.equal(first, again)
    graph_out = torch.full_like(first, float("nan"))
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        mod.spmm(packed, B, graph_out)
    torch.cuda.current_stream().wait_stream(side)
    graph_out.fill_(float("nan"))
    with torch.cuda.graph(g):
        mod.spmm(packed, B, graph_out)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(first, graph_out)
