"""The sandboxed worker process: ``python -m sparseditto.harness.worker`` (started by `sandbox`).

A dedicated entry point, never a re-import of the user's ``__main__`` (so a script without an
``if __name__ == "__main__":`` guard runs once). Start-up order matters and is all trusted code:

1. enter a new network namespace (where `isolation.launch_prefix` planned ``os.unshare``) while
   the process still has one thread; apply the process limits; watch the parent pid;
2. read the handshake from the parent: the reply key (HMAC) and the dirs the worker may use;
3. import numpy, scipy, torch and triton (``TRITON_INTERPRET`` is already in the environment for
   the interpreter backend), take the integrity snapshot, install the audit hook (`guard`);
4. answer "ready", then serve tasks. Task functions are looked up by name and get the payload
   and a `WorkerContext` (the gate that opens candidate scopes) as arguments: the context lives
   in this loop's frame only, never in a module global a candidate could reach.

Replies are JSON, authenticated with an HMAC under the handshake key: a candidate that writes to
the reply pipe cannot forge a "verified" result, and the parent never unpickles anything the
worker sends.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from dataclasses import dataclass, field

# name -> "module:function"; each function takes (payload, WorkerContext) and returns JSON-able data.
TASKS = {
    "ping": "sparseditto.harness.worker:ping_task",
    "compile": "sparseditto.harness.compile:compile_task",
    "verify": "sparseditto.harness.verify:verify_task",
    "bench": "sparseditto.harness.bench:bench_task",
    "baselines": "sparseditto.harness.baselines:baselines_task",
}

_MAX_TASK_LOG = 20000
_MAX_LOG_FILE = 8 * 1024 * 1024

# Substrings of CUDA errors after which the context is unusable (sticky errors).
STICKY_CUDA_ERRORS = (
    "illegal memory access", "illegal address", "misaligned address", "illegal instruction",
    "unspecified launch failure", "device-side assert", "an illegal", "cudaErrorIllegalAddress",
    "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED", "hardware stack error",
    "invalid program counter", "CUDA_ERROR_MISALIGNED_ADDRESS", "uncorrectable ECC",
)


def is_sticky_cuda_error(text: str) -> bool:
    low = text.lower()
    return any(s.lower() in low for s in STICKY_CUDA_ERRORS)


def cuda_context_broken() -> str | None:
    """Return the error text when the CUDA context can no longer run work, else None."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    try:
        torch.cuda.synchronize()
        probe = torch.ones(8, device="cuda")
        float(probe.sum().item())
        return None
    except Exception as exc:  # any failure here means the context is poisoned
        return f"{type(exc).__name__}: {exc}"


@dataclass
class WorkerContext:
    """What task functions need from the loop: the gate, the backend and the sandbox facts."""

    gate: object
    backend: str
    info: dict
    tainted: list[str] = field(default_factory=list)   # set when the process can no longer be trusted


def ping_task(payload, wctx: WorkerContext) -> dict:
    import torch

    info = {"pid": os.getpid(), "backend": os.environ.get("SPARSEDITTO_WORKER_BACKEND", ""),
            "triton_interpret": os.environ.get("TRITON_INTERPRET"), "torch": torch.__version__,
            "cuda": torch.cuda.is_available(), "sandbox": wctx.info.get("sandbox", {}),
            "open_fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None,
            "cwd": os.getcwd(), "home": os.environ.get("HOME")}
    if payload and payload.get("echo") is not None:
        info["echo"] = payload["echo"]
    if payload and payload.get("matrix") is not None:   # what a task would be handed (matrix_cache resolves it)
        m = payload["matrix"]
        info["matrix"] = {"name": m.name, "shape": list(m.shape), "nnz": m.nnz, "data_sum": float(m.data.sum(dtype="f8"))}
    return info


def _resolve(name: str):
    module_name, func_name = TASKS[name].split(":")
    return getattr(importlib.import_module(module_name), func_name)


