"""The loop that runs inside a sandboxed worker process (started by `sandbox.WorkerPool`).

Everything here executes in the child. It first routes its stdout/stderr (and faulthandler's
segfault tracebacks) into a log file the parent can read after a crash, sets ``TRITON_INTERPRET``
for the interpreter backend *before* Triton is imported, pre-imports the heavy libraries, then
serves tasks. Task functions live in the harness modules and are looked up by name, so importing
this module stays cheap and triton-free.
"""
from __future__ import annotations

import faulthandler
import importlib
import os
import sys
import traceback

# name -> "module:function"; each function takes the payload and returns picklable data.
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


def ping_task(payload) -> dict:
    import torch

    info = {"pid": os.getpid(), "backend": os.environ.get("SPARSEDITTO_WORKER_BACKEND", ""),
            "triton_interpret": os.environ.get("TRITON_INTERPRET"), "torch": torch.__version__,
            "cuda": torch.cuda.is_available()}
    if payload and payload.get("echo") is not None:
        info["echo"] = payload["echo"]
    return info


def _resolve(name: str):
    module_name, func_name = TASKS[name].split(":")
    return getattr(importlib.import_module(module_name), func_name)


def _redirect_output(log_path: str) -> int:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    faulthandler.enable(file=sys.stderr, all_threads=True)
    return fd


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


def worker_main(conn, backend: str, log_path: str, cache_dir: str | None) -> None:
    """Entry point of the spawned worker process."""
    if backend == "interpret":
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ.pop("TRITON_INTERPRET", None)
    os.environ["SPARSEDITTO_WORKER_BACKEND"] = backend
    if cache_dir:
        os.environ["SPARSEDITTO_CACHE_DIR"] = cache_dir
    _redirect_output(log_path)

    import numpy  # noqa: F401  (pre-import: the first task should not pay for it)
    import scipy.sparse  # noqa: F401
    import torch

    patched = False
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401

        if backend == "interpret":
            from .interpreter_compat import patch_triton_interpreter

            patched = patch_triton_interpreter()
    except ImportError:
        pass
    info = {"pid": os.getpid(), "backend": backend, "torch": torch.__version__,
            "cuda": torch.cuda.is_available(), "interpreter_index_fix": patched}
    if backend == "cuda" and torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name()
    conn.send(("ready", info))

    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            break  # parent went away
        call_id, task, payload = message
        if task == "__exit__":
            break
        try:
            if os.path.getsize(log_path) > _MAX_LOG_FILE:
                os.truncate(log_path, 0)
            offset = os.path.getsize(log_path)
        except OSError:
            offset = 0
        try:
            value = _resolve(task)(payload)
            restart = bool(backend == "cuda" and cuda_context_broken())
            conn.send(("result", call_id, value, _read_from(log_path, offset), restart))
        except BaseException as exc:  # report everything, including SystemExit from a candidate
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            restart = bool(backend == "cuda" and (is_sticky_cuda_error(tb) or cuda_context_broken()))
            try:
                conn.send(("error", call_id, tb, _read_from(log_path, offset), restart))
            except Exception:
                break
            if isinstance(exc, KeyboardInterrupt):
                break
    try:
        conn.close()
    except OSError:
        pass
    # Nothing left to clean up (results are sent, logs flushed); skip the slow interpreter
    # teardown of torch/triton so pool shutdown and restarts stay fast.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
