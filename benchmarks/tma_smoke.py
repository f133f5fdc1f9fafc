"""One small tc_sp24tma launch against fp64, under a caller's timeout: a wrong expect-tx byte count
or barrier phase shows up as a hang here in seconds, not in the middle of a sweep.

    timeout 60 python3 benchmarks/tma_smoke.py
"""
from __future__ import annotations

import sys

import numpy as np
import torch

sys.path.insert(0, "benchmarks")
from llm_layers import load, prune  # noqa: E402


def main() -> int:
    bad = 0
    for m, k, n, params in ((256, 512, 64, {}), (200, 4160, 65, {"SPLIT": 4}), (64, 64, 33, {"WSTAGES": 2}),
                            (300, 1024, 128, {"TWARPS": 8}), (512, 2048, 40, {"SPLIT": 1, "WSTAGES": 8}),
                            (1000, 4096, 64, {"ASTAGES": 8}), (130, 1024, 100, {"ASTAGES": 6, "SPLIT": 2}),
                            (256, 512, 64, {"MCAST": 2}), (200, 4160, 65, {"MCAST": 2, "SPLIT": 3}),
                            (300, 1024, 128, {"MCAST": 4, "SPLIT": 2}), (1000, 4096, 64, {"SPLIT": 3}),
                            (130, 1024, 40, {"MCAST": 4, "TWARPS": 8}), (520, 2048, 32, {"MCAST": 2, "SPLIT": 1})):
        matrix = prune(m, k, "nm24", 0.5, 0)
        a = matrix.to_dense()
        mod = load("tc_sp24", params)
        packed = mod.prepare(matrix, torch.float16, torch.device("cuda"))
        b = torch.randn((k, n), device="cuda", dtype=torch.float16)
        out = torch.empty((m, n), device="cuda", dtype=torch.float16)
        mod.spmm(packed, b, out)
        torch.cuda.synchronize()
        a16 = torch.from_numpy(a).half().double().numpy()     # the weight as stored in fp16
        want = a16 @ b.double().cpu().numpy()
        err = float(np.abs(out.double().cpu().numpy() - want).max() / max(1e-9, np.abs(want).max()))
        plans = [p for p in packed["scratch"].values() if isinstance(p, dict) and "geom" in p]
        name = plans[0]["geom"]["load"] if plans else "?"
        ok = err < 1e-2
        bad += not ok
        print(f"{m}x{k} N={n} {params} load={name} rel_err={err:.1e} {'ok' if ok else 'WRONG'}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
