"""Prune a small Llama-style decoder MLP stack three ways, batch it, patch it, compare.

    python examples/prune_and_batch.py                      # CPU: Triton interpreter, small sizes
    python examples/prune_and_batch.py --target H200 --hidden 4096 --inter 11008 --layers 4   # on a GPU

Random weights, no download. Each block is gate/up (hidden -> inter) and down (inter -> hidden)
with SiLU gating. The three prunings: 2:4 along the input dimension, 70% unstructured (per-row
magnitude), and 32x32 blocks at 75% (the blocks with the smallest norm removed). For each:
`sparseditto.run_batch` (a kernel per weight), `sparseditto.patch_model` (the kernels in place of
the nn.Linear forwards), then the forward latency dense vs patched at each N (tokens) and the
largest output difference (eagerly and, on a GPU, inside a CUDA graph; eagerly each patched layer
runs whichever of its kernel and dense measured cheaper per call there, host time included, and the
example prints both figures). Without a GPU the kernels run in the Triton interpreter: the
latencies are CPU times and say nothing about GPU speed (the batch's report uses the cost model).
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch


class MLP(torch.nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = torch.nn.Linear(hidden, inter, bias=False)
        self.up_proj = torch.nn.Linear(hidden, inter, bias=False)
        self.down_proj = torch.nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Decoder(torch.nn.Module):
    def __init__(self, hidden: int, inter: int, layers: int):
        super().__init__()
        self.layers = torch.nn.ModuleList(MLP(hidden, inter) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return x


def prune_2_4(w: torch.Tensor) -> torch.Tensor:
    groups = w.reshape(w.shape[0], -1, 4)
    keep = groups.abs().topk(2, dim=-1).indices
    mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, keep, True)
    return (groups * mask).reshape(w.shape)


def prune_unstructured(w: torch.Tensor, sparsity: float = 0.7) -> torch.Tensor:
    keep = max(1, round(w.shape[1] * (1 - sparsity)))
    idx = w.abs().topk(keep, dim=1).indices
    return w * torch.zeros_like(w, dtype=torch.bool).scatter_(1, idx, True)


def prune_blocks(w: torch.Tensor, block: int = 32, sparsity: float = 0.75) -> torch.Tensor:
    m, k = w.shape
    tiles = w.reshape(m // block, block, k // block, block)
    norms = tiles.float().pow(2).sum(dim=(1, 3))
    keep = max(1, round(norms.numel() * (1 - sparsity)))
    mask = torch.zeros(norms.numel(), dtype=torch.bool)
    mask[norms.flatten().topk(keep).indices] = True
    return (tiles * mask.reshape(norms.shape)[:, None, :, None]).reshape(m, k)


PRUNINGS = {"2:4": prune_2_4, "unstructured-70%": prune_unstructured, "block32-75%": prune_blocks}


def latency_ms(model, x, repeats: int) -> float:
    """Eager forward, host included: what a caller without CUDA graphs pays (median, ms)."""
    times = []
    for _ in range(repeats + 1):
        if x.is_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        model(x)
        if x.is_cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[1:])


def graph_latency_ms(model, x, repeats: int) -> float:
    """The forward captured in one CUDA graph and replayed between events (median, ms): how decode
    engines (vLLM, TensorRT-LLM, torch.compile's reduce-overhead) run a step, without the host's
    per-op launch cost. Eager calls first, so each patched layer has checked its copy-free path."""
    for _ in range(3):
        model(x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model(x)
    times = []
    for _ in range(repeats + 3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[3:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="auto")
    ap.add_argument("--backend", default="auto", choices=["auto", "cuda", "interpret"])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--inter", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("-n", type=int, action="append", help="tokens per forward (default: 1 and 16)")
    ap.add_argument("--out", default="prune_and_batch_out")
    ap.add_argument("--repeats", type=int, default=None, help="timed forwards (default: 50 on a GPU, 2 on the CPU)")
    ap.add_argument("--budget", type=int, default=None,
                    help="candidates per full search (run_graph's budget; default: its own)")
    ap.add_argument("--compile", default=None, metavar="BACKEND",
                    help="also run torch.compile(patched model, backend=BACKEND) at each N and compare (e.g. inductor)")
    ap.add_argument("--prunings", nargs="+", choices=sorted(PRUNINGS), default=list(PRUNINGS),
                    help="which prunings to batch and patch (default: all three)")
    args = ap.parse_args()
    ns = args.n or [1, 16]
    from sparseditto import patch_model, run_batch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    repeats = args.repeats or (50 if device == "cuda" else 2)
    torch.manual_seed(0)
    base = Decoder(args.hidden, args.inter, args.layers).half()
    for name in args.prunings:
        prune = PRUNINGS[name]
        model = Decoder(args.hidden, args.inter, args.layers).half()
        with torch.no_grad():
            model.load_state_dict({k: prune(v.float()).half() for k, v in base.state_dict().items()})
        out = Path(args.out) / name.replace(":", "of").replace("%", "")
        report = run_batch(model, target=args.target, n=ns, backend=args.backend, out=out, budget=args.budget,
                           resume=(out / "journal.sqlite").exists(), progress=True)
        print(f"\n== {name}: {report.summary()}")
        model = model.to(device).eval()
        dense_model = Decoder(args.hidden, args.inter, args.layers).half().to(device).eval()
        dense_model.load_state_dict(model.state_dict())
        patched = patch_model(model, out / "bundle")
        print(f"patched {len(patched)} of {3 * args.layers} linear layers")
        with torch.no_grad():
            for n in ns:
                x = torch.randn(n, args.hidden, device=device).half() * 0.1
                before = {k: (v.calls, v.dense_by_choice, v.dense_by_measure) for k, v in patched.items()}
                ref, got = dense_model(x), model(x)
                ran = sum(v.calls > before[k][0] for k, v in patched.items())
                by_choice = sum(v.dense_by_choice > before[k][1] for k, v in patched.items())
                by_measure = sum(v.dense_by_measure > before[k][2] for k, v in patched.items())
                diff = float((got.float() - ref.float()).abs().max())
                d_ms, p_ms = latency_ms(dense_model, x, repeats), latency_ms(model, x, repeats)
                note = "" if device == "cuda" else "  (CPU + Triton interpreter: NOT GPU timings)"
                print(f"  N={n:<4} eager: dense {d_ms:9.3f} ms  patched {p_ms:9.3f} ms  speedup {d_ms / p_ms:6.2f}x  "
                      f"max |diff| {diff:.3g} (max |y| {float(ref.abs().max()):.3g}); {ran} of {len(patched)} "
                      f"patched layers ran their kernel eagerly"
                      + (f" (dense: {by_choice} measured faster by the batch at this N, {by_measure} cheaper per "
                         "eager call here, host time included)" if ran < len(patched) else "") + note)
                for name, v in patched.items():
                    cost = v.eager_costs.get((x.dtype, n, x.device))
                    if cost:
                        k, d = cost["kernel"], cost["dense"]
                        print(f"      {name}: eager per call, kernel {k['per_call_us']:.1f} us (host {k['host_us']:.1f}, "
                              f"GPU {k['gpu_us']:.1f}) vs dense {d['per_call_us']:.1f} us (host {d['host_us']:.1f}, "
                              f"GPU {d['gpu_us']:.1f}): {cost['path']}")
                if device == "cuda":
                    before = {k: v.calls for k, v in patched.items()}
                    dg, pg = graph_latency_ms(dense_model, x, repeats), graph_latency_ms(model, x, repeats)
                    in_graph = sum(v.calls > before[k] for k, v in patched.items())
                    print(f"  N={n:<4} CUDA graph: dense {dg:9.3f} ms  patched {pg:9.3f} ms  speedup {dg / pg:6.2f}x; "
                          f"{in_graph} of {len(patched)} patched layers ran their kernel in it")
                if args.compile:
                    compiled = torch.compile(model, backend=args.compile)
                    yc = compiled(x)
                    print(f"  N={n:<4} torch.compile(backend={args.compile!r}): max |diff| vs dense "
                          f"{float((yc.float() - ref.float()).abs().max()):.3g}")


if __name__ == "__main__":
    main()
