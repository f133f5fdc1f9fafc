"""patch_model's eager routing: each patched layer times its kernel and dense F.linear once per
(N, dtype, device) on a GPU and runs the cheaper eagerly (sparseditto.batch.eager_cost); CUDA-graph
capture and torch.compile keep the kernel. CPU: the cost arithmetic with injected clocks, the host
clock on real calls, the measurement's bookkeeping and the forward's routing; GPU: the whole path."""
from __future__ import annotations

import textwrap
import warnings

import pytest
import torch

from sparseditto.batch import eager_cost
from sparseditto.batch.patch import _KERNELS, PatchedLinear, _forward, patch_model

# a correct kernel written with torch ops: the routing is under test here, not a template
MATMUL = textwrap.dedent('''
    import torch

    def prepare(A, dtype, device):
        return {"a": A.to_torch(dtype=dtype, device=device)}

    def spmm(packed, B, out):
        out.copy_(packed["a"] @ B)
''')


def pruned_linear(device="cpu", out_features=48, in_features=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(out_features, in_features, generator=gen)
    w[torch.rand(out_features, in_features, generator=gen) < 0.7] = 0.0
    linear = torch.nn.Linear(in_features, out_features, bias=True).half()
    with torch.no_grad():
        linear.weight.copy_(w.half())
        linear.bias.copy_(torch.randn(out_features, generator=gen).half())
    return linear.to(device)


def layer_state(linear, ns=(1, 8), eager="measure", key="test:eager"):
    from sparseditto.api import SpMMKernel
    from sparseditto.io import load_matrix

    W = linear.weight.detach()
    kernel = SpMMKernel(load_matrix(W.cpu(), name="w"), MATMUL, "matmul", verified_ns=list(ns),
                        verified_dtype="float16", verify_new_n=False, backend="auto")
    state = PatchedLinear(name="w", kernel=kernel, verified_ns=frozenset(ns), verified_dtype="float16",
                          out_features=W.shape[0], eager=eager)
    _KERNELS[key] = state
    return state, _forward(linear, key)


def test_measure_alternates_the_paths_keeps_each_ones_lowest_and_paces_by_the_slower_side():
    order = []
    host = {"kernel": iter([30.0, 28.0]), "dense": iter([9.0, 11.0])}
    gpu = {"kernel": iter([12.0, 13.0]), "dense": iter([20.0, 19.0])}
    paths = {"kernel": lambda: "kernel", "dense": lambda: "dense"}

    def host_clock(call):
        order.append(call())
        return next(host[call()])

    costs = eager_cost.measure(paths, host=host_clock, gpu=lambda call: next(gpu[call()]))
    assert order == ["kernel", "dense", "kernel", "dense"]
    assert costs["kernel"] == eager_cost.CallCost(host_us=28.0, gpu_us=12.0)
    assert costs["dense"] == eager_cost.CallCost(host_us=9.0, gpu_us=19.0)
    # host-bound kernel (28 us to issue a 12 us kernel) against GPU-bound dense (19 us): dense is cheaper
    assert costs["kernel"].per_call_us == 28.0 and costs["dense"].per_call_us == 19.0
    assert costs["dense"].as_dict() == {"host_us": 9.0, "gpu_us": 19.0, "per_call_us": 19.0}


def test_measure_refuses_nothing_to_time_and_no_rounds():
    with pytest.raises(ValueError, match="at least one path"):
        eager_cost.measure({}, host=lambda c: 1.0, gpu=lambda c: 1.0)
    with pytest.raises(ValueError, match="rounds >= 1"):
        eager_cost.measure({"k": lambda: None}, rounds=0, host=lambda c: 1.0, gpu=lambda c: 1.0)


def test_host_clock_issues_the_calls_between_two_drains():
    events = []
    per_call = eager_cost.host_us(lambda: events.append("call"), lambda: events.append("sync"), calls=5)
    assert events == ["sync"] + ["call"] * 5 + ["sync"] and per_call > 0.0


def test_a_measurement_times_both_real_paths_and_records_the_cheaper(monkeypatch):
    """`_measure_eager` hands measure() the layer's real kernel call (bias added) and F.linear: both
    give the dense product; the figures and the path are kept per (dtype, N, device)."""
    linear = pruned_linear()
    state, _ = layer_state(linear)
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1)).half()
    expected = torch.nn.functional.linear(x.float(), linear.weight.float(), linear.bias.float())
    seen = {}

    def fake_measure(paths, device):
        assert device == x.device
        for name, call in paths.items():
            seen[name] = call()
        return {"kernel": eager_cost.CallCost(host_us=31.0, gpu_us=9.0),
                "dense": eager_cost.CallCost(host_us=8.0, gpu_us=17.0)}

    monkeypatch.setattr(eager_cost, "measure", fake_measure)
    key = (torch.float16, 8, x.device)
    with torch.no_grad():
        assert state._measure_eager(key, x, linear) == "dense"
    for name in ("kernel", "dense"):
        assert torch.allclose(seen[name].float(), expected, atol=2e-2, rtol=2e-2), name
    assert state.eager_costs[key] == {"kernel": {"host_us": 31.0, "gpu_us": 9.0, "per_call_us": 31.0},
                                      "dense": {"host_us": 8.0, "gpu_us": 17.0, "per_call_us": 17.0},
                                      "path": "dense"}
    assert state.calls == 0, "the measurement's own calls are not the forward's"
    del _KERNELS["test:eager"]


