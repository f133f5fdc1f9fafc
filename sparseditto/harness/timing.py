"""Cold-L2 kernel timing (CUDA events, CUDA graphs) and a wall-clock fallback for the interpreter.

Why cold L2: a pruned weight of a few tens of MiB fits in the H100/H200 L2 (50-60 MiB), so timing a
kernel back to back measures L2 bandwidth, not the HBM reads it pays inside a model (the DESIGN
measured cuBLAS at 17.3 us cold vs 11.1 us warm). Before every timed launch a buffer of at least
twice the L2 size is read, then CUDA events bracket the launch only. The graph variant
captures one launch into a CUDA graph and replays it between flushes: that removes the Python and
driver launch overhead and is the kernel's own time; the eager variant is what callers without
graphs pay. Runs in the worker process.

Why the flush *reads* (a sum over the buffer) instead of writing it: a written buffer leaves the L2
full of dirty lines, and the timed kernel then pays their write-back to HBM while it streams its
weight. On the H200 (2026-12-01, graph launches, same process) that made cuBLAS on an 11008x4096
fp16 weight 34.7 us after a write flush against 27.1 us after a read flush, while our streaming
kernels moved by 1-5%: the write flush flattered our speedups by up to 1.3x. Inside a model the L2
before a GEMV holds the previous layers' weights and activations, mostly clean, so the read flush is
the representative cold cache.

Why the GPU is kept ahead of the host: events time the GPU's timeline, so if the GPU reaches the
start event before the host has submitted the launch, the wait is counted as kernel time. After the
flush is queued, the host still records the event and submits the launch; in a sandboxed worker
(audit hook, op tracer) that can take longer than the ~30 us flush. On the H200 (2026-12-01) the
same cuBLAS call measured 34.9 us in a bench's candidate slot and 20.4 us in its dense slot, and
delta_spmv 22.6 then 11.4 us in two identical benches. So before each timed graph replay a spin
kernel of LEAD_US is queued after the flush and before the start event: the host has that long to
submit the replay before the GPU can wait for it. Eager timings keep the host in (they are what a
caller without graphs pays, launch latency included).

Why a chained timing beside the single launch (`time_cuda_chain`): one graph replay between two
events carries a fixed cost of its own (an empty kernel measures ~4 us on the H200, 2026-12-01),
which a 8-25 us decode kernel and cuBLAS both pay and which flattens every ratio between them.
Inside a model the layers run back to back from one graph: the launch of layer i+1 overlaps the
tail of layer i, and each weight is cold in L2 because the layers before it streamed more than the
L2 holds. The chained timing reproduces that: R launches captured in one graph, each on its own
copy of the weight (the copies together hold CHAIN_L2_MULTIPLE times the L2), the L2 flushed before
the replay, time / R per launch. B stays shared (hot in L2, as an activation the previous layer
just wrote is). It is reported beside the single-launch time, never instead of it.

Why a warm-up measured in milliseconds, not only in launches: a GPU that was idle (compiling,
verifying) runs its first milliseconds of work at lower clocks. On the H200 a 15-40 us kernel timed
right after such a gap measured up to 2x its time (csr_rowsplit 23 vs 39-42 us; tc_dense 16.9 vs
40.6 us), while cuBLAS, timed later in the same call on a busy GPU, stayed within 5%. So every timing
loop first keeps the GPU busy with its own flush + launch for at least WARM_MS (as
`triton.testing.do_bench`'s 25 ms warm-up does), then counts samples.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np

from . import gpu_lock
from .results import Timing

_DEFAULT_L2_BYTES = 128 * 1024 * 1024  # used when the device does not report its L2 size
_FLUSH_BUFFERS: dict = {}
WARM_MS = 30.0          # busy time before the first sample (module docstring)
MAX_WARM_LAUNCHES = 4000
# GPU time queued ahead of every timed launch (module docstring, "Why the GPU is kept ahead")
LEAD_US = 100.0


class LapClock:
    """Wall seconds charged to named steps: each ``lap`` closes the interval since the previous one
    and splits it among the names given (none: the interval is no step's). One clock for the
    bench's steps in a worker (`BenchResult.stage_seconds`) and run_graph's nodes
    (`Result.node_seconds`): where a slow run's time went is the first question about it."""

    def __init__(self) -> None:
        self.start = self.last = time.perf_counter()
        self.seconds: dict[str, float] = {}

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def lap(self, *names: str) -> float:
        """Close the interval since the last lap; returns its length in seconds."""
        now = time.perf_counter()
        interval, self.last = now - self.last, now
        for name in names:
            self.seconds[name] = self.seconds.get(name, 0.0) + interval / len(names)
        return interval

    def rounded(self, digits: int = 3) -> dict[str, float]:
        return {k: round(v, digits) for k, v in self.seconds.items()}


def check_repeats(repeats: int, warmup: int) -> None:
    if not isinstance(repeats, (int, np.integer)) or repeats < 1:
        raise ValueError(f"Expected repeats >= 1, got {repeats!r}.")
    if not isinstance(warmup, (int, np.integer)) or warmup < 0:
        raise ValueError(f"Expected warmup >= 0, got {warmup!r}.")


def summarize(samples_ms) -> Timing:
    """Median and 10th/90th percentiles of the samples (ms)."""
    arr = np.asarray(samples_ms, dtype=np.float64)
    if arr.size == 0:
        raise ValueError("Cannot summarize an empty list of timings.")
    p10, med, p90 = np.percentile(arr, [10, 50, 90])
    return Timing(median_ms=float(med), p10_ms=float(p10), p90_ms=float(p90), repeats=int(arr.size),
                  min_ms=float(arr.min()))


def l2_cache_bytes(device=None) -> int:
    import torch

    props = torch.cuda.get_device_properties(device if device is not None else torch.cuda.current_device())
    size = int(getattr(props, "L2_cache_size", 0) or getattr(props, "l2_cache_size", 0) or 0)
    return size if size > 0 else _DEFAULT_L2_BYTES


def flush_buffer():
    """An fp16 buffer of 2x the current device's L2 bytes (cached per device); reading it all
    (`flush_l2`) evicts the L2 and leaves it holding clean lines."""
    import torch

    index = torch.cuda.current_device()
    buf = _FLUSH_BUFFERS.get(index)
    if buf is None:
        buf = torch.ones(l2_cache_bytes(index), dtype=torch.float16, device=torch.device("cuda", index))
        _FLUSH_BUFFERS[index] = buf
    return buf


def flush_l2(buf) -> None:
    """Evict the L2 by reading ``buf`` (a read, not a write: see the module docstring)."""
    buf.sum()


def _noop(i: int) -> None:
    return None


def warm_up(step: Callable[[], None], warmup: int, before, after, min_ms: float | None = None, sync=None) -> int:
    """Run ``step`` (a flush and a launch) at least ``warmup`` times and, when ``warmup`` > 0, until
    the GPU has been busy for ``min_ms`` (synchronized wall time); returns the launches made.
    Warm-up launch w gets ``before(-1 - w)`` / ``after(-1 - w)`` like the counted ones. ``sync``
    waits for the queued work (torch.cuda.synchronize unless given)."""
    if sync is None:
        import torch

        sync = torch.cuda.synchronize
    min_ms = WARM_MS if min_ms is None else min_ms
    t0 = time.perf_counter()
    w = 0
    while w < warmup or (warmup > 0 and w < MAX_WARM_LAUNCHES and (time.perf_counter() - t0) * 1e3 < min_ms):
        before(-1 - w)
        step()
        after(-1 - w)
        w += 1
        if w % 16 == 0:
            sync()   # wall time of work done, not of work queued
    sync()
    return w


def lead_cycles(device=None) -> int:
    """GPU clock cycles of LEAD_US at the device's clock rate (torch reports it in kHz; 1.98 GHz
    when it does not)."""
    import torch

    props = torch.cuda.get_device_properties(device if device is not None else torch.cuda.current_device())
    khz = int(getattr(props, "clock_rate", 0) or 1_980_000)
    return max(1, int(LEAD_US * khz / 1e3))


def host_delayed(launch: Callable[[], None], host_us: float) -> Callable[[], None]:
    """``launch`` preceded by ``host_us`` of host busy-work: a slow submission, like a sandboxed
    worker's (what the LEAD_US spin must keep out of the timed region; its GPU test and probe)."""
    def run() -> None:
        t0 = time.perf_counter()
        while (time.perf_counter() - t0) * 1e6 < host_us:
            pass
        launch()
    return run


def _time_launches(launch: Callable[[], None], repeats: int, warmup: int, flush: bool, before, after,
                   lead: bool = True) -> Timing:
    """The loop both CUDA timings share: the warm-up (`warm_up`), then per launch ``before(i)``, an
    L2 flush, the LEAD_US spin when ``lead`` (graph replays: the kernel's own time), CUDA events
    around ``launch()`` only, ``after(i)``. Eager timings run without the spin: what a caller
    without graphs pays includes the host's launch latency."""
    import torch

    before, after = before or _noop, after or _noop
    buf = flush_buffer() if flush else None

    def step():
        if buf is not None:
            flush_l2(buf)
        launch()

    with gpu_lock.exclusive_section():   # no other process's work of ours on the GPU meanwhile (gpu_lock)
        torch.cuda.synchronize()
        warm_up(step, warmup, before, after)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        cycles = lead_cycles() if lead else 0
        for i in range(repeats):
            before(i)
            if buf is not None:
                flush_l2(buf)
            if cycles:
                torch.cuda._sleep(cycles)
            starts[i].record()
            launch()
            ends[i].record()
            after(i)
        torch.cuda.synchronize()
    return summarize([s.elapsed_time(e) for s, e in zip(starts, ends)])


def time_cuda(fn: Callable[[], None], *, repeats: int = 50, warmup: int = 5, flush: bool = True,
              before: Callable[[int], None] | None = None, after: Callable[[int], None] | None = None) -> Timing:
    """Eager launches, each preceded by an L2 flush, CUDA events around ``fn()`` only.

    ``before(i)``/``after(i)`` run outside the timed region of launch i (warm-up launches have
    negative i): the benchmark uses them to give every launch fresh inputs and keep its output."""
    check_repeats(repeats, warmup)
    return _time_launches(fn, repeats, warmup, flush, before, after, lead=False)


def capture_graph(fn: Callable[[], None], warmup: int = 2):
    """Capture one ``fn()`` into a CUDA graph (warm-up on a side stream first, as torch requires).
    The warm-up launches run eagerly: as shared GPU work (gpu_lock), never inside another process's
    timing."""
    import torch

    with gpu_lock.shared_section():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(max(1, warmup)):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        torch.cuda.synchronize()
    return graph


def time_cuda_graph(fn: Callable[[], None], *, repeats: int = 50, warmup: int = 5,
                    flush: bool = True, before: Callable[[int], None] | None = None,
                    after: Callable[[int], None] | None = None) -> Timing:
    """The kernel's own time: replay a captured launch, flushing L2 (outside the graph) each time.

    Raises whatever capture raises (e.g. a launch on a non-capturable stream); the caller records
    that and keeps the eager timing.
    """
    check_repeats(repeats, warmup)
    return _time_launches(capture_graph(fn).replay, repeats, warmup, flush, before, after)


CHAIN_L2_MULTIPLE = 3     # a chained timing's weight copies hold at least this many L2 sizes
CHAIN_MIN_COPIES = 4
CHAIN_MAX_COPIES = 64
CHAIN_MAX_BYTES = 4 << 30  # the copies of one chained timing together; a larger weight is timed single only


def chain_copies(nbytes: float, device=None) -> int:
    """How many copies of a weight of ``nbytes`` a chained timing rotates through so that each
    launch finds its copy evicted: together at least CHAIN_L2_MULTIPLE L2 sizes (module docstring)."""
    need = -(-CHAIN_L2_MULTIPLE * l2_cache_bytes(device) // max(1, int(nbytes)))
    return int(min(CHAIN_MAX_COPIES, max(CHAIN_MIN_COPIES, need)))


def clone_packed(packed: dict) -> dict:
    """An independent copy of a prepared matrix: every tensor cloned (nested dicts, lists and tuples
    walked), everything else shared (compiled kernels, shapes), and ``scratch`` empty, since its
    launch plans hold the original's device pointers. A chained timing rotates through such
    copies so that each launch reads its own, L2-cold weight (time_cuda_chain)."""
    import torch

    def copy(value):
        if isinstance(value, torch.Tensor):
            return value.clone()
        if isinstance(value, dict):
            return {k: copy(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(copy(v) for v in value)
        return value

    return {key: ({} if key == "scratch" else copy(value)) for key, value in packed.items()}


def chain_fits(nbytes: float, device=None) -> bool:
    """Whether a chained timing's copies of a ``nbytes`` weight stay within CHAIN_MAX_BYTES (above
    it the weight is far larger than the L2 and a lone launch's fixed cost is negligible anyway)."""
    return chain_copies(nbytes, device) * max(1, int(nbytes)) <= CHAIN_MAX_BYTES


def time_cuda_chain(launches, *, repeats: int = 30, warmup: int = 3, flush: bool = True) -> Timing:
    """Per-launch time of ``launches`` (callables, each launching on its own copy of the data)
    replayed back to back from one CUDA graph, the L2 flushed before each replay: the time a
    layer costs inside a model's graph (module docstring). The Timing's fields are per launch."""
    launches = list(launches)
    if not launches:
        raise ValueError("time_cuda_chain needs at least one launch.")
    check_repeats(repeats, warmup)

    def run_all() -> None:
        for launch in launches:
            launch()

    whole = _time_launches(capture_graph(run_all).replay, repeats, warmup, flush, None, None)
    r = len(launches)
    return Timing(median_ms=whole.median_ms / r, p10_ms=whole.p10_ms / r, p90_ms=whole.p90_ms / r,
                  repeats=whole.repeats, min_ms=whole.min_ms / r if whole.min_ms is not None else None)


def time_cpu(fn: Callable[[], None], *, repeats: int = 10, warmup: int = 1,
             before: Callable[[int], None] | None = None, after: Callable[[int], None] | None = None) -> Timing:
    """Wall-clock (time.perf_counter) timing for the interpreter/CPU path: not GPU timings."""
    check_repeats(repeats, warmup)
    before, after = before or _noop, after or _noop
    for w in range(warmup):
        before(-1 - w)
        fn()
        after(-1 - w)
    samples = []
    for i in range(repeats):
        before(i)
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
        after(i)
    return summarize(samples)


def time_fn(fn: Callable[[], None], backend: str, *, repeats: int, warmup: int,
            before: Callable[[int], None] | None = None, after: Callable[[int], None] | None = None) -> Timing:
    """Eager timing on the given execution backend (cold-L2 events on CUDA, wall clock otherwise)."""
    if backend == "cuda":
        return time_cuda(fn, repeats=repeats, warmup=warmup, before=before, after=after)
    return time_cpu(fn, repeats=repeats, warmup=warmup, before=before, after=after)
