"""Nsight Compute on one launch of a candidate (`profile_ncu`), parsed into a small metric dict.

ncu runs ``python -m sparseditto.harness.ncu_child <args.json>`` in its own process: the child
loads the candidate, runs ``prepare`` and a few warm-up launches, then exactly one ``spmm`` inside an
NVTX range; ``--nvtx --nvtx-include sparseditto_spmm/`` restricts profiling to the kernels of that
call, so format conversion, warm-up, L2 flushes and dense reference kernels are never profiled.
The CSV (``--csv``, long format: one row per kernel and metric) is parsed into:

==============================  ===============================================================
duration_us                     sum of gpu__time_duration.sum over the profiled kernels
dram_throughput_pct             dram__throughput.avg.pct_of_peak_sustained_elapsed
memory_throughput_pct           gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed
sm_throughput_pct               sm__throughput.avg.pct_of_peak_sustained_elapsed
achieved_occupancy_pct          sm__warps_active.avg.pct_of_peak_sustained_active
l2_hit_rate_pct                 lts__t_sector_hit_rate.pct
dram_bytes_read / _write        dram__bytes_read.sum / dram__bytes_write.sum (bytes, summed)
registers_per_thread            launch__registers_per_thread (max over kernels)
shared_mem_per_block_bytes      launch__shared_mem_per_block_static + _dynamic (max)
grid_size / block_size          launch__grid_size / launch__block_size (of the longest kernel)
kernels                         number of kernels profiled
==============================  ===============================================================

Percentages are duration-weighted over kernels. Missing ncu, no GPU, restricted counters
(ERR_NVGPUCTRPERM), a timeout or unparsable output give ``NcuResult(available=False, note=...)``,
never an exception.
"""
from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from .candidate_spec import as_spec
from .results import NcuResult

NVTX_RANGE = "sparseditto_spmm"
DEFAULT_METRICS = (
    "gpu__time_duration.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "lts__t_sector_hit_rate.pct",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "launch__registers_per_thread",
    "launch__shared_mem_per_block_static",
    "launch__shared_mem_per_block_dynamic",
    "launch__grid_size",
    "launch__block_size",
)
_WEIGHTED = {
    "dram_throughput_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "memory_throughput_pct": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "sm_throughput_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "l2_hit_rate_pct": "lts__t_sector_hit_rate.pct",
}
_UNIT_SCALE = {
    # time -> nanoseconds
    "nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6,
    "second": 1e9, "s": 1e9,
    # size -> bytes (ncu uses decimal prefixes)
    "byte": 1.0, "b": 1.0, "kbyte": 1e3, "kb": 1e3, "mbyte": 1e6, "mb": 1e6, "gbyte": 1e9, "gb": 1e9,
    "kib": 1024.0, "mib": 1024.0 ** 2, "gib": 1024.0 ** 3,
}
_COMMON_NCU_PATHS = ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/ncu")


# ---- CSV parsing (pure; unit-tested on CPU) --------------------------------------------------------

def parse_number(value: str, unit: str = "") -> float | None:
    """A metric value in base units (ns, bytes, %, counts); None for 'n/a' and the like."""
    text = (value or "").strip().strip('"')
    if not text or text.lower() in ("n/a", "nan", "-"):
        return None
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", text):
        text = text.replace(",", "")          # thousands separators: 1,234.5
    elif re.fullmatch(r"-?\d+,\d+", text):
        text = text.replace(",", ".")         # decimal comma locale: 9,50
    try:
        number = float(text)
    except ValueError:
        return None
    base_unit = (unit or "").strip().lower().split("/")[0]  # "Kbyte/block" -> "kbyte"
    return number * _UNIT_SCALE.get(base_unit, 1.0)


