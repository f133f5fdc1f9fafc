"""Nsight Compute on the decode tier: where a tensor-core streaming kernel's time goes.

Runs one template on one pruned layer under ncu (through sparseditto.harness.ncu, the same path the
profiler node takes) with the memory, issue and stall metrics that tell a bandwidth-bound kernel
from a latency- or LSU-bound one, and prints them.
  python3 benchmarks/ncu_probe.py --shape 4096x4096 --style magnitude --sparsity 0.5 -n 16 tc_bitmap tc_dense
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

PROBE_METRICS = (
    "gpu__time_duration.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__bytes_read.sum",
    "lts__t_bytes.sum",
    "lts__t_sectors_op_read.sum",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.per_cycle_active",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "smsp__inst_executed.sum",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio",
    "launch__registers_per_thread",
    "launch__grid_size",
    "launch__occupancy_limit_registers",
    "launch__occupancy_limit_shared_mem",
    "launch__occupancy_limit_warps",
    "launch__waves_per_multiprocessor",
    "launch__block_size",
    "launch__shared_mem_per_block_dynamic",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
)


def main(argv=None) -> int:
    from llm_layers import SHAPES, prune

    from sparseditto.harness.ncu import parse_ncu_csv, profile_ncu
    from sparseditto.kernel_templates.registry import get_template

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("templates", nargs="+")
    ap.add_argument("--shape", default="4096x4096", choices=sorted(SHAPES))
    ap.add_argument("--style", default="magnitude")
    ap.add_argument("--sparsity", type=float, default=0.5)
    ap.add_argument("-n", type=int, default=16)
    ap.add_argument("--params", default="{}",
                    help='JSON launch params for every template, e.g. \'{"SPLIT": 2}\' (defaults otherwise)')
    args = ap.parse_args(argv)
    params = json.loads(args.params)
    m, k = SHAPES[args.shape]
    matrix = prune(m, k, args.style, args.sparsity, seed=0)
    for name in args.templates:
        res = profile_ncu(get_template(name).instantiate(params), matrix, args.n, "float16", kernel_regex="tc_",
                          metrics=PROBE_METRICS, launch_count=1)
        print(f"== {name} {params} {args.shape} {args.style} {args.sparsity} N={args.n}: available={res.available} {res.note} kernels={res.kernels}")
        for row in parse_ncu_csv(res.raw_csv or ""):
            print(f"   {row.get('Metric Name', ''):80s} {row.get('Metric Value', '')} {row.get('Metric Unit', '')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
