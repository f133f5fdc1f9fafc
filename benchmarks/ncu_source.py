"""Where a latency-bound decode kernel's warps wait, instruction by instruction (Nsight Compute's
SourceCounters stall sampling on one launch).

ncu_probe.py gives the stall reasons averaged over the kernel ("wait 2.31, long scoreboard 1.89 per
issue"); that does not say *which* wait: the A barrier, the B barrier, the wgmma drain or the
split-K cluster barrier. This profiles one spmm call of one template with the SourceCounters and
WarpStateStats sections (the same child process, NVTX range and scrubbed environment as the
profiler node's ncu), keeps the report, and prints the SASS lines that hold the most stall samples
with their share, plus the report's CSV for a closer look.

  python3 benchmarks/ncu_source.py --shape 11008x4096 --style nm24 -n 64 tc_sp24 --out out/ncu_src
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))

SAMPLES_COLUMN = "Warp Stall Sampling (All Samples)"


def top_stalls(source_csv: str, count: int) -> tuple[int, list[tuple[int, str]]]:
    """(all samples, [(samples, SASS line)] for the `count` lines with the most) from ncu's source
    page CSV; ncu writes one header row, then one row per SASS instruction."""
    rows = list(csv.reader(io.StringIO(source_csv)))
    head = next((i for i, r in enumerate(rows) if SAMPLES_COLUMN in r), None)
    if head is None:
        raise ValueError(f"no {SAMPLES_COLUMN!r} column in ncu's source page (first rows: {rows[:2]})")
    cols = rows[head]
    at, src = cols.index(SAMPLES_COLUMN), cols.index("Source") if "Source" in cols else 1
    lines = []
    for r in rows[head + 1:]:
        if len(r) > max(at, src) and r[at].replace(",", "").strip().isdigit():
            lines.append((int(r[at].replace(",", "")), r[src].strip()))
    total = sum(s for s, _ in lines)
    return total, sorted(lines, key=lambda x: -x[0])[:count]


def main(argv=None) -> int:
    from llm_layers import SHAPES, prune

    from sparseditto.harness.candidate_spec import as_spec
    from sparseditto.harness.ncu import NVTX_RANGE, child_inputs, find_ncu, profiled_kernel
    from sparseditto.kernel_templates.registry import get_template

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("template")
    ap.add_argument("--shape", default="11008x4096", choices=sorted(SHAPES))
    ap.add_argument("--style", default="nm24")
    ap.add_argument("--sparsity", type=float, default=0.5)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--params", default="{}", help="JSON launch params (defaults otherwise)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out", type=Path, default=Path("out/ncu_source"))
    args = ap.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    ncu = find_ncu(None)
    if ncu is None:
        print("ncu not found")
        return 1
    m, k = SHAPES[args.shape]
    matrix = prune(m, k, args.style, args.sparsity, seed=0)
    spec = as_spec(get_template(args.template).instantiate(json.loads(args.params)))
    kernel, why = profiled_kernel(spec, matrix, "float16")
    if kernel is None:
        print(why)
        return 1
    report = out / "report"
    with tempfile.TemporaryDirectory(prefix="sparseditto-ncu-src-") as work:   # the matrix (~100 MB) stays out of `out`
        args_path, env = child_inputs(work, kernel, matrix, args.n, "float16")
        cmd = [ncu, "--clock-control", "none", "--target-processes", "all", "--nvtx", "--nvtx-include", f"{NVTX_RANGE}/",
               "--kernel-name", "regex:tc_", "--launch-count", "1", "--section", "SourceCounters",
               "--section", "WarpStateStats", "--section", "LaunchStats", "--section", "Occupancy", "-f",
               "-o", str(report), sys.executable, "-m", "sparseditto.harness.ncu_child", args_path]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work, timeout=240)
    if proc.returncode != 0:
        print(proc.stdout[-2000:], proc.stderr[-2000:])
        return 1
    details = subprocess.run([ncu, "-i", f"{report}.ncu-rep", "--page", "details"], capture_output=True, text=True)
    (out / "details.txt").write_text(details.stdout)
    print("\n".join(line for line in details.stdout.splitlines()
                    if any(w in line for w in ("Cluster", "Waves", "Occupancy", "Warp Cycles", "Active Warps",
                                               "Block Limit", "Duration", "tc_")))[:4000])
    source = subprocess.run([ncu, "-i", f"{report}.ncu-rep", "--page", "source", "--csv", "--print-source", "sass"],
                            capture_output=True, text=True)
    (out / "source.csv").write_text(source.stdout)
    try:
        total, top = top_stalls(source.stdout, args.top)
    except ValueError as exc:
        print(exc, source.stderr[-1000:])
        return 1
    print(f"{total} stall samples; the {len(top)} SASS lines holding the most:")
    for samples, line in top:
        print(f"  {100.0 * samples / max(1, total):5.1f}%  {samples:7d}  {line[:110]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