def _read_from(log_path: str, offset: int) -> str:
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        with open(log_path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    if len(text) > _MAX_TASK_LOG:
        text = "[... log truncated ...]\n" + text[-_MAX_TASK_LOG:]
    return text


def import_trusted_modules() -> None:
    """Import the trusted modules a candidate may import, before any guard scope opens. Their own
    import runs library code generation (dataclasses exec their __init__), which the audit hook
    refuses once a candidate scope is open (seen on the H200: tc_formats imported by tc_sp24, and
    delta_format in the ncu child)."""
    from .static_checks import SPARSEDITTO_MODULES

    for name in SPARSEDITTO_MODULES:
        importlib.import_module(name)


def _preimport(backend: str) -> dict:
    import faulthandler

    faulthandler.enable(file=sys.stderr, all_threads=True)
    import numpy  # noqa: F401  (pre-import: the first task should not pay for it)
    import scipy.sparse  # noqa: F401
    import torch
    import torch.utils._python_dispatch  # noqa: F401  (the tracers)
    import torch.overrides  # noqa: F401

    patched = False
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401

        if backend == "interpret":
            from .interpreter_compat import patch_triton_interpreter

            patched = patch_triton_interpreter()
    except ImportError:
        pass
    if backend == "cuda":
        import torch.profiler  # noqa: F401
        try:
            import cupy  # noqa: F401
        except Exception:
            pass
        try:  # Triton builds and loads its CUDA launcher utilities on first use: do it trusted, now
            import triton.runtime.driver

            triton.runtime.driver.active.get_current_device()
        except Exception:
            pass
    import_trusted_modules()

    for target in TASKS.values():  # the task modules, by name (they import this module back)
        importlib.import_module(target.split(":")[0])
    tracing = importlib.import_module("sparseditto.harness.tracing")
    # The first use of torch's mode machinery imports and compiles lazily: do it now, not inside
    # the first candidate's call (where the audit hook would refuse the run-time compiles).
    with tracing.OpTracer():
        (torch.ones(2) + 1).sum()
    if backend == "cuda" and torch.cuda.is_available():
        # On the GPU a candidate's first spmm still reached torch._dynamo's lazy import (its
        # convert_frame compiles at import), refused inside the candidate's scope (seen on the H200
        # once the tracer stopped importing it): import it here, trusted, with CUDA ops through the
        # tracer. CPU workers skip the ~2 s.
        import torch._dynamo  # noqa: F401

        with tracing.OpTracer():
            (torch.ones(2, device="cuda") + 1).sum()
        torch.cuda.synchronize()

    info = {"pid": os.getpid(), "backend": backend, "torch": torch.__version__,
            "cuda": torch.cuda.is_available(), "interpreter_index_fix": patched}
    if backend == "cuda" and torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name()
    return info


def _profiled(task: str, call_id, payload, wctx, profile_dir: str):
    """Run one task under cProfile and write its 40 costliest calls (cumulative) as text to
    ``profile_dir/<task>-<pid>-<call>.txt``: the developer's view of where a verification or a
    timing spends its seconds inside the sandbox, which the parent's profile cannot see."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    try:
        return prof.runcall(_resolve(task), payload, wctx)
    finally:
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(40)
        with open(os.path.join(profile_dir, f"{task}-{os.getpid()}-{call_id}.txt"), "w") as fh:
            fh.write(text.getvalue())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparseditto.harness.worker")
    parser.add_argument("--backend", required=True, choices=("cuda", "interpret"))
    parser.add_argument("--fds", required=True, help="READ_FD,WRITE_FD of the task pipes")
    parser.add_argument("--log", required=True)
    parser.add_argument("--network", default="audit hook only")
    args = parser.parse_args(argv)

    from . import isolation
    from .protocol import encode_reply

    network = isolation.enter_network_namespace(args.network)
    limits = isolation.apply_static_limits()
    isolation.watch_parent()

    from multiprocessing.connection import Connection

    read_fd, write_fd = (int(x) for x in args.fds.split(","))
    conn_in, conn_out = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    hello = conn_in.recv()
    key: bytes = hello["key"]
    workdir, cache_dir = hello["workdir"], hello["cache_dir"]

    info = _preimport(args.backend)
    if args.backend == "interpret":
        limits["address_space"] = isolation.apply_address_space_limit()

    from . import guard
    from .matrix_cache import WorkerMatrices

    policy = guard.Policy.for_worker(workdir, cache_dir, [str(p) for p in isolation.cache_subdirs(cache_dir).values()])
    for extra in ("TRITON_CACHE_DIR", "CUPY_CACHE_DIR", "CUDA_CACHE_PATH", "TRITON_HOME"):
        if os.environ.get(extra):
            policy.write_roots.append(guard._real(os.environ[extra]))
    profile_dir = os.environ.get("SPARSEDITTO_WORKER_PROFILE")
    if profile_dir:   # opt-in (set by the developer before the pool starts): where a task's time goes
        os.makedirs(profile_dir, exist_ok=True)
        policy.write_roots.append(guard._real(profile_dir))
    gate = guard.install(policy)
    sandbox = {"network": network if not network.startswith("netns") or isolation.network_isolated()
               else f"{network} (but interfaces are visible)", "audit_hook": True, "limits": limits,
               "env_names": sorted(os.environ), "workdir": workdir, "cwd": os.getcwd()}
    info["sandbox"] = sandbox
    wctx = WorkerContext(gate=gate, backend=args.backend, info=info)
    matrices = WorkerMatrices()   # large matrices shipped once, referenced by key afterwards
    conn_out.send_bytes(encode_reply(key, ["ready", info]))

    while True:
        try:
            message = conn_in.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            break  # parent went away
        call_id, task, payload, timeout = message
        if task == "__exit__":
            break
        try:
            if os.path.getsize(args.log) > _MAX_LOG_FILE:
                os.truncate(args.log, 0)
            offset = os.path.getsize(args.log)
        except OSError:
            offset = 0
        isolation.set_cpu_budget(float(timeout or 600.0) * max(1, os.cpu_count() or 1))
        try:
            payload = matrices.incoming(payload)
            value = _profiled(task, call_id, payload, wctx, profile_dir) if profile_dir else \
                _resolve(task)(payload, wctx)
            restart = bool(wctx.tainted) or bool(args.backend == "cuda" and cuda_context_broken())
            reply = ["result", call_id, value, _read_from(args.log, offset), restart]
        except BaseException as exc:  # report everything, including SystemExit from a candidate
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            restart = bool(wctx.tainted) or bool(args.backend == "cuda" and (is_sticky_cuda_error(tb)
                                                                              or cuda_context_broken()))
            reply = ["error", call_id, tb, _read_from(args.log, offset), restart]
            if isinstance(exc, KeyboardInterrupt):
                break
        try:
            conn_out.send_bytes(encode_reply(key, reply))
        except Exception:
            break
        if wctx.tainted:
            break  # a candidate changed what the checks rely on: never serve another task
    sys.stdout.flush()
    sys.stderr.flush()
    # Nothing left to clean up (results are sent, logs flushed); skip the slow interpreter
    # teardown of torch/triton so pool shutdown and restarts stay fast.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