def parse_ncu_csv(text: str) -> list[dict]:
    """Rows of ncu's ``--csv`` output as dicts with at least ID, Kernel Name, Metric Name,
    Metric Unit, Metric Value. Accepts the long ``details`` layout and the wide ``raw`` page;
    skips ``==PROF==``/``==WARNING==`` lines and anything before the header."""
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("==")]
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith('"ID"')), None)
    if start is None:
        return []
    reader = csv.reader(io.StringIO("\n".join(lines[start:])))
    header = next(reader, None)
    if not header:
        return []
    records = [row for row in reader if row]
    if "Metric Name" in header and "Metric Value" in header:
        out = []
        for row in records:
            if len(row) != len(header):
                continue
            out.append(dict(zip(header, row)))
        return out
    # Wide layout: one column per metric, an optional units row (empty ID) under the header.
    units = {}
    if records and not records[0][0].strip():
        units = dict(zip(header, records[0]))
        records = records[1:]
    metric_cols = [h for h in header if "__" in h]
    out = []
    for row in records:
        if len(row) != len(header):
            continue
        base = dict(zip(header, row))
        for col in metric_cols:
            out.append({"ID": base.get("ID", ""), "Kernel Name": base.get("Kernel Name", ""),
                        "Metric Name": col, "Metric Unit": units.get(col, ""), "Metric Value": base[col]})
    return out


def summarize_ncu_rows(rows: list[dict]) -> tuple[dict[str, float], list[str]]:
    """(metric dict as documented in the module docstring, kernel names in launch order)."""
    per_kernel: dict[str, dict[str, float]] = {}
    names: dict[str, str] = {}
    for row in rows:
        kid = str(row.get("ID", "")).strip()
        name = str(row.get("Metric Name", "")).strip()
        value = parse_number(row.get("Metric Value", ""), row.get("Metric Unit", ""))
        if not name or value is None:
            continue
        per_kernel.setdefault(kid, {})[name] = value
        names.setdefault(kid, str(row.get("Kernel Name", "")).strip())
    if not per_kernel:
        return {}, []
    kernels = list(per_kernel.values())
    durations = np.array([k.get("gpu__time_duration.sum", 0.0) for k in kernels])
    metrics: dict[str, float] = {"kernels": float(len(kernels))}
    if durations.sum() > 0:
        metrics["duration_us"] = float(durations.sum() / 1e3)
    weights = durations if durations.sum() > 0 else np.ones(len(kernels))
    for key, metric in _WEIGHTED.items():
        vals = [(k[metric], w) for k, w in zip(kernels, weights) if metric in k]
        if vals:
            v, w = np.array(vals).T
            metrics[key] = float((v * w).sum() / w.sum()) if w.sum() > 0 else float(v.mean())
    for key, metric in (("dram_bytes_read", "dram__bytes_read.sum"), ("dram_bytes_write", "dram__bytes_write.sum")):
        vals = [k[metric] for k in kernels if metric in k]
        if vals:
            metrics[key] = float(sum(vals))
    regs = [k["launch__registers_per_thread"] for k in kernels if "launch__registers_per_thread" in k]
    if regs:
        metrics["registers_per_thread"] = float(max(regs))
    smem = [k.get("launch__shared_mem_per_block_static", 0.0) + k.get("launch__shared_mem_per_block_dynamic", 0.0)
            for k in kernels if "launch__shared_mem_per_block_static" in k or "launch__shared_mem_per_block_dynamic" in k]
    if smem:
        metrics["shared_mem_per_block_bytes"] = float(max(smem))
    longest = kernels[int(np.argmax(durations))]
    for key, metric in (("grid_size", "launch__grid_size"), ("block_size", "launch__block_size")):
        if metric in longest:
            metrics[key] = float(longest[metric])
    return metrics, [names[k] for k in per_kernel]


def csv_section(text: str) -> str | None:
    """The CSV part of ncu's output (header onward, without ==PROF== lines), or None."""
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("==")]
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith('"ID"')), None)
    return "\n".join(lines[start:]) if start is not None else None


# ---- running ncu ----------------------------------------------------------------------------------

