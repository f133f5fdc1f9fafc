"""Host cost of one eager decode-kernel call, piece by piece (issue 12: patched layers run 2x slower
than dense in eager mode on the H200 while they are 1.4-1.8x faster inside a CUDA graph).

Each loop launches the same thing back to back ITERS times from Python and reports wall time per
call after a final synchronize. When the host side is slower than the kernel (decode sizes: the
kernels take 9-18 us), that time is the host cost: what an eager model pays per layer. The pieces,
outermost first: torch's F.linear (what an unpatched layer pays); the template's spmm on a
transposed x (what patch_model passes at N > 1: a column-strided B and out, copied to unit-stride
stand-ins); spmm on contiguous operands; tc_launch.launch's operand checks, stream lookup and CuPy
launch; the bare CuPy launch inside its device/stream contexts; and a cProfile of spmm's calls.
Above them all, what a patched model pays: an ``nn.Linear`` patched by hand the way `patch_model`
patches it (its forward through `batch.patch._forward`, the SpMMKernel of the template's source),
eager, with a cProfile of those calls.
  python3 benchmarks/launch_overhead_probe.py --shape 4096x4096 -n 1 16
  python3 benchmarks/launch_overhead_probe.py --shape 11008x4096 --template delta_spmv --style magnitude --sparsity 0.7 -n 1
Run it again with SPARSEDITTO_DIRECT_LAUNCH=1 to time the same rows with runtime.DirectLaunch
(cuLaunchKernel through ctypes from a plan's second call on) in place of CuPy's launch.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

ITERS = 2000


def per_call_us(fn, iters: int = ITERS) -> float:
    import torch

    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e6


def main(argv=None) -> int:
    import numpy as np
    import torch

    from llm_layers import SHAPES, cached_plan, prune

    from sparseditto.harness.source_loader import load_module
    from sparseditto.kernel_templates import runtime, tc_launch
    from sparseditto.kernel_templates.registry import get_template

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="4096x4096", choices=sorted(SHAPES))
    ap.add_argument("-n", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--template", default="tc_sp24")
    ap.add_argument("--style", default="nm24")
    ap.add_argument("--sparsity", type=float, default=0.5)
    args = ap.parse_args(argv)
    m, k = SHAPES[args.shape]
    A = prune(m, k, args.style, args.sparsity, seed=0)
    source = get_template(args.template).instantiate({}).source
    mod = load_module(source)
    packed = mod.prepare(A, torch.float16, torch.device("cuda"))
    W = torch.from_numpy(A.to_scipy().toarray()).to("cuda", torch.float16)
    linear = patched_linear(A, W, source, args.template, args.n)
    for n in args.n:
        x = torch.randn(n, k, device="cuda", dtype=torch.float16)
        y = torch.empty(n, m, device="cuda", dtype=torch.float16)
        B = x.t().contiguous()
        out = torch.empty(m, n, device="cuda", dtype=torch.float16)
        mod.spmm(packed, x.t(), y.t())
        ok = torch.allclose(y.t(), W @ x.t(), rtol=2e-2, atol=2e-2)
        rows = {"F.linear (dense)": lambda: torch.nn.functional.linear(x, W),
                "spmm on x^T, y^T views": lambda: mod.spmm(packed, x.t(), y.t()),
                "spmm contiguous": lambda: mod.spmm(packed, B, out),
                "tc_launch.launch": lambda: tc_launch.launch(packed, B, out)}
        mod.spmm(packed, B, out)                 # the contiguous layout's plan (and its DirectLaunch when on)
        mod.spmm(packed, B, out)
        plan = cached_plan(packed, n)            # the tensor-core templates' plans (tc_launch)
        if plan is None:
            del rows["tc_launch.launch"]
            plan = launch_cuda_plan(packed, B, out)   # runtime.launch_cuda's (delta_spmv, the CSR kernels)
        device, stream = runtime.cupy_stream(packed["scratch"], B.device)
        if plan is not None:
            fn = plan.get("fn") or plan.get("kernel")
            smem = plan.get("smem", 0)
            args_ = plan["head"] + (np.uint64(B.data_ptr()), np.uint64(out.data_ptr())) + plan["tail"]

            def bare():
                with device, stream:
                    fn(plan["grid"], plan["block"], args_, shared_mem=smem)
            rows["CuPy launch in device+stream contexts"] = bare
            rows["CuPy launch, no contexts"] = lambda: fn(plan["grid"], plan["block"], args_, shared_mem=smem)
            direct = plan.get("direct")
            if direct:
                first = direct[0] if isinstance(direct, list) else direct
                rows["DirectLaunch (cuLaunchKernel)"] = lambda: first(runtime.raw_stream(B.device), B.data_ptr(),
                                                                      out.data_ptr())
                rows["runtime.raw_stream"] = lambda: runtime.raw_stream(B.device)
        rows["cuda_operands"] = lambda: runtime.cuda_operands(packed, B, out, torch.float16, "probe")
        rows["cupy_stream"] = lambda: runtime.cupy_stream(packed["scratch"], B.device)
        rows["torch.cuda.current_stream"] = lambda: torch.cuda.current_stream(B.device)
        with torch.inference_mode():
            got = linear(x)
            ok_patched = torch.allclose(got, x @ W.t(), rtol=2e-2, atol=2e-2)
        print(f"== {args.shape} {args.style} {args.sparsity} {args.template} N={n} (views correct: {ok}, "
              f"patched forward correct: {ok_patched})")

        def patched():
            with torch.inference_mode():
                linear(x)

        def dense_inference():
            with torch.inference_mode():
                torch.nn.functional.linear(x, W)
        rows = {"patched nn.Linear forward (inference_mode)": patched,
                "F.linear (dense, inference_mode)": dense_inference, **rows}
        for label, fn in rows.items():
            print(f"   {label:40s} {per_call_us(fn):7.2f} us/call")
        for label, fn in (("spmm on views", lambda: mod.spmm(packed, x.t(), y.t())), ("patched forward", patched)):
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(500):
                fn()
            prof.disable()
            torch.cuda.synchronize()
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(16)
            print(f"-- cProfile, 500 calls: {label}")
            print("\n".join(line for line in s.getvalue().splitlines() if line.strip())[:3500])
    return 0


def launch_cuda_plan(packed: dict, B, out) -> dict | None:
    """The plan runtime.launch_cuda cached for this B and C (its key holds their row strides)."""
    for key, plan in (packed.get("scratch") or {}).items():
        if isinstance(key, tuple) and isinstance(plan, dict) and "kernel" in plan and "head" in plan \
                and key[0] == B.shape[1] and B.stride(0) in key and out.stride(0) in key:
            return plan
    return None


def patched_linear(A, W, source: str, template: str, ns):
    """An nn.Linear over W with its forward replaced as `patch_model` replaces it (the kernel verified
    for ``ns`` here by construction: this probe times host cost, the harness verifies elsewhere)."""
    import torch

    from sparseditto.api import SpMMKernel
    from sparseditto.batch import patch

    m, k = W.shape
    linear = torch.nn.Linear(k, m, bias=False, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        linear.weight.copy_(W)
    kernel = SpMMKernel(A, source, template, verified_ns=ns, verified_dtype="float16")
    key = f"probe.{template}"
    patch._KERNELS[key] = patch.PatchedLinear(name=key, kernel=kernel, verified_ns=frozenset(ns),
                                              verified_dtype="float16", out_features=m)
    linear.forward = patch._forward(linear, key)
    return linear


if __name__ == "__main__":
    raise SystemExit(main())
