"""What the timing method itself allows: an empty kernel and a pure streaming read of A-sized
buffers, timed exactly as the kernels are (harness.timing.time_cuda_graph: read-flushed cold L2,
the LEAD_US spin, a CUDA-graph replay between events).

Why: the decode kernels' "% of roofline" divides bytes by the copy bandwidth of a 2 GiB buffer
(~4.2 TB/s), but a 5-60 MB weight is read in 2-15 us, where a launch, the first DRAM latency and a
one-wave tail are a large share. This probe measures the floor any kernel pays at each size, so a
miss can be split into what the method costs and what the kernel wastes.

On the GPU, from the repo root (the device set-up of benchmarks/device_run.sh):
    python3 benchmarks/read_floor_probe.py [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from sparseditto.harness import timing
from sparseditto.kernel_templates import runtime as rt

SOURCE = r"""
extern "C" __global__ void empty_kernel(int* out) { if (threadIdx.x == 1 << 30) out[0] = 0; }

// Each thread streams 16-byte words of the buffer with UNROLL loads in flight (grid-stride), the
// loads past L1 as the decode kernels do, and folds them into one word written only when it is a
// value the data cannot produce (so the loads are not dead code and nothing is written).
template <int UNROLL>
__device__ void stream_read(const uint4* __restrict__ p, long long words, int* out) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned acc = 0;
    for (; i + (UNROLL - 1) * stride < words; i += UNROLL * stride) {
        uint4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
            asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w) : "l"(p + i + u * stride));
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < words; i += stride) { uint4 v = p[i]; acc ^= v.x ^ v.y ^ v.z ^ v.w; }
    if (acc == 0x9e3779b9u) out[0] = (int)acc;
}
extern "C" __global__ void read4(const uint4* p, long long words, int* out) { stream_read<4>(p, words, out); }
extern "C" __global__ void read8(const uint4* p, long long words, int* out) { stream_read<8>(p, words, out); }
"""

# bytes of the delta slices of the Llama-shape weights (docs/kernels.md, "A MB") and a large one
SIZES_MB = (1.0, 5.2, 13.6, 21.7, 36.7, 58.2, 100.0, 2048.0)


class ReadFloor:
    """Times a pure streaming read (read8, 8 CTAs per SM: the fastest variant on the H200) of a given
    number of bytes with the kernels' method; cached per MB, so a sweep pays one timing per size."""

    def __init__(self, repeats: int = 30):
        import cupy as cp

        self.device = torch.device("cuda")
        self.sms = rt.sm_count(self.device)
        module = cp.RawModule(code=SOURCE, options=("-std=c++17",))
        self.kernels = {name: module.get_function(name) for name in ("empty_kernel", "read4", "read8")}
        self.sink = torch.zeros(4, dtype=torch.int32, device=self.device)
        self.scratch: dict = {}
        self.repeats = repeats
        self.cache: dict = {}

    def launcher(self, name, grid, block, *extra):
        kernel = self.kernels[name]

        def launch():
            dev, stream = rt.cupy_stream(self.scratch, self.device)
            with dev, stream:
                kernel(grid, block, (*extra, np.uint64(self.sink.data_ptr())))
        return launch

    def reader(self, name: str, nbytes: float, ctas: int):
        """(a fresh random buffer of ``nbytes``, the launch of kernel ``name`` reading it whole)."""
        words = max(1, int(nbytes) // 16)
        buf = torch.randint(0, 2 ** 31 - 1, (words * 4,), dtype=torch.int32, device=self.device)
        return buf, self.launcher(name, (self.sms * ctas,), (256,), np.uint64(buf.data_ptr()), np.int64(words))

    def time_us(self, name: str, nbytes: float, ctas: int, repeats: int | None = None) -> float:
        buf, launch = self.reader(name, nbytes, ctas)
        t = timing.time_cuda_graph(launch, repeats=repeats or self.repeats)
        del buf
        return t.median_ms * 1e3

    def floor_us(self, nbytes: float) -> float:
        """The pure read's time for ``nbytes`` (rounded to 0.1 MB)."""
        key = round(nbytes / 1e5)
        if key not in self.cache:
            self.cache[key] = self.time_us("read8", key * 1e5, 8)
        return self.cache[key]

    def chain_us(self, nbytes: float) -> float:
        """The pure read of ``nbytes`` (rounded to 0.1 MB) per launch in a chained timing
        (timing.time_cuda_chain: back to back from one graph, each launch on its own cold buffer)."""
        key = ("chain", round(nbytes / 1e5))
        if key not in self.cache:
            readers = [self.reader("read8", key[1] * 1e5, 8) for _ in range(timing.chain_copies(key[1] * 1e5))]
            self.cache[key] = timing.time_cuda_chain([launch for _, launch in readers],
                                                     repeats=self.repeats).median_ms * 1e3
            del readers
        return self.cache[key]


def probe_arguments(doc: str, repeats: int) -> argparse.Namespace:
    """--out and --repeats, the arguments every timing probe here takes (its docstring's first paragraph
    as the description)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument("--repeats", type=int, default=repeats)
    return parser.parse_args()


def main() -> None:
    args = probe_arguments(__doc__, 40)
    probe = ReadFloor(args.repeats)
    rows = []
    t = timing.time_cuda_graph(probe.launcher("empty_kernel", (1,), (32,)), repeats=args.repeats)
    rows.append({"kernel": "empty", "mb": 0.0, "us": t.median_ms * 1e3})
    print(f"empty kernel (1 CTA): {t.median_ms * 1e3:.2f} us", flush=True)
    t = timing.time_cuda_chain([probe.launcher("empty_kernel", (1,), (32,))] * 16, repeats=args.repeats)
    rows.append({"kernel": "empty, chained x16", "mb": 0.0, "us": t.median_ms * 1e3})
    print(f"empty kernel (1 CTA), per launch of 16 chained: {t.median_ms * 1e3:.2f} us", flush=True)
    for mb in SIZES_MB:
        for name, ctas in (("read4", 4), ("read8", 4), ("read8", 8)):
            us = probe.time_us(name, mb * 1e6, ctas, args.repeats if mb < 1000 else 10)
            rows.append({"kernel": f"{name} x{ctas} CTAs/SM", "mb": mb, "us": us, "tbs": mb * 1e6 / (us * 1e-6) / 1e12})
            print(f"{name} {ctas} CTAs/SM {mb:7.1f} MB: {us:8.2f} us = {rows[-1]['tbs']:.2f} TB/s", flush=True)
        if mb < 1000:
            us = probe.chain_us(mb * 1e6)
            rows.append({"kernel": "read8 x8 CTAs/SM, chained", "mb": mb, "us": us, "tbs": mb * 1e6 / (us * 1e-6) / 1e12})
            print(f"read8 8 CTAs/SM {mb:7.1f} MB chained: {us:8.2f} us = {rows[-1]['tbs']:.2f} TB/s", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
