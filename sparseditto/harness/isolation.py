"""Operating-system isolation of a candidate worker: environment, private dirs, limits, network.

The parent (`sandbox.WorkerPool`) builds the worker's command line and environment here; the child
(`worker.main`) applies the process limits here before it imports anything a candidate could use.
Each layer is independent of the Python audit hook in `guard`, so a candidate that escaped the
hook still finds no secrets in its environment, no descriptors but its two pipes, a CPU, file-size,
process and (on the interpreter) address-space budget, and, where the OS allows it, no network.

What is allowed through, and why:

* environment: an allow-list (PATH, locale, CUDA/NVIDIA device and toolkit variables, thread
  counts, TRITON_*/CUPY_*/NVRTC_* settings) minus anything whose name looks like a credential;
  HOME and TMPDIR point into the worker's private directory; the compiler caches (Triton, CuPy,
  the CUDA driver's JIT cache) point under ``sparseditto.paths.cache_dir()`` so they survive
  from one worker to the next.
* network: a new network namespace (only a down loopback inside) through ``os.unshare`` on
  Python >= 3.12, else the util-linux ``unshare`` tool wrapping the worker command, else none
  (the audit hook still refuses every socket). `network_layer` says which one a worker got.
* limits: no core files, at most `MAX_OPEN_FILES` descriptors, files of at most `MAX_FILE_BYTES`,
  a cap on new processes (Triton and CuPy still run ptxas/cc), a CPU-seconds budget per task,
  and on the interpreter backend an address-space cap (not on CUDA: the driver reserves
  terabytes of virtual address space for unified addressing, so RLIMIT_AS would break it).
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

# Exact names copied from the parent environment when present.
PASS_NAMES = frozenset({
    "PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_NUMERIC", "TZ", "TERM",
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_HOME", "CUDA_PATH", "CUDA_ROOT",
    "CUDA_LAUNCH_BLOCKING", "CUDA_MODULE_LOADING", "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES", "LD_LIBRARY_PATH", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS", "VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH",
    "SPARSEDITTO_WORKER_PROFILE",   # a developer's opt-in: the worker's cProfile stats per task (worker.py)
    "SPARSEDITTO_GPU_LOCK",         # 0 turns the cross-process GPU lock off (harness.gpu_lock)
    "SPARSEDITTO_DIRECT_LAUNCH",    # 1: CUDA C++ kernels verified and timed as a process with it launches them
})
# Prefixes of compiler/runtime settings the templates' toolchains read.
PASS_PREFIXES = ("TRITON_", "CUPY_", "NVRTC_")
# Names that are never passed, whatever list they matched: credentials and their kin.
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|"
                         r"^OPENAI_|^ANTHROPIC_|^AWS_|^AZURE_|^GOOGLE_|^HF_|^HUGGING", re.IGNORECASE)

MAX_OPEN_FILES = 4096
MAX_FILE_BYTES = 4 << 30
EXTRA_PROCESSES = 512          # headroom over the user's current task count (threads count too)
CPU_SECONDS_SLACK = 60.0


def cache_subdirs(cache_dir: str | os.PathLike) -> dict[str, Path]:
    """The compiler caches the workers share (created on demand), by the variable that names them."""
    base = Path(cache_dir)
    return {"TRITON_CACHE_DIR": base / "triton" / "cache", "TRITON_HOME": base / "triton",
            "CUPY_CACHE_DIR": base / "cupy", "CUDA_CACHE_PATH": base / "nv-compute-cache"}


def worker_environment(backend: str, workdir: Path, cache_dir: str | os.PathLike,
                       parent: dict[str, str] | None = None) -> dict[str, str]:
    """The complete environment of a worker: allow-listed names only, secrets removed."""
    parent = dict(os.environ if parent is None else parent)
    env = {k: v for k, v in parent.items()
           if (k in PASS_NAMES or k.startswith(PASS_PREFIXES)) and not SECRET_NAME.search(k)}
    env.pop("TRITON_INTERPRET", None)
    home, tmp = workdir / "home", workdir / "tmp"
    env.update(HOME=str(home), TMPDIR=str(tmp), TMP=str(tmp), TEMP=str(tmp),
               SPARSEDITTO_CACHE_DIR=str(cache_dir), SPARSEDITTO_WORKER_BACKEND=backend,
               PYTHONDONTWRITEBYTECODE="1", PYTHONNOUSERSITE=parent.get("PYTHONNOUSERSITE", ""),
               PYTHONFAULTHANDLER="1")
    if not env["PYTHONNOUSERSITE"]:
        del env["PYTHONNOUSERSITE"]
    for name, path in cache_subdirs(cache_dir).items():
        env.setdefault(name, str(path))
    if backend == "interpret":
        env["TRITON_INTERPRET"] = "1"
    # The worker imports this package; make that work when it runs from a source checkout.
    package_root = str(Path(__file__).resolve().parents[2])
    paths = [package_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != package_root]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def make_private_dirs(workdir: Path) -> None:
    for sub in ("home", "tmp"):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(workdir, 0o700)


# ---- network namespace -------------------------------------------------------------------------

def _netns_disabled() -> bool:
    return os.environ.get("SPARSEDITTO_SANDBOX_NETNS", "1").strip().lower() in ("0", "false", "no", "off")


@functools.lru_cache(maxsize=1)
def unshare_prefix() -> tuple[str, ...]:
    """The util-linux command prefix that gives the worker an empty network namespace, or () when
    the tool is missing or the OS refuses (no user namespaces, seccomp)."""
    exe = shutil.which("unshare")
    if exe is None:
        return ()
    candidates = [(exe, "--net")] if os.geteuid() == 0 else []
    candidates += [(exe, "--user", "--map-current-user", "--net"), (exe, "--user", "--map-root-user", "--net")]
    for prefix in candidates:
        try:
            probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            continue
        if probe.returncode == 0:
            return tuple(prefix)
    return ()


def launch_prefix() -> tuple[tuple[str, ...], str]:
    """(command prefix, planned network layer) for a new worker."""
    if _netns_disabled():
        return (), "audit hook only (network namespace disabled by SPARSEDITTO_SANDBOX_NETNS=0)"
    if hasattr(os, "unshare") and sys.platform.startswith("linux"):
        return (), "netns:os.unshare"      # done by the child itself, before any thread starts
    prefix = unshare_prefix()
    if prefix:
        return prefix, "netns:" + " ".join(Path(prefix[0]).name if i == 0 else a for i, a in enumerate(prefix))
    return (), "audit hook only (no network namespace: unshare unavailable or refused)"


def enter_network_namespace(planned: str) -> str:
    """Child side: unshare the network when the plan says os.unshare; returns the layer in force."""
    if planned != "netns:os.unshare":
        return planned
    try:
        if os.geteuid() == 0:
            os.unshare(os.CLONE_NEWNET)
        else:
            uid, gid = os.getuid(), os.getgid()
            os.unshare(os.CLONE_NEWUSER | os.CLONE_NEWNET)
            Path("/proc/self/setgroups").write_text("deny")
            Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
            Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
        return planned
    except OSError as exc:
        return f"audit hook only (os.unshare refused: {exc.strerror or exc})"


def network_isolated() -> bool:
    """True when this process sees no network interface but loopback (a fresh namespace)."""
    try:
        names = [line.split(":")[0].strip() for line in Path("/proc/net/dev").read_text().splitlines()[2:]]
    except OSError:
        return False
    return names == ["lo"]


# ---- process limits (child side) -----------------------------------------------------------------

def _user_task_count() -> int:
    """Tasks (processes and threads) of this real uid: RLIMIT_NPROC counts all of them."""
    uid = os.getuid()
    count = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            count += int(fields.get("Threads", "1").strip() or 1)
    return count


def _set_soft(resource, which, value) -> None:
    soft, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(which, (value, hard))


def apply_static_limits() -> dict:
    """Limits that hold for the worker's whole life; returns what was set (for the worker info)."""
    import resource

    applied = {}
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    applied["core"] = 0
    _set_soft(resource, resource.RLIMIT_NOFILE, MAX_OPEN_FILES)
    applied["open_files"] = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    _set_soft(resource, resource.RLIMIT_FSIZE, MAX_FILE_BYTES)
    applied["file_bytes"] = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if sys.platform.startswith("linux"):
        _set_soft(resource, resource.RLIMIT_NPROC, _user_task_count() + EXTRA_PROCESSES)
        applied["processes"] = resource.getrlimit(resource.RLIMIT_NPROC)[0]
        if os.geteuid() == 0:
            applied["processes_note"] = "not enforced for root"
    return applied