def find_ncu(ncu_path: str | None = None) -> str | None:
    if ncu_path:
        return ncu_path if os.path.isfile(ncu_path) and os.access(ncu_path, os.X_OK) else None
    found = shutil.which("ncu")
    if found:
        return found
    for path in _COMMON_NCU_PATHS:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def build_command(ncu: str, args_path: str, *, metrics=DEFAULT_METRICS, kernel_regex: str | None = None,
                  launch_count: int | None = None) -> list[str]:
    cmd = [ncu, "--clock-control", "none", "--csv", "--target-processes", "all",
           "--nvtx", "--nvtx-include", f"{NVTX_RANGE}/", "--metrics", ",".join(metrics)]
    if kernel_regex:
        cmd += ["--kernel-name", f"regex:{kernel_regex}"]
    if launch_count:
        cmd += ["--launch-count", str(int(launch_count))]
    return cmd + [sys.executable, "-m", "sparseditto.harness.ncu_child", args_path]


def profile_ncu(candidate, matrix, n: int, dtype: str = "float16", *, timeout: float = 300.0,
                ncu_path: str | None = None, metrics=DEFAULT_METRICS, kernel_regex: str | None = None,
                launch_count: int | None = None, warmup: int = 3, seed: int = 0) -> NcuResult:
    """Profile one ``spmm`` launch of ``candidate`` with Nsight Compute; never raises for
    environment problems (see module docstring)."""
    from .numerics import check_dtype
    from .verify import check_matrix

    check_matrix(matrix)
    check_dtype(dtype)
    if int(n) <= 0:
        raise ValueError(f"Expected a positive N, got {n!r}.")
    spec = as_spec(candidate)
    ncu = find_ncu(ncu_path)
    if ncu is None:
        where = f"at {ncu_path!r}" if ncu_path else "on PATH or in /usr/local/cuda/bin"
        return NcuResult(available=False, note=f"Nsight Compute (ncu) not found {where}; "
                                               f"install Nsight Compute to get hardware metrics")
    import torch

    if not torch.cuda.is_available():
        return NcuResult(available=False, note="no CUDA GPU visible; ncu profiles GPU kernels only")
    kernel, why_not = profiled_kernel(spec, matrix, dtype)
    if kernel is None:
        return NcuResult(available=False, note=why_not)

    with tempfile.TemporaryDirectory(prefix="sparseditto-ncu-") as tmp:
        args_path, env = child_inputs(tmp, kernel, matrix, n, dtype, warmup=warmup, seed=seed)
        cmd = build_command(ncu, args_path, metrics=metrics, kernel_regex=kernel_regex,
                            launch_count=launch_count)
        from . import gpu_lock

        gpu_lock.for_current_device()        # opens this GPU's lock (once) as the active one
        with gpu_lock.exclusive_section():   # alone on the GPU (gpu_lock)
            rc, stdout, stderr, timed_out = _run(cmd, env, timeout, cwd=tmp)
    return interpret_ncu_output(rc, stdout, stderr, timed_out=timed_out, timeout=timeout)


def child_inputs(workdir, kernel: dict, matrix, n: int, dtype: str, *, warmup: int = 3,
                 seed: int = 0) -> tuple[str, dict]:
    """(args.json path, environment) for ``python -m sparseditto.harness.ncu_child`` in `workdir`:
    the matrix and the child's arguments written there (`kernel` as `profiled_kernel` returns it).
    The profiled child runs candidate code, so it gets the same scrubbed environment and private
    directory as a sandboxed worker (and ncu_child installs the same audit hook)."""
    from .isolation import make_private_dirs, worker_environment
    from .source_loader import default_cache_dir

    workdir = Path(workdir)
    matrix_path = workdir / "matrix.npz"
    np.savez(matrix_path, indptr=matrix.indptr, indices=matrix.indices, data=matrix.data,
             shape=np.asarray(matrix.shape, dtype=np.int64))
    args = {"kernel": kernel, "matrix_path": str(matrix_path), "matrix_dtype": matrix.dtype, "n": int(n),
            "dtype": dtype, "warmup": int(warmup), "seed": int(seed), "range": NVTX_RANGE}
    args_path = workdir / "args.json"
    args_path.write_text(json.dumps(args), encoding="utf-8")
    make_private_dirs(workdir)
    return str(args_path), worker_environment("cuda", workdir, str(default_cache_dir()))


