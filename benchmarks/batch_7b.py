"""The issue-12 GPU goal: a synthetic Llama-7B-shaped checkpoint, batched end to end, re-timed.

    python benchmarks/batch_7b.py make  --dir CKPT [--blocks 32]       # fp16 safetensors shards + index
    python benchmarks/batch_7b.py batch --dir CKPT --out OUT [--resume] [--workers 4]  # sparseditto batch on the GPU
    python benchmarks/batch_7b.py retime --dir CKPT --out OUT          # independent re-timing vs the report

The checkpoint: ``blocks`` x {q,k,v,o (4096 x 4096), gate, up (11008 x 4096), down (4096 x 11008)},
random values, 50% per-row magnitude pruned, one shard per block (``--scale 16`` divides every
shape by 16: a smoke test of the three stages on the CPU). ``retime`` times every layer's
bundle kernel again with the harness (fresh inputs, fresh process, dense cuBLAS timed beside it
again, so the batch's one dense timing per shape is checked too) and prints each speedup vs dense
beside the report's, and the worst relative difference (the goal: within 10%). It goes through
the groups round robin (the first layer of every group, then the second, ...) and stops after
``--budget-s`` seconds, so a call that runs out of time has still compared every group.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

SHAPES = {"self_attn.q_proj": (4096, 4096), "self_attn.k_proj": (4096, 4096), "self_attn.v_proj": (4096, 4096),
          "self_attn.o_proj": (4096, 4096), "mlp.gate_proj": (11008, 4096), "mlp.up_proj": (11008, 4096),
          "mlp.down_proj": (4096, 11008)}


def make(folder: Path, blocks: int, sparsity: float = 0.5, scale: int = 1) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=device).manual_seed(0)
    weight_map = {}
    for b in range(blocks):
        shard = f"model-{b + 1:05d}-of-{blocks:05d}.safetensors"
        tensors = {}
        for name, (m, k) in SHAPES.items():
            m, k = m // scale, k // scale
            w = torch.randn(m, k, generator=gen, device=device, dtype=torch.float32)
            keep = w.abs().topk(int(round(k * (1 - sparsity))), dim=1).indices
            mask = torch.zeros_like(w, dtype=torch.bool).scatter_(1, keep, True)
            tensors[f"model.layers.{b}.{name}.weight"] = (w * mask * 0.02).half().cpu().contiguous()
        save_file(tensors, str(folder / shard))
        weight_map.update({k: shard for k in tensors})
        print(f"block {b}: {shard}", flush=True)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def batch(folder: Path, out: Path, resume: bool, target: str, n: list[int], ncu: str = "best",
          workers: str | None = None) -> None:
    import signal

    from sparseditto import run_batch
    from sparseditto.batch.models import BatchReport

    def stop(signum, frame):   # `timeout` sends SIGTERM: stop like Ctrl-C, so the partial report is written
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    t0 = time.time()
    try:
        report = run_batch(folder, target=target, n=n, out=out, resume=resume, progress=True, ncu=ncu,
                           workers=workers)
    except KeyboardInterrupt:
        report = BatchReport.model_validate_json((out / "report.json").read_text())
    print(report.summary())
    firsts = {}
    for x in report.layers:
        firsts.setdefault(x.group, x.name)
    later = [x.seconds for x in report.layers if x.group and firsts[x.group] != x.name]
    print(json.dumps({"wall_s_this_call": round(time.time() - t0, 1), "layers": len(report.layers),
                      "groups": report.groups, "complete": report.complete,
                      "sum_layer_s": round(sum(x.seconds for x in report.layers), 1),
                      "after_first_max_s": max(later, default=None),
                      "after_first_median_s": sorted(later)[len(later) // 2] if later else None,
                      "phase_totals_s": {k: round(v, 1) for k, v in report.phase_totals().items()}}))


def _round_robin(layers) -> list:
    """The layers in the order: the first of every group, then the second of every group, ..."""
    by_group: dict = {}
    for x in layers:
        by_group.setdefault(x.group, []).append(x)
    order = []
    for i in range(max((len(v) for v in by_group.values()), default=0)):
        order += [v[i] for v in by_group.values() if i < len(v)]
    return order


def retime(folder: Path, out: Path, budget_s: float) -> None:
    from sparseditto import harness, load_bundle
    from sparseditto.batch.models import BatchReport
    from sparseditto.batch.weights import as_matrix_tensor, list_weights
    from sparseditto.io import load_matrix

    report = BatchReport.model_validate_json((out / "report.json").read_text())
    bundle = load_bundle(out)
    refs = {r.name: r for r in list_weights(folder)}
    worst, compared, t0 = 0.0, 0, time.time()
    todo = [x for x in report.layers if x.name in bundle.kernels and x.speedup_vs_dense]
    for x in _round_robin(todo):
        if time.time() - t0 > budget_s:
            break
        A = load_matrix(as_matrix_tensor(refs[x.name]), name=x.name)
        res = harness.bench(bundle.source(x.name), A, report.settings["n"][0], dtype=report.settings["dtype"],
                            baselines=False)     # the kernel and dense, side by side
        again = res.speedup_vs_dense_graph or res.speedup_vs_dense
        rel = abs(again - x.speedup_vs_dense) / x.speedup_vs_dense
        worst, compared = max(worst, rel), compared + 1
        print(f"{x.name} ({x.status}): report {x.speedup_vs_dense:.2f}x, re-timed {again:.2f}x ({rel:.1%})",
              flush=True)
    print(json.dumps({"layers_compared": compared, "layers_with_kernels": len(todo),
                      "groups_compared": len({x.group for x in _round_robin(todo)[:compared]}),
                      "worst_relative_difference": round(worst, 4) if compared else None,
                      "seconds": round(time.time() - t0, 1)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stage", choices=["make", "batch", "retime"])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--out", default="batch7b")
    ap.add_argument("--blocks", type=int, default=32)
    ap.add_argument("--scale", type=int, default=1, help="make: divide every shape by this (a CPU smoke test)")
    ap.add_argument("--target", default="auto")
    ap.add_argument("-n", type=int, action="append")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--ncu", default="best", choices=["best", "all", "off"], help="batch: Nsight Compute in searches")
    ap.add_argument("--budget-s", type=float, default=480.0, help="retime: stop after this many seconds")
    ap.add_argument("--workers", default=None, help="batch: worker processes (several share one GPU; "
                                                     "timings take it alone: harness.gpu_lock)")
    args = ap.parse_args()
    if args.stage == "make":
        make(Path(args.dir), args.blocks, scale=args.scale)
    elif args.stage == "batch":
        batch(Path(args.dir), Path(args.out), args.resume, args.target, args.n or [16], args.ncu, args.workers)
    else:
        retime(Path(args.dir), Path(args.out), args.budget_s)


if __name__ == "__main__":
    main()
