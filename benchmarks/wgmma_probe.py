"""Where a tc_sp24 launch puts each weight element: a layout probe for new MMA paths (GPU only).

Why: a kernel whose operand layouts are wrong fails verification with "max error 3.2", which says
nothing about which layout is wrong. This probe runs the kernel on weights with a single kept value
A[m0, k0] = 1 and a B whose entries are all distinct, then reads back which output row lit up
(the A row mapping), which row of B it reproduced (the K mapping: permutation, metadata and B
descriptor) and whether the columns stayed in order (the N mapping). The mma.sync kernel runs as a
control: its mapping must be the identity, so a difference is the new path's.

    python3 benchmarks/wgmma_probe.py --n 8 64 --mma sync wgmma
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def probe(mma: str, n: int, m: int, k: int, points) -> list[str]:
    import scipy.sparse as sp
    import torch

    from llm_layers import load
    from sparseditto.matrix import SparseMatrix

    mod = load("tc_sp24", {})
    lines = []
    b = torch.arange(k * n, dtype=torch.float32, device="cuda").reshape(k, n)
    b = ((b % 1021) / 64.0 + 1.0).half()          # distinct, exactly representable, nonzero
    b64 = b.double().cpu().numpy()
    for m0, k0 in points:
        dense = np.zeros((m, k))
        dense[m0, k0] = 1.0
        A = SparseMatrix.from_scipy(sp.csr_array(dense), dtype="float16", name=f"one_{m0}_{k0}")
        packed = mod.prepare(A, torch.float16, torch.device("cuda"))
        packed["params"] = {**packed["params"], "MMA": mma, "SPLIT": 1}
        out = torch.zeros((m, n), dtype=torch.float16, device="cuda")
        try:
            mod.spmm(packed, b, out)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - reported, the probe goes on
            lines.append(f"{mma} N={n} A[{m0},{k0}]: launch failed: {exc}"[:300])
            continue
        c = out.double().cpu().numpy()
        hot = np.nonzero(np.abs(c).sum(axis=1))[0].tolist()
        if hot == [m0] and np.array_equal(c[m0], b64[k0]):
            lines.append(f"{mma} N={n} A[{m0},{k0}]: ok")
            continue
        found = []
        for r in hot[:4]:
            rowv = c[r]
            exact = [kk for kk in range(k) if np.array_equal(rowv, b64[kk])]
            perm = [kk for kk in range(k) if sorted(rowv.tolist()) == sorted(b64[kk].tolist())]
            found.append(f"row {r}: = B[{exact}]" if exact else
                         (f"row {r}: B{perm} with columns permuted" if perm else
                          f"row {r}: no B row ({np.count_nonzero(rowv)} nonzeros, first {rowv[:4].tolist()})"))
        lines.append(f"{mma} N={n} A[{m0},{k0}]: hot rows {hot[:8]}{'...' if len(hot) > 8 else ''}; " + "; ".join(found))
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="*", default=[8, 64])
    ap.add_argument("--mma", nargs="*", default=["sync", "wgmma"])
    ap.add_argument("--shape", default="128x128")
    args = ap.parse_args(argv)
    m, k = (int(x) for x in args.shape.split("x"))
    points = [(0, 0), (0, 1), (0, 3), (1, 0), (8, 0), (16, 0), (63, 2), (0, 4), (0, 8), (0, 16), (0, 31),
              (5, 32), (0, 40), (70, 65), (127, 127)]
    points = [(a, b) for a, b in points if a < m and b < k]
    for n in args.n:
        for mma in args.mma:
            for line in probe(mma, n, m, k, points):
                print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
