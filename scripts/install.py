"""Set up SparseDitto's virtualenv the same way on every machine (what `make setup` runs).

Run with the virtualenv's own Python (stdlib only: nothing is installed yet). It picks the torch
build for the machine and installs the project with the right extras, printing one line per step;
pip's own output goes to ``<venv>/install.log`` and is shown only when a step fails.

* No NVIDIA GPU: the CPU build of torch, from PyTorch's CPU wheel index, so the multi-GB CUDA
  build is never pulled. The index is probed first with a short timeout; when it cannot be
  reached (machines that see only the package registry, like CI, where a CPU wheel is served
  locally) torch comes from the default index instead, after at most a few seconds.
* An NVIDIA GPU: torch from the default index (its CUDA build) and the CuPy extra that matches the
  driver's CUDA major version: ``gpu-cuda12`` or ``gpu`` (CUDA 13).

``--dry-run`` resolves every step with ``pip install --dry-run --report`` and prints what would be
installed (torch's version and where it comes from) without installing anything.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PROBE_TIMEOUT_S = 5.0


def gpu_cuda_major() -> int | None:
    """The CUDA major version the NVIDIA driver supports, None without a working GPU."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        listing = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
        if listing.returncode != 0 or "GPU" not in listing.stdout:
            return None
        header = subprocess.run([smi], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"CUDA Version:\s*(\d+)\.", header)
    return int(found.group(1)) if found else 13


def index_reachable(url: str, timeout: float = PROBE_TIMEOUT_S) -> tuple[bool, str]:
    """(reachable, why not): one request for the index's torch page, bounded by ``timeout``."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/torch/", timeout=timeout) as reply:
            return reply.status == 200, f"HTTP {reply.status}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return False, str(getattr(exc, "reason", exc)) or type(exc).__name__


def torch_plan(version: str, cpu_index: str, cuda_major: int | None) -> tuple[list[str], str]:
    """(pip arguments for torch, one line saying which build and why)."""
    spec = f"torch=={version}"
    if cuda_major is not None:
        return [spec], f"torch {version}: NVIDIA GPU found (CUDA {cuda_major} driver), default (CUDA) build"
    started = time.monotonic()
    ok, why = index_reachable(cpu_index)
    if ok:
        return [spec, "--index-url", cpu_index], f"torch {version}: no GPU, CPU build from {cpu_index}"
    return [spec], (f"torch {version}: no GPU; {cpu_index} not reachable ({why}, {time.monotonic() - started:.1f} s), "
                    "so from the default index (a CPU wheel where the registry serves one)")


def extras_for(cuda_major: int | None, extras: list[str]) -> list[str]:
    if cuda_major is None:
        return extras
    return extras + (["gpu-cuda12"] if cuda_major <= 12 else ["gpu"])


class Pip:
    """Runs pip quietly: output appended to the log, shown when a step fails."""

    def __init__(self, log: Path, dry_run: bool):
        self.log = log
        self.dry_run = dry_run
        self.reports: list[dict] = []

    def __call__(self, what: str, args: list[str]) -> None:
        # --no-compile: pip would byte-compile every module of torch and the dev tools (most never
        # imported); Python compiles what is imported on first use. Fresh-clone setup 121 s -> 69 s.
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-compile", *args]
        report = None
        if self.dry_run:
            report = Path(tempfile.mkstemp(suffix=".json")[1])
            cmd += ["--dry-run", "--ignore-installed", "--report", str(report)]
        print(f"  {what} ...", end="", flush=True)
        started = time.monotonic()
        with self.log.open("a") as fh:
            fh.write(f"\n$ {' '.join(cmd)}\n")
            fh.flush()
            code = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT).returncode
        print(f" {'resolved' if self.dry_run else 'done'} ({time.monotonic() - started:.0f} s)" if code == 0
              else " FAILED", flush=True)
        if code != 0:
            tail = self.log.read_text(errors="replace").splitlines()[-40:]
            print("\n".join(["", f"pip failed ({what}); the end of {self.log}:", *tail]), file=sys.stderr)
            raise SystemExit(code)
        if report is not None:
            self.reports.append(json.loads(report.read_text()))
            report.unlink()


def describe(report: dict, name: str) -> str | None:
    """'<version> from <url>' of package ``name`` in a pip installation report."""
    for item in report.get("install", []):
        if item.get("metadata", {}).get("name", "").lower() == name:
            return f"{item['metadata']['version']} from {item.get('download_info', {}).get('url', '?')}"
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--torch", default="2.13.0", help="torch version")
    p.add_argument("--triton", default="3.6.0", help="triton version (Linux)")
    p.add_argument("--cpu-index", default=os.environ.get("SPARSEDITTO_TORCH_CPU_INDEX", CPU_INDEX),
                   help="PyTorch CPU wheel index (default: %(default)s)")
    p.add_argument("--extras", default="dev", help="comma-separated extras of the project (default: dev)")
    p.add_argument("--project", default=".", help="project directory (default: .)")
    p.add_argument("--dry-run", action="store_true", help="resolve and print, install nothing")
    p.add_argument("--torch-only", action="store_true", help="only the torch step")
    args = p.parse_args(argv)

    log = Path(sys.prefix) / "install.log"
    pip = Pip(log, args.dry_run)
    cuda = gpu_cuda_major()
    torch_args, why = torch_plan(args.torch, args.cpu_index, cuda)
    print(f"setting up {sys.prefix} (pip log: {log})")
    print(f"  {why}")
    if not args.dry_run:
        pip("pip", ["--upgrade", "pip"])
    pip("torch", torch_args)
    if not args.torch_only:
        if sys.platform.startswith("linux"):
            pip("triton", [f"triton=={args.triton}"])
        extras = extras_for(cuda, [e for e in args.extras.split(",") if e])
        target = f"{args.project}[{','.join(extras)}]" if extras else args.project
        pip(f"sparseditto [{','.join(extras)}]", ["-e", target])
    if args.dry_run:
        print(f"  would install torch {describe(pip.reports[0], 'torch') or '(already satisfied)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