def test_forward_runs_dense_where_the_eager_measurement_chose_it_and_the_kernel_elsewhere(monkeypatch):
    linear = pruned_linear()
    state, forward = layer_state(linear)
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(2)).half()
    chosen = {8: "dense", 1: "kernel"}
    monkeypatch.setattr(PatchedLinear, "eager_path", lambda self, x, module: chosen[x.shape[0]])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")          # a measured choice warns nobody
        y8, y1 = forward(x), forward(x[:1])
    assert state.dense_by_measure == 1 and state.calls == 1 and state.fallbacks == 0
    with torch.no_grad():
        assert torch.equal(y8, linear(x))
        ref = torch.nn.functional.linear(x[:1].float(), linear.weight.float(), linear.bias.float())
    assert torch.allclose(y1.float(), ref, atol=2e-2, rtol=2e-2)
    del _KERNELS["test:eager"]


def test_off_the_gpu_and_with_eager_kernel_nothing_is_measured(monkeypatch):
    monkeypatch.setattr(eager_cost, "measure", lambda paths, device: pytest.fail("measured off the GPU"))
    linear = pruned_linear()
    for mode in ("measure", "kernel"):
        state, forward = layer_state(linear, eager=mode)
        with torch.no_grad():
            forward(torch.randn(8, 64).half())
        assert state.calls == 1 and state.dense_by_measure == 0 and not state.eager_costs
    del _KERNELS["test:eager"]


def test_patch_model_refuses_an_unknown_eager_mode():
    with pytest.raises(ValueError, match="eager must be one of"):
        patch_model(torch.nn.Sequential(torch.nn.Linear(4, 4)), "no-bundle", eager="sometimes")


@pytest.mark.gpu
def test_gpu_eager_measurement_picks_the_cheaper_path_and_capture_runs_the_kernel():
    linear = pruned_linear("cuda", out_features=1024, in_features=512)
    state, forward = layer_state(linear, ns=(1, 8))
    x = torch.randn(8, 512, device="cuda").half()
    with torch.no_grad():
        ref = torch.nn.functional.linear(x, linear.weight, linear.bias)
        y = forward(x)
        y_again = forward(x)
    key = (torch.float16, 8, x.device)
    costs = state.eager_costs[key]
    for name in ("kernel", "dense"):
        assert costs[name]["host_us"] > 0 and costs[name]["gpu_us"] > 0, costs
    cheaper = min(("kernel", "dense"), key=lambda n: (costs[n]["per_call_us"], n != "kernel"))
    assert costs["path"] == cheaper == state.eager_paths[key]
    assert (state.calls, state.dense_by_measure) == ((2, 0) if cheaper == "kernel" else (0, 2))
    for out in (y, y_again):
        assert torch.allclose(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
    # inside a CUDA graph the kernel runs whatever eager measured
    calls = state.calls
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        y_graph = forward(x)
    graph.replay()
    torch.cuda.synchronize()
    assert state.calls == calls + 1 and torch.allclose(y_graph.float(), ref.float(), atol=2e-2, rtol=2e-2)
    del _KERNELS["test:eager"]
