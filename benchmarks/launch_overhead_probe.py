"""Host cost of one eager decode-kernel call, piece by piece (issue 12: patched layers run 2x slower
than dense in eager mode on the H200 while they are 1.4-1.8x faster inside a CUDA graph).

Each loop launches the same thing back to back ITERS times from Python and reports wall time per
call after a final synchronize. When the host side is slower than the kernel (decode sizes: the
kernels take 9-18 us), that time is the host cost: what an eager model pays per layer. The pieces,
outermost first: torch's F.linear (what an unpatched layer pays); the template's spmm on a
transposed x (what patch_model passes at N > 1: a column-strided B and out, copied to unit-stride
stand-ins); spmm on contiguous operands; tc_launch.launch's operand checks, stream lookup and CuPy
launch; the bare CuPy launch inside its device/stream contexts; and a cProfile of spmm's calls.
  python3 benchmarks/launch_overhead_probe.py --shape 4096x4096 -n 1 16
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
    args = ap.parse_args(argv)
    m, k = SHAPES[args.shape]
    A = prune(m, k, "nm24", 0.5, seed=0)
    mod = load_module(get_template("tc_sp24").instantiate({}).source)
    packed = mod.prepare(A, torch.float16, torch.device("cuda"))
    W = torch.from_numpy(A.to_scipy().toarray()).to("cuda", torch.float16)
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
        plan = cached_plan(packed, n)
        device, stream = runtime.cupy_stream(packed["scratch"], B.device)
        args_ = plan["head"] + (np.uint64(B.data_ptr()), np.uint64(out.data_ptr())) + plan["tail"]

        def bare():
            with device, stream:
                plan["fn"](plan["grid"], plan["block"], args_, shared_mem=plan["smem"])
        rows["CuPy launch in device+stream contexts"] = bare
        rows["CuPy launch, no contexts"] = lambda: plan["fn"](plan["grid"], plan["block"], args_,
                                                              shared_mem=plan["smem"])
        rows["cuda_operands"] = lambda: runtime.cuda_operands(packed, B, out, torch.float16, "probe")
        rows["cupy_stream"] = lambda: runtime.cupy_stream(packed["scratch"], B.device)
        rows["torch.cuda.current_stream"] = lambda: torch.cuda.current_stream(B.device)
        print(f"== {args.shape} 2:4 tc_sp24 N={n} (views correct: {ok})")
        for label, fn in rows.items():
            print(f"   {label:40s} {per_call_us(fn):7.2f} us/call")
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(500):
            mod.spmm(packed, x.t(), y.t())
        prof.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(14)
        print("\n".join(line for line in s.getvalue().splitlines() if line.strip())[:3000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
