"""The machine a benchmark ran on, and its measured copy bandwidth (the roofline's denominator).

Numbers are only comparable with their context: the GPU, its clocks and driver, and the library
versions (cuBLAS and cuSPARSE come with torch's CUDA build). This is collected once per run and
recorded beside every row. The copy bandwidth is measured, not taken from the datasheet, because
"% of roofline" should say how close a kernel gets to what this card can actually stream.
"""
from __future__ import annotations

import platform
import subprocess
import sys
from importlib import metadata

NVIDIA_SMI_FIELDS = ("name", "driver_version", "clocks.sm", "clocks.max.sm", "clocks.mem", "clocks.max.mem",
                     "power.limit", "temperature.gpu", "persistence_mode")
COPY_BYTES_GPU = 1 << 30   # 1 GiB source + 1 GiB destination: far beyond any L2
COPY_BYTES_CPU = 1 << 26


def _version(*dists: str) -> str | None:
    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def nvidia_smi() -> dict[str, str] | None:
    """The first GPU's nvidia-smi fields (clocks in MHz, power in W), or None without nvidia-smi."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(NVIDIA_SMI_FIELDS)}",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0 or not out.stdout.strip():
        return None
    values = [v.strip() for v in out.stdout.strip().splitlines()[0].split(",")]
    return dict(zip(NVIDIA_SMI_FIELDS, values))


def _host_memory_bytes() -> int | None:
    import os

    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def collect_environment(backend: str) -> dict:
    """GPU (name, SMs, L2, memory, compute capability, nvidia-smi clocks/driver) and versions."""
    import numpy
    import torch

    from sparseditto import __version__

    env = {
        "backend": backend,
        "timings_are_gpu": backend == "cuda",
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "host": platform.node(),
        "sparseditto": __version__,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": _version("triton"),
        "cupy": _version("cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x", "cupy"),
        "numpy": numpy.__version__,
        "scipy": _version("scipy"),
        "host_memory_bytes": _host_memory_bytes(),
    }
    if backend == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, sm_count=props.multi_processor_count,
                   l2_bytes=int(getattr(props, "L2_cache_size", 0) or 0), gpu_memory_bytes=int(props.total_memory),
                   compute_capability=f"{props.major}.{props.minor}")
        smi = nvidia_smi()
        if smi:
            env["nvidia_smi"] = smi
            env["driver"] = smi.get("driver_version")
    else:
        env["gpu"] = None
        env["note"] = "CPU (Triton interpreter): not GPU timings; only correctness means anything"
    return env


def measure_copy_bandwidth(backend: str, repeats: int = 20) -> dict:
    """Sustained device-to-device copy bandwidth, GB/s, counting read + write bytes.

    GPU: ``dst.copy_(src)`` on 1 GiB buffers timed with CUDA events (the harness's timer, no L2
    flush needed at that size), median of ``repeats``. Interpreter runs: the same on the CPU, so
    the (meaningless) CPU % of roofline is at least computed the same way.
    """
    import torch

    from sparseditto.harness.timing import time_cpu, time_cuda

    gpu = backend == "cuda"
    size = COPY_BYTES_GPU if gpu else COPY_BYTES_CPU
    device = "cuda" if gpu else "cpu"
    src = torch.empty(size, dtype=torch.uint8, device=device)
    src.fill_(1)
    dst = torch.empty_like(src)
    if gpu:
        timing = time_cuda(lambda: dst.copy_(src), repeats=repeats, warmup=3, flush=False)
    else:
        timing = time_cpu(lambda: dst.copy_(src), repeats=max(3, repeats // 4), warmup=1)
    del src, dst
    if gpu:
        torch.cuda.empty_cache()
    gbs = 2 * size / (timing.median_ms * 1e-3) / 1e9
    return {"copy_bandwidth_gbs": round(gbs, 1), "copy_bytes": 2 * size, "copy_median_ms": timing.median_ms,
            "copy_device": device}