def profiled_kernel(spec, matrix, dtype: str) -> tuple[dict | None, str]:
    """(what the profiled child loads, '') or (None, why this kernel is not profiled).

    The check is about trust, and there are three kinds of kernel. Dense cuBLAS and the vendor
    libraries (backend "builtin", origin "vendor") are harness code without a source: nothing to
    check statically, but the library must be able to run this matrix and dtype on a GPU
    (`vendor_kernels.unavailable_reason`: cuSPARSELt only on 2:4 rows, ...); the child loads it by
    name and runs it outside the audit gate, as a worker does. A generated kernel (a template
    instance, a memory kernel or an LLM's: Triton, or CUDA C++ through CuPy) is candidate code: its
    source must pass the static checks, and the child imports it from its content-addressed file
    and runs it inside the gate."""
    from .source_loader import write_source
    from .static_checks import check_source
    from .vendor_kernels import unavailable_reason

    if spec.is_builtin:
        why = unavailable_reason(spec.template, matrix, dtype, "cuda")
        if why:
            return None, f"vendor path {spec.template} cannot run this matrix, not profiled: {why}"
        return {"vendor": spec.template}, ""
    if spec.backend not in ("triton", "cuda"):
        return None, f"cannot profile backend {spec.backend!r}"
    static = check_source(spec.source)
    if not static.ok:
        return None, "candidate failed static checks, not profiled: " + "; ".join(static.violations[:3])
    return {"source_path": str(write_source(spec.source)), "backend": spec.backend}, ""


def _run(cmd: list[str], env: dict, timeout: float, cwd: str | None = None) -> tuple[int | None, str, str, bool]:
    """Run ncu in its own session so a timeout can end it and the profiled child together."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True, cwd=cwd, stdin=subprocess.DEVNULL)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err, False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the group we created: ncu and its target only
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        return None, out or "", err or "", True


def interpret_ncu_output(rc: int | None, stdout: str, stderr: str, *, timed_out: bool = False,
                         timeout: float = 0.0) -> NcuResult:
    """Turn ncu's exit code and output into an NcuResult with a clear note."""
    combined = f"{stdout}\n{stderr}"
    if timed_out:
        return NcuResult(available=False, note=f"ncu timed out after {timeout:.0f} s (killed)")
    if "ERR_NVGPUCTRPERM" in combined:
        return NcuResult(available=False, note=(
            "GPU performance counters are restricted to admin users (ERR_NVGPUCTRPERM); run as root "
            "or load the driver with NVreg_RestrictProfilingToAdminUsers=0"))
    rows = parse_ncu_csv(stdout) or parse_ncu_csv(combined)
    if not rows:
        tail = " | ".join([line.strip() for line in combined.splitlines() if line.strip()][-4:])
        if "No kernels were profiled" in combined:
            return NcuResult(available=False, note=f"ncu profiled no kernels in the NVTX range: {tail}")
        if rc not in (0, None):
            return NcuResult(available=False, note=f"ncu exited with code {rc}: {tail}")
        return NcuResult(available=False, note=f"could not find ncu's CSV in its output: {tail}")
    metrics, kernels = summarize_ncu_rows(rows)
    if not metrics or "kernels" not in metrics:
        return NcuResult(available=False, note="ncu output had no parsable metric values",
                         raw_csv=csv_section(stdout))
    note = f"profiled {len(kernels)} kernel(s) of one spmm call: {', '.join(k[:60] for k in kernels)}"
    if rc not in (0, None):
        note += f" (ncu exit code {rc})"
    return NcuResult(available=True, note=note, metrics=metrics, raw_csv=csv_section(stdout),
                     kernels=kernels)
