"""The process Nsight Compute profiles: ``python -m sparseditto.harness.ncu_child <args.json>``.

Loads the candidate and the matrix named in the args file, runs ``prepare`` and a few warm-up
launches (JIT compile, caches), then exactly one ``spmm`` inside the NVTX range that ``ncu
--nvtx-include`` selects. Its own stdout is redirected to stderr so ncu's CSV on stdout stays clean.
"""
from __future__ import annotations

import json
import os
import sys


def child_spec(kernel: dict):
    """The `CandidateSpec` of ``args["kernel"]`` (written by `ncu.profiled_kernel`): a vendor path
    by name, or a generated kernel's source file with its backend (triton or cuda)."""
    from .candidate_spec import CandidateSpec, vendor_spec

    if kernel.get("vendor"):
        return vendor_spec(kernel["vendor"])
    with open(kernel["source_path"], encoding="utf-8") as fh:
        source = fh.read()
    return CandidateSpec(source=source, backend=kernel["backend"])


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m sparseditto.harness.ncu_child ARGS.json", file=sys.stderr)
        return 2
    os.dup2(2, 1)  # candidate prints must not mix with ncu's CSV
    os.environ.pop("TRITON_INTERPRET", None)
    with open(argv[0], encoding="utf-8") as fh:
        args = json.load(fh)

    import numpy as np
    import torch

    from sparseditto.matrix import SparseMatrix

    from .execution import load_candidate
    from .numerics import draw_dense, round_to_dtype, torch_dtype, with_values

    arrays = np.load(args["matrix_path"])
    matrix = SparseMatrix(arrays["indptr"], arrays["indices"], arrays["data"],
                          tuple(int(x) for x in arrays["shape"]), args["matrix_dtype"], "ncu")
    dtype = args["dtype"]
    spec = child_spec(args["kernel"])
    from . import guard
    from .isolation import cache_subdirs
    from .source_loader import default_cache_dir
    from .worker import WorkerContext, import_trusted_modules

    import_trusted_modules()          # before the gate: their imports generate code
    cache = str(default_cache_dir())
    gate = guard.install(guard.Policy.for_worker(os.getcwd(), cache, [str(p) for p in cache_subdirs(cache).values()]))
    wctx = WorkerContext(gate=gate, backend="cuda", info={})
    module = load_candidate(spec, wctx)
    a = with_values(matrix, round_to_dtype(matrix.data, dtype), dtype)
    rng = np.random.default_rng(args["seed"])
    B = torch.from_numpy(draw_dense(rng, (matrix.shape[1], args["n"]), dtype)).to("cuda", torch_dtype(dtype))
    out = torch.empty((matrix.shape[0], args["n"]), dtype=torch_dtype(dtype), device="cuda")

    def profiled_run():
        packed = module.prepare(a, torch_dtype(dtype), "cuda")
        for _ in range(max(1, int(args["warmup"]))):
            module.spmm(packed, B, out)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push(args["range"])
        module.spmm(packed, B, out)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()

    if spec.is_builtin:      # trusted harness code (a vendor library): outside the gate, as in a worker
        profiled_run()
        return 0
    with gate.scope("ncu run") as scope:
        profiled_run()
    if scope.violations:
        print(f"sandbox: {scope.violations[0]}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
