"""How fast the CTA stream's load structure alone can read a weight-sized buffer on the GPU.

Why: tc_words_grp (LOAD="group") reads 11008x4096's 50% pack (~72 MB) at ~2.9 TB/s, ~74% of a chained pure
read, and neither more stages (PIPE 2 -> 4) nor bigger ones (STAGE_CHUNKS) moved it (session 35). The
question this probe answers before any decoder work: is that rate the copy engine's stream structure (a
producer warp, one cp.async.bulk per stage, full/empty mbarriers, one wave of CTAs), or the decode behind
it? Its kernel is that skeleton with the decode left out (the consumer warps touch one word of each stage
and release it), timed exactly as the kernels are (harness.timing.time_cuda_chain: each launch on its own
L2-cold copy, back to back from one graph), over grids and stage shapes:

    * ``items`` work items of ``item_bytes`` (one CTA's K slice of a row group), ``stage_bytes`` per stage,
      ``pieces`` bulk copies per stage, PIPE stages in flight;
    * one CTA per item (as tc_words_grp) or a persistent grid of ``ctas`` CTAs walking items
      blockIdx.x, + gridDim.x, ... with one pipeline across them;
    * shared memory padded to ``smem_kb`` per CTA, which sets the CTAs per SM.

On the GPU, from the repo root (benchmarks/device_run.sh's set-up):
    python3 benchmarks/bulk_stream_probe.py [--out FILE.json]
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from sparseditto.harness import timing
from sparseditto.kernel_templates import runtime as rt

HELPERS = Path(__file__).resolve().parents[1] / "kernel_templates" / "cuda" / "tc_stream.cu"

PROBE = r"""
// The CTA stream without its decoder: warp CONSUMERS (the last) is the producer, lane 0 of it issuing
// `pieces` bulk copies per stage into PIPE stages on full / empty mbarriers; each consumer warp waits for a
// stage, reads one word of it per lane when `touch`, and arrives on its empty barrier.
template <int PIPE, int CONSUMERS>
__device__ void bulk_skeleton(const unsigned char* __restrict__ src, long long item_bytes, int stage_bytes,
                              int pieces, int items, int touch, int* out) {
    extern __shared__ __align__(16) unsigned char smem[];
    const u32 bars = smem_addr(smem);                  // full[PIPE], empty[PIPE]
    const u32 stage0 = bars + 128;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x == 0) {
        for (int s = 0; s < PIPE; ++s) {
            mbar_init(bars + 8 * s, 1);
            mbar_init(bars + 8 * (PIPE + s), CONSUMERS);
        }
        fence_barrier_init();
    }
    __syncthreads();
    const int per_item = (int)(item_bytes / stage_bytes);
    const int mine = items > (int)blockIdx.x ? (items - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    const int total = mine * per_item;
    if (warp == CONSUMERS) {
        if (lane == 0) {
            const u32 piece = (u32)(stage_bytes / pieces);
            for (int i = 0; i < total; ++i) {
                const int s = i % PIPE;
                if (i >= PIPE) mbar_wait(bars + 8 * (PIPE + s), ((i / PIPE) - 1) & 1);
                const long long item = blockIdx.x + (long long)(i / per_item) * gridDim.x;
                const unsigned char* p = src + item * item_bytes + (long long)(i % per_item) * stage_bytes;
                mbar_expect_tx(bars + 8 * s, (u32)stage_bytes);
                for (int q = 0; q < pieces; ++q)
                    bulk_copy(stage0 + (u32)(s * stage_bytes) + q * piece, p + (long long)q * piece, piece, bars + 8 * s);
            }
        }
        return;
    }
    u32 acc = 0;
    for (int i = 0; i < total; ++i) {
        const int s = i % PIPE;
        mbar_wait(bars + 8 * s, (i / PIPE) & 1);
        if (touch) {
            u32 v;
            asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(stage0 + (u32)(s * stage_bytes) + 4u * threadIdx.x));
            acc ^= v;
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(bars + 8 * (PIPE + s));
    }
    if (acc == 0x9e3779b9u) out[0] = (int)acc;
}
extern "C" __global__ void __launch_bounds__(288) skel_p2(const unsigned char* s, long long ib, int sb, int pc, int it, int t, int* o) { bulk_skeleton<2, 8>(s, ib, sb, pc, it, t, o); }
extern "C" __global__ void __launch_bounds__(288) skel_p4(const unsigned char* s, long long ib, int sb, int pc, int it, int t, int* o) { bulk_skeleton<4, 8>(s, ib, sb, pc, it, t, o); }
extern "C" __global__ void __launch_bounds__(288) skel_p8(const unsigned char* s, long long ib, int sb, int pc, int it, int t, int* o) { bulk_skeleton<8, 8>(s, ib, sb, pc, it, t, o); }
"""

KB = 1024
STAGE_50 = 13 * KB    # ~ a CTA's chunk run at 50% (8 warps' blobs of ~1.6 KiB)
STAGE_70 = 9 * KB     # ~ at 70%


def configs():
    """(label, kernel, items, item_bytes, stage_bytes, pieces, ctas or None (= one per item), smem_kb, touch):
    the measured kernel's geometry first (11008x4096 50% N = 16: 86 row groups x split 4, 16 chunks each, 3
    CTAs per SM), then one change at a time."""
    base = 344, 16 * STAGE_50, STAGE_50
    rows = [
        ("grp 50%: 344 CTAs, PIPE 2, 60 KB", "skel_p2", *base, 1, None, 60, 1),
        ("  no touch", "skel_p2", *base, 1, None, 60, 0),
        ("  PIPE 4", "skel_p4", *base, 1, None, 60, 1),
        ("  PIPE 4, 4 pieces", "skel_p4", *base, 4, None, 60, 1),
        ("  PIPE 8 of 6.5 KB", "skel_p8", 344, 16 * STAGE_50, STAGE_50 // 2, 1, None, 60, 1),
        ("  1 CTA/SM (200 KB)", "skel_p2", *base, 1, None, 200, 1),
        ("  2 CTAs/SM (100 KB)", "skel_p2", *base, 1, None, 100, 1),
        ("grp 70%: 344 CTAs, PIPE 2, 9 KB stages", "skel_p2", 344, 16 * STAGE_70, STAGE_70, 1, None, 50, 1),
        ("split 8: 688 CTAs x 8 stages, 40 KB", "skel_p2", 688, 8 * STAGE_50, STAGE_50, 1, None, 40, 1),
        ("split 8: 688 CTAs, PIPE 4, 60 KB", "skel_p4", 688, 8 * STAGE_50, STAGE_50, 1, None, 60, 1),
        ("split 16: 1376 CTAs x 4 stages, 30 KB", "skel_p2", 1376, 4 * STAGE_50, STAGE_50, 1, None, 30, 1),
    ]
    for per_sm, smem in ((1, 200), (2, 100), (3, 60), (4, 52), (6, 36)):
        pipe = "skel_p4" if smem >= 56 else "skel_p2"
        rows.append((f"persistent {per_sm}/SM, 1376 items of 4 stages, {pipe[-2:]}", pipe, 1376, 4 * STAGE_50,
                     STAGE_50, 1, per_sm, smem, 1))
    return rows


class BulkProbe:
    def __init__(self, repeats: int):
        import cupy as cp

        self.device = torch.device("cuda")
        self.sms = rt.sm_count(self.device)
        source = HELPERS.read_text() + PROBE
        module = cp.RawModule(code=source, options=("-std=c++17", "-arch=sm_90"))
        self.kernels = {name: module.get_function(name) for name in ("skel_p2", "skel_p4", "skel_p8")}
        for k in self.kernels.values():
            k.max_dynamic_shared_size_bytes = 220 * KB
        self.sink = torch.zeros(4, dtype=torch.int32, device=self.device)
        self.scratch: dict = {}
        self.repeats = repeats

    def time_us(self, kernel, items, item_bytes, stage_bytes, pieces, ctas, smem_kb, touch) -> float:
        nbytes = items * item_bytes
        grid = items if ctas is None else ctas * self.sms
        smem = smem_kb * KB
        if 128 + (8 if kernel == "skel_p8" else 4 if kernel == "skel_p4" else 2) * stage_bytes > smem:
            raise ValueError(f"{kernel} with {stage_bytes}-byte stages does not fit {smem_kb} KB")
        copies = [torch.randint(0, 2 ** 31 - 1, (nbytes // 4,), dtype=torch.int32, device=self.device)
                  for _ in range(timing.chain_copies(nbytes))]
        fn = self.kernels[kernel]

        def launcher(buf):
            def launch():
                dev, stream = rt.cupy_stream(self.scratch, self.device)
                with dev, stream:
                    fn((grid,), (288,), (np.uint64(buf.data_ptr()), np.int64(item_bytes), np.int32(stage_bytes),
                                         np.int32(pieces), np.int32(items), np.int32(touch),
                                         np.uint64(self.sink.data_ptr())), shared_mem=smem)
            return launch

        t = timing.time_cuda_chain([launcher(b) for b in copies], repeats=self.repeats)
        del copies
        return t.median_ms * 1e3


def main() -> None:
    from read_floor_probe import ReadFloor, probe_arguments

    args = probe_arguments(__doc__, 30)

    probe = BulkProbe(args.repeats)
    floor = ReadFloor(args.repeats)
    rows = []
    for label, kernel, items, item_bytes, stage_bytes, pieces, ctas, smem_kb, touch in configs():
        nbytes = items * item_bytes
        us = probe.time_us(kernel, items, item_bytes, stage_bytes, pieces, ctas, smem_kb, touch)
        read = floor.chain_us(nbytes)
        rows.append({"config": label, "mb": nbytes / 1e6, "us": us, "tbs": nbytes / us / 1e6,
                     "pure_read_us": read, "of_pure_read": read / us})
        print(f"{label:48s} {nbytes / 1e6:6.1f} MB {us:7.2f} us {nbytes / us / 1e6:5.2f} TB/s "
              f"(pure read {read:6.2f} us: {read / us:5.1%})", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
