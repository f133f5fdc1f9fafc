"""What one eager call of a patched layer costs through its kernel and through dense ``F.linear``.

Why: inside a CUDA graph the example's patched MLP block ran 1.37-1.78x faster than dense at N = 1
on the H200 (docs/batch.md, sessions 24 and 29), while launched eagerly it ran 2x slower: each
patched layer's host work (the Python forward, the CuPy launch) outlasts its 10-25 us kernel, so an
eager decode step is host-bound and pays it on every layer. A patched model must never be slower
than the model it replaces, so in eager mode each layer measures both paths once per (N, dtype,
device) and keeps the cheaper (`patch.PatchedLinear.eager_path`); inside a CUDA graph and under
`torch.compile` the kernel runs, as the batch's graph-replayed ratios decided.

What a call costs, in a stream of eager calls: the slower of the host issuing it and the GPU
running it. Host: the wall time of ``HOST_CALLS`` back-to-back calls without synchronising (the
launch queue is far from full, so nothing waits on the GPU), per call. GPU: CUDA events around
single calls, each after an L2 flush (a read of twice the L2: inside a model of many layers the
weight is cold), the median of ``GPU_CALLS``. Both paths are timed alternately in two rounds and
each keeps its lower figure, so a clock ramp or another process's burst does not decide alone.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass
from typing import Callable

HOST_CALLS = 20        # back-to-back calls per host-time sample
GPU_CALLS = 7          # flushed single calls per GPU-time sample
ROUNDS = 2             # alternating rounds per path; each path keeps its lowest figure


@dataclass(frozen=True)
class CallCost:
    """One path's measured cost per call (us): host issue time, GPU time, and the pace they set."""

    host_us: float
    gpu_us: float

    @property
    def per_call_us(self) -> float:
        return max(self.host_us, self.gpu_us)

    def as_dict(self) -> dict:
        return {"host_us": round(self.host_us, 2), "gpu_us": round(self.gpu_us, 2),
                "per_call_us": round(self.per_call_us, 2)}


def host_us(call: Callable[[], object], sync: Callable[[], None], calls: int = HOST_CALLS) -> float:
    """Wall microseconds per call of ``calls`` back-to-back calls, the GPU drained before and after
    (only the issuing is inside the clock)."""
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    elapsed = time.perf_counter() - t0
    sync()
    return elapsed * 1e6 / calls


def gpu_us(call: Callable[[], object], calls: int = GPU_CALLS) -> float:
    """Median GPU microseconds of single calls, each after an L2 flush, between CUDA events (on the
    current device and stream: the caller selects the device)."""
    import torch

    from sparseditto.harness.timing import flush_l2, l2_cache_bytes

    # 2x the L2 in bytes, made here and dropped after (the harness keeps its flush buffer for the
    # process; a user's process should not keep ours), read (not written) as the harness does
    buf = torch.empty(l2_cache_bytes(), dtype=torch.float16, device="cuda")
    samples = []
    for _ in range(calls):
        flush_l2(buf)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    del buf
    return statistics.median(samples)


def measure(paths: dict[str, Callable[[], object]], *, device=None, rounds: int = ROUNDS,
            host: Callable[[Callable[[], object]], float] | None = None,
            gpu: Callable[[Callable[[], object]], float] | None = None) -> dict[str, CallCost]:
    """{name: CallCost} for each zero-argument call in ``paths`` (each already run once: compiled,
    its first-call checks done), on CUDA ``device`` (None: the current one). ``host``/``gpu`` measure
    one path (defaults: `host_us` with a CUDA synchronise, `gpu_us`); the paths alternate over
    ``rounds`` and each keeps its lowest figures."""
    if not paths:
        raise ValueError("measure needs at least one path to time.")
    if rounds < 1:
        raise ValueError(f"Expected rounds >= 1, got {rounds}.")
    if host is None or gpu is None:
        import torch
        host = host or (lambda call: host_us(call, torch.cuda.synchronize))
        gpu = gpu or gpu_us
    best: dict[str, tuple[float, float]] = {}
    with _on(device):
        for _ in range(rounds):
            for name, call in paths.items():
                h, g = host(call), gpu(call)
                old = best.get(name)
                best[name] = (h, g) if old is None else (min(old[0], h), min(old[1], g))
    return {name: CallCost(host_us=h, gpu_us=g) for name, (h, g) in best.items()}


def _on(device):
    """The CUDA device the events and synchronisations belong to (the layer's, not the current one)."""
    if device is None:
        return contextlib.nullcontext()
    import torch

    return torch.cuda.device(device)
