"""Check that `make demo` on a fresh clone, on a machine with only Python, picks the CPU torch build.

What it does (stdlib only; run it with any Python 3.10+ from the repository root):

1. A stand-in for PyTorch's CPU index: a PEP 503 page served on 127.0.0.1 from a folder holding a
   CPU torch wheel and torch's dependencies (``--wheels DIR``; the dependencies are fetched with
   ``pip download`` when missing). It stands in for https://download.pytorch.org/whl/cpu, which
   serves exactly such files, on machines that cannot reach it (ours reach only PyPI).
2. A fresh ``git clone`` of this repository into a temporary folder.
3. ``make demo`` there with pip's configuration and local wheel folders switched off
   (``PIP_CONFIG_FILE=/dev/null``, no ``PIP_FIND_LINKS``: a container-like machine without a local
   torch wheel) and ``TORCH_CPU_INDEX`` pointing at the stand-in.
4. Checks: the venv's torch is a ``+cpu`` build without CUDA, no ``nvidia-*`` package was
   installed, the demo ran.
5. The fallback: an index that accepts connections but never answers must cost at most the probe's
   timeout (5 s) before install.py falls back to the default index (a dry run shows what that
   index would give: on PyPI, the CUDA build, which is why the CPU index comes first).

Exit code 0 when every check passes. ``--keep`` leaves the temporary folder for inspection.
"""
from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def clean_env(**extra: str) -> dict:
    """The environment of a machine with no pip configuration and no local wheels."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
    for key in ("VIRTUAL_ENV", "PYTHONPATH", "SPARSEDITTO_CACHE_DIR"):
        env.pop(key, None)
    return env


def normalize(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def build_index(wheels: Path, index: Path, torch_version: str) -> None:
    """Copy the CPU torch wheel and its dependencies into ``index`` as a PEP 503 simple index."""
    files = index / "files"
    files.mkdir(parents=True)
    cpu = sorted(wheels.glob(f"torch-{torch_version}+cpu-*.whl"))
    if not cpu:
        raise SystemExit(f"no torch-{torch_version}+cpu wheel in {wheels}")
    # torch's dependencies, as PyTorch's CPU index also serves them (fetched from the registry)
    fetched = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--dest", str(files), "--find-links",
                              str(wheels), "--only-binary", ":all:", str(cpu[-1])], capture_output=True, text=True)
    if fetched.returncode != 0:
        raise SystemExit(f"pip download of torch's dependencies failed:\n{fetched.stderr[-3000:]}")
    by_project: dict[str, list[Path]] = {}
    for f in files.iterdir():
        by_project.setdefault(normalize(f.name.split("-")[0]), []).append(f)
    for project, found in by_project.items():
        page = index / "simple" / project
        page.mkdir(parents=True)
        links = "".join(f'<a href="../../files/{f.name}">{f.name}</a><br>\n' for f in sorted(found))
        (page / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:   # one line per request would bury the check's own output
        pass


def serve(folder: Path) -> tuple[str, http.server.ThreadingHTTPServer]:
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/simple", server


def stalling_index() -> tuple[str, socket.socket]:
    """An address that accepts TCP connections and never answers (a filtered or hung index)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    return f"http://127.0.0.1:{sock.getsockname()[1]}/whl/cpu", sock


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--wheels", default=os.environ.get("PIP_FIND_LINKS", "/opt/wheels"),
                   help="folder holding a CPU torch wheel (default: $PIP_FIND_LINKS or /opt/wheels)")
    p.add_argument("--torch", default="2.13.0", help="torch version the Makefile pins")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = p.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="sparseditto-install-check-"))
    failures: list[str] = []
    try:
        print(f"[1/5] stand-in CPU index from {args.wheels}")
        build_index(Path(args.wheels), work / "index", args.torch)
        url, server = serve(work / "index")
        print(f"      serving {url}")

        print("[2/5] fresh clone")
        clone = work / "clone"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)

        print("[3/5] make demo on the clone, no pip config, no local wheels (this installs everything)")
        started = time.monotonic()
        env = clean_env(TORCH_CPU_INDEX=url, SPARSEDITTO_CACHE_DIR=str(work / "cache"))
        demo = subprocess.run(["make", "-C", str(clone), "demo", f"TORCH_CPU_INDEX={url}"], env=env,
                              capture_output=True, text=True)
        print("\n".join("      " + line for line in demo.stdout.splitlines()[:8]))
        print(f"      make demo: exit {demo.returncode} after {time.monotonic() - started:.0f} s")
        if demo.returncode != 0:
            failures.append(f"make demo failed: {demo.stderr[-2000:]}")

        print("[4/5] which torch the venv holds")
        py = clone / ".venv" / "bin" / "python"
        probe = subprocess.run([str(py), "-c", "import json, torch; print(json.dumps([torch.__version__, "
                                "torch.version.cuda]))"], capture_output=True, text=True, env=env)
        listed = subprocess.run([str(py), "-m", "pip", "list", "--format", "json"], capture_output=True, text=True,
                                env=env)
        if probe.returncode != 0 or listed.returncode != 0:
            failures.append(f"cannot inspect the venv: {probe.stderr[-500:]} {listed.stderr[-500:]}")
        else:
            torch_version, cuda = json.loads(probe.stdout)
            nvidia = [d["name"] for d in json.loads(listed.stdout) if d["name"].lower().startswith("nvidia")]
            print(f"      torch {torch_version}, CUDA {cuda}; nvidia packages: {nvidia or 'none'}")
            if not torch_version.endswith("+cpu") or cuda is not None:
                failures.append(f"torch {torch_version} (CUDA {cuda}) is not the CPU build")
            if nvidia:
                failures.append(f"CUDA packages were installed: {nvidia}")
        server.shutdown()

        print("[5/5] an index that never answers: install.py must fall back within its probe timeout")
        stall, sock = stalling_index()
        started = time.monotonic()
        dry = subprocess.run([str(py), str(clone / "scripts" / "install.py"), "--dry-run", "--torch-only",
                              "--cpu-index", stall], cwd=clone, env=clean_env(), capture_output=True, text=True)
        took = time.monotonic() - started
        sock.close()
        print("\n".join("      " + line for line in dry.stdout.splitlines()))
        probe_line = next((line for line in dry.stdout.splitlines() if "not reachable" in line), "")
        waited = re.search(r", (\d+\.\d) s\)", probe_line)
        if dry.returncode != 0 or not probe_line or waited is None:
            failures.append(f"the fallback did not happen: {dry.stdout[-1000:]} {dry.stderr[-1000:]}")
        elif "timed out" not in probe_line or float(waited.group(1)) > 6.0:
            failures.append(f"the probe did not stop at its 5 s timeout: {probe_line}")
        print(f"      the whole dry run took {took:.0f} s")
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("OK: a fresh clone's `make demo` installs the CPU torch build and runs; a hung index costs 5 s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