def apply_address_space_limit() -> int:
    """Interpreter backend only, after the heavy imports: the current mapping plus 3/4 of the
    available memory, so a runaway allocation is a MemoryError, not the OOM killer."""
    import resource

    from sparseditto.io_limits import available_memory, proc_kib_field

    limit = (proc_kib_field("/proc/self/status", "VmSize") or 0) + max(2 << 30, int(0.75 * available_memory()))
    _set_soft(resource, resource.RLIMIT_AS, limit)
    return resource.getrlimit(resource.RLIMIT_AS)[0]


def set_cpu_budget(seconds: float) -> None:
    """Per task: the CPU seconds used so far plus ``seconds`` (all threads count); SIGXCPU then."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = usage.ru_utime + usage.ru_stime
    _set_soft(resource, resource.RLIMIT_CPU, int(used + seconds + CPU_SECONDS_SLACK))


def watch_parent(poll_seconds: float = 1.0) -> None:
    """Exit when the process that started this worker dies (a kill -9 of the graph must not leave
    a busy worker behind). A daemon thread polling the parent pid: PR_SET_PDEATHSIG would fire when
    the *thread* that started the worker exits, and LangGraph starts workers from pool threads."""
    import threading
    import time

    parent = os.getppid()

    def loop() -> None:
        while True:
            time.sleep(poll_seconds)
            if os.getppid() != parent:
                os._exit(70)

    threading.Thread(target=loop, name="sparseditto-parent-watch", daemon=True).start()
