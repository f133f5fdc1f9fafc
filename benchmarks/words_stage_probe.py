"""Where tc_words' CTA stream (tc_words_grp) spends its time: the kernel timed with one stage left out.

Why: the stream's loads alone read 11008x4096's 50% pack at ~97% of a pure read (bulk_stream_probe.py, H200),
the kernel at ~72%. The template's source is compiled with SD_PROBE (tc_stream.cu; its output is then wrong,
so only mode 0 is checked against the fp64 reference):

    0  the kernel as shipped          1  no word loads (zero fragments, mma kept)
    2  no mma (words decoded, folded)  3  no DRAM after the first stages (the first stages decoded over and over)
    4  consumers only wait and release the stages (the load skeleton inside the real kernel)
    5 / 6 / 7  mode 4 without staging B / without the epilogue (split-K reduction, C) / without either
    8  mode 4 with only the epilogue's barriers (no partial tiles, DSMEM reads or C stores)

Modes 1-3 run with one row tile per warp (R = 1; it is set when --params leaves R out, where the default "auto"
would take 2 at <= 35% density on 512+ row tiles). Session 38's 4096x4096 probe ran before "auto" R became 1 on
narrower matrices: its `--params '{"LOAD": "group", "WARPS": 4}'` meant R 2 at 70% and 90% then, R 1 now. The
default EPILOGUE pushes at N <= 16 (session 37): mode 8 then times its one cluster-barrier wait.

Each mode is timed as the benchmarks time kernels (chained over L2-cold copies of the pack, back to back from
one graph). On the GPU, from the repo root (benchmarks/device_run.sh's set-up):
    python3 benchmarks/words_stage_probe.py --cases 11008x4096:0.5 11008x4096:0.7 -n 8 16 [--params JSON]
        [--modes 0 4 ...] [--source tree old=PATH/tc_stream.cu]   (an A/B of two kernel versions, mode 0)
"""
from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np

import llm_layers as ll

MODES = {0: "as shipped", 1: "no word loads", 2: "no mma", 3: "no DRAM after start", 4: "wait + release only",
         5: "4 without B staging", 6: "4 without epilogue", 7: "4 without B or epilogue",
         8: "4, epilogue barriers only"}


SOURCE = Path(__file__).resolve().parents[1] / "kernel_templates" / "cuda" / "tc_stream.cu"


def probe_module(mode: int, params: dict, source: Path | None = None):
    """The tc_words module with SD_PROBE = mode compiled into its CUDA source; with `source`, that file's
    text in place of the working tree's tc_stream.cu (an A/B of two versions of the kernels in one process)."""
    mod = ll.load("tc_words", params)
    text = mod.CUDA_SRC
    if source is not None:
        current = SOURCE.read_text()
        if current not in text:
            raise ValueError(f"tc_words' CUDA_SRC does not hold {SOURCE} verbatim; cannot swap in {source}.")
        text = text.replace(current, Path(source).read_text())
    mod.CUDA_SRC = f"#define SD_PROBE {mode}\n" + text
    return mod


def main() -> None:
    import torch

    from sparseditto.harness.numerics import draw_matrix_values, with_values

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=["11008x4096:0.5", "11008x4096:0.7"],
                        help="SHAPE:SPARSITY, per-row magnitude pruning")
    parser.add_argument("-n", type=int, nargs="+", default=[16])
    parser.add_argument("--params", default="{}", help="tc_words parameters (JSON)")
    parser.add_argument("--modes", type=int, nargs="+", default=sorted(MODES))
    parser.add_argument("--source", nargs="+", default=["tree"], metavar="LABEL[=FILE]",
                        help="versions of tc_stream.cu to time side by side: 'tree' (the working tree's) or LABEL=FILE")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args()
    params = json.loads(args.params)
    if any(1 <= mode <= 3 for mode in args.modes) and params.setdefault("R", 1) != 1:
        raise ValueError(f"Modes 1-3 change the one-tile decode (R = 1); got R={params['R']}: time modes 0 and 4-8 "
                         "with two row tiles per warp.")
    sources = [(spec, None) if spec == "tree" else tuple(spec.split("=", 1)) for spec in args.source]
    rows = []
    for case in args.cases:
        shape, sparsity = case.split(":")
        m, k = ll.SHAPES[shape]
        base = ll.prune(m, k, "magnitude", float(sparsity), seed=0)
        values64 = draw_matrix_values(base, np.random.default_rng([0, m, k]), "float16")
        matrix = with_values(base, values64, "float16")
        for (label, source), mode in itertools.product(sources, args.modes):
            mod = probe_module(mode, params, source)
            packed = mod.prepare(matrix, "float16", "cuda")
            a_bytes = ll.packed_bytes(packed)
            for n in args.n:
                rng = np.random.default_rng(n)
                check = ll.check(lambda b, o, p=packed: mod.spmm(p, b, o), matrix, values64, "float16", n, rng) \
                    if mode == 0 else {"ok": None}
                b = torch.randn((k, n), device="cuda").half()
                out = torch.empty((m, n), device="cuda", dtype=torch.float16)
                us = ll.chained_kernel(mod, packed, a_bytes, b, out, args.repeats, rng_seed=n)["chain_us"]
                rows.append({"case": case, "n": n, "source": label, "mode": mode, "what": MODES[mode], "us": us,
                             "mb": a_bytes / 1e6, "ok": check["ok"], "geometry": ll.launch_geometry(packed, n)})
                print(f"{case:16s} N={n:3d} {label:6s} mode {mode} {MODES[mode]:22s} {us:7.2f} us  "
                      f"{a_bytes / us / 1e6:5.2f} TB/s  ok={check['ok']}", flush=True)
                if args.out:   # after every row: a later mode that faults loses nothing measured
                    Path(args.out).write_text(json.dumps(rows, indent=1, default=str))
            del packed

if __name__ == "__main__":
    main()
