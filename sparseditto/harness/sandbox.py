"""A pool of sandboxed worker processes that run untrusted candidate kernels.

Why processes: a generated kernel can segfault, call ``os._exit``, loop forever, or make an illegal
GPU memory access that poisons the CUDA context for the rest of the process. None of that may take
down the agent graph. Each backend ("cuda", "interpret") gets one long-lived worker, started as
``python -m sparseditto.harness.worker`` (a dedicated entry point: the user's ``__main__`` is never
re-imported, so scripts need no main guard) with an allow-listed environment, a private directory
as cwd and HOME, no inherited descriptors but its two task pipes, resource limits and, where the
OS allows, no network (`isolation`). Workers are reused between candidates, so the multi-second
start (importing torch and triton) is paid rarely, and replaced after a timeout, a crash, a sticky
CUDA error or a candidate that tampered with the worker.

A worker that cannot start at all is an infrastructure failure: `WorkerPool.call` raises
`WorkerStartError` with the worker's output, it is never reported as a candidate's failure.

Usage::

    with WorkerPool() as pool:
        reply = pool.call("verify", payload, backend="interpret", timeout=60)
"""
from __future__ import annotations

import atexit
import itertools
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

EXEC_BACKENDS = ("cuda", "interpret")
_WORKER_IDS = itertools.count()
_CALL_IDS = itertools.count(1)
# Set by `cancel_calls` (the Ctrl-C handler of run_graph): every wait for a worker gives up at
# once. Graph nodes run in LangGraph's executor threads, where no KeyboardInterrupt arrives, and
# the executor waits for them before the main thread's interrupt propagates; without this a
# Ctrl-C would wait for the running verification to finish.
_CANCEL = threading.Event()


def cancel_calls() -> None:
    """Make every pending and future wait for a worker raise KeyboardInterrupt (until `allow_calls`)."""
    _CANCEL.set()


def allow_calls() -> None:
    _CANCEL.clear()
_LOG_TAIL_CHARS = 6000
_MAX_REPLY_BYTES = 512 << 20


class WorkerStartError(RuntimeError):
    """A sandboxed worker could not start (an environment problem, not a candidate's fault)."""


@dataclass
class WorkerReply:
    """What came back from one task. Only ``status == "ok"`` carries a ``value``."""

    status: Literal["ok", "error", "timeout", "crash"]
    value: Any = None
    error: str = ""            # traceback (error) or human-readable reason (timeout/crash)
    log: str = ""              # worker stdout/stderr written during this task
    seconds: float = 0.0
    exitcode: int | None = None
    signal_name: str | None = None
    restarted: bool = False    # the worker was replaced after this task


def resolve_backend(backend: str) -> str:
    """'auto' -> 'cuda' when torch sees a GPU, else 'interpret'; validates explicit names."""
    if backend == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "interpret"
    if backend not in EXEC_BACKENDS:
        raise ValueError(f"Unknown execution backend {backend!r}; expected 'auto' or one of {EXEC_BACKENDS}.")
    if backend == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("Execution backend 'cuda' requested, but torch sees no CUDA GPU; "
                             "use backend='interpret' (or 'auto').")
    return backend


def _tail(path: Path, limit: int = _LOG_TAIL_CHARS) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - limit))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _describe_exit(exitcode: int | None) -> tuple[str, str | None]:
    if exitcode is None:
        return "worker vanished", None
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"worker killed by {name}", name
    return f"worker exited with code {exitcode}", None


class _Worker:
    """One worker subprocess: its pipes, private directory and log file."""

    def __init__(self, backend: str, log_dir: Path, cache_dir: str | None, python: str | None = None) -> None:
        self.backend = backend
        self._python = python or sys.executable
        self._log_dir = log_dir
        self._cache_dir = cache_dir
        self.proc: subprocess.Popen | None = None
        self.conn_out = self.conn_in = None
        self.ready = False
        self.info: dict = {}
        self.log_path: Path | None = None
        self.workdir: Path | None = None
        self._key = b""
        self._held: set[str] = set()   # keys of the large matrices this worker process was shipped (matrix_cache)
        self.start()

    def start(self) -> None:
        from multiprocessing.connection import Connection

        from . import isolation
        from .source_loader import default_cache_dir

        cache_dir = self._cache_dir or str(default_cache_dir())
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        for sub in isolation.cache_subdirs(cache_dir).values():
            sub.mkdir(parents=True, exist_ok=True)
        wid = next(_WORKER_IDS)
        self.log_path = self._log_dir / f"worker-{self.backend}-{os.getpid()}-{wid}.log"
        self.workdir = Path(tempfile.mkdtemp(prefix=f"worker-{self.backend}-{wid}-", dir=self._log_dir))
        isolation.make_private_dirs(self.workdir)
        prefix, network = isolation.launch_prefix()
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        cmd = [*prefix, self._python, "-m", "sparseditto.harness.worker", "--backend", self.backend,
               "--fds", f"{req_r},{rep_w}", "--log", str(self.log_path), "--network", network]
        env = isolation.worker_environment(self.backend, self.workdir, cache_dir)
        try:
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                             close_fds=True, pass_fds=(req_r, rep_w), cwd=str(self.workdir),
                                             env=env, start_new_session=True)
        except OSError as exc:
            for fd in (req_r, req_w, rep_r, rep_w):
                os.close(fd)
            raise WorkerStartError(f"cannot start the {self.backend} worker ({' '.join(cmd[:3])} ...): {exc}") from exc
        finally:
            pass
        os.close(req_r)
        os.close(rep_w)
        self.conn_out, self.conn_in = Connection(req_w, readable=False), Connection(rep_r, writable=False)
        self._key = secrets.token_bytes(32)
        self._held = set()   # a new process holds no matrices
        self.ready = False
        try:
            self.conn_out.send({"key": self._key, "workdir": str(self.workdir), "cache_dir": cache_dir})
        except (BrokenPipeError, OSError):
            pass  # the worker died at once: wait_ready reports it with its output

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout: float) -> WorkerReply | None:
        """Block until the worker has imported its libraries; a failure comes back as a reply."""
        if self.ready:
            return None
        reply = self._receive(time.monotonic() + timeout, expect="ready")
        if reply.status == "ok":
            self.ready = True
            self.info = reply.value or {}
            return None
        return reply

    def _receive(self, deadline: float, expect: str, call_id: int | None = None) -> WorkerReply:
        from .protocol import decode_reply

        start = time.monotonic()
        while True:
            if _CANCEL.is_set():
                raise KeyboardInterrupt(f"interrupted while waiting for the {self.backend} worker")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return WorkerReply(status="timeout", seconds=time.monotonic() - start,
                                   error=f"no reply from the {self.backend} worker in time",
                                   log=_tail(self.log_path))
            try:
                has_data = self.conn_in.poll(min(0.1, remaining))
            except (EOFError, OSError):
                has_data = True
            if has_data:
                try:
                    message = decode_reply(self._key, self.conn_in.recv_bytes(_MAX_REPLY_BYTES))
                except (EOFError, OSError, ConnectionResetError):
                    return self._crash_reply(start)
                except ValueError as exc:  # unauthenticated or garbled: the worker is compromised
                    self.kill()
                    reply = self._crash_reply(start)
                    reply.error = f"the worker sent a reply that failed authentication ({exc}); killed"
                    return reply
                kind = message[0]
                if kind == "ready" and expect == "ready":
                    return WorkerReply(status="ok", value=message[1], seconds=time.monotonic() - start)
                if kind in ("result", "error") and message[1] == call_id:
                    _, _, body, log, restart = message
                    return WorkerReply(status="ok" if kind == "result" else "error",
                                       value=body if kind == "result" else None,
                                       error=body if kind == "error" else "", log=log,
                                       restarted=restart, seconds=time.monotonic() - start)
                continue  # a stale reply to an abandoned call: keep waiting for ours
            if not self.alive():
                if self.conn_in.poll(0):
                    continue
                return self._crash_reply(start)

    def _crash_reply(self, start: float) -> WorkerReply:
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        exitcode = self.proc.returncode
        reason, sig = _describe_exit(exitcode)
        return WorkerReply(status="crash", error=reason, exitcode=exitcode, signal_name=sig,
                           log=_tail(self.log_path), seconds=time.monotonic() - start)

    def call(self, task: str, payload: Any, timeout: float) -> WorkerReply:
        """Run `task` in the worker. A large matrix in the payload is shipped once per worker process and
        referenced by its content key afterwards (matrix_cache); should the worker have lost it, the call is
        sent once more with the matrix whole."""
        from .matrix_cache import MATRIX_MISSING, outgoing

        sent, shipped = outgoing(payload, self._held)
        reply = self._send(task, sent, timeout)
        if reply.status == "error" and MATRIX_MISSING in (reply.error or ""):
            self._held.clear()
            sent, shipped = outgoing(payload, self._held)
            reply = self._send(task, sent, timeout)
        if reply.status in ("ok", "error"):   # the worker answered, so it kept what was shipped
            self._held.update(shipped)
        return reply

    def _send(self, task: str, payload: Any, timeout: float) -> WorkerReply:
        start = time.monotonic()
        call_id = next(_CALL_IDS)
        try:
            self.conn_out.send((call_id, task, payload, float(timeout)))
        except (BrokenPipeError, OSError):
            return self._crash_reply(start)
        return self._receive(start + timeout, expect="result", call_id=call_id)

    def kill(self) -> None:
        if self.proc is None:
            return
        if self.alive():
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the worker and any compiler it started
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for conn in (self.conn_out, self.conn_in):
            try:
                conn.close()
            except (OSError, AttributeError):
                pass
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def shutdown(self, grace: float = 2.0) -> None:
        if self.proc is None:
            return
        if self.alive():
            try:
                self.conn_out.send((0, "__exit__", None, 0.0))
            except (BrokenPipeError, OSError):
                pass
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        self.kill()


class WorkerPool:
    """One reusable sandboxed worker per execution backend, replaced whenever it breaks.

    ``call`` never raises for anything the candidate does: timeouts and crashes come back as a
    `WorkerReply` with status "timeout"/"crash" and the worker's log tail, and a fresh worker is
    started in the background for the next call. Calls on one backend are serialized (one lock per
    worker); the two backends can run side by side.
    """

    def __init__(self, *, cache_dir: str | os.PathLike | None = None,
                 log_dir: str | os.PathLike | None = None, start_timeout: float = 300.0,
                 python: str | os.PathLike | None = None) -> None:
        """``python``: the interpreter that runs workers (default: this one's ``sys.executable``)."""
        self._python = os.fspath(python) if python is not None else None
        self._cache_dir = str(cache_dir) if cache_dir is not None else None
        self._own_log_dir = log_dir is None
        self._log_dir = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="sparseditto-workers-"))
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self._start_timeout = start_timeout
        self._workers: dict[str, _Worker] = {}
        self._locks = {b: threading.Lock() for b in EXEC_BACKENDS}
        self._closed = False
        atexit.register(self.close)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def cache_dir(self) -> str | None:
        return self._cache_dir

    def worker_info(self, backend: str) -> dict:
        worker = self._workers.get(backend)
        return dict(worker.info) if worker else {}

    def _get_worker(self, backend: str) -> _Worker:
        worker = self._workers.get(backend)
        if worker is None:
            worker = _Worker(backend, self._log_dir, self._cache_dir, self._python)
            self._workers[backend] = worker
        return worker

    def prestart(self, backend: str) -> None:
        """Start the backend's worker now without waiting for it, so its imports (torch, Triton:
        seconds) overlap with what the caller does before its first call (a batch worker imports
        the agents and reads its layers meanwhile). A start that fails is reported by that call."""
        if backend not in EXEC_BACKENDS:
            raise ValueError(f"Unknown execution backend {backend!r}; expected one of {EXEC_BACKENDS}.")
        if self._closed:
            return
        with self._locks[backend]:
            try:
                self._get_worker(backend)
            except WorkerStartError:
                pass

    def _replace(self, backend: str) -> None:
        """Kill the worker and start its replacement now (it imports while the caller works)."""
        worker = self._workers.get(backend)
        if worker is not None:
            worker.kill()
            worker.start()

    def restart(self, backend: str) -> None:
        if backend not in EXEC_BACKENDS:
            raise ValueError(f"Unknown execution backend {backend!r}; expected one of {EXEC_BACKENDS}.")
        with self._locks[backend]:
            self._replace(backend)

    def call(self, task: str, payload: Any = None, *, backend: str, timeout: float) -> WorkerReply:
        """Run ``task`` (a name from `worker.TASKS`) in the backend's worker, within ``timeout`` s."""
        from .worker import TASKS

        if self._closed:
            raise RuntimeError("WorkerPool is closed.")
        if task not in TASKS:
            raise ValueError(f"Unknown worker task {task!r}; expected one of {sorted(TASKS)}.")
        if backend not in EXEC_BACKENDS:
            raise ValueError(f"Unknown execution backend {backend!r}; expected one of {EXEC_BACKENDS}.")
        if not timeout or timeout <= 0:
            raise ValueError(f"Expected a positive timeout in seconds, got {timeout!r}.")
        with self._locks[backend]:
            worker = self._ready_worker(backend)
            try:
                reply = worker.call(task, payload, timeout)
            except BaseException:  # e.g. KeyboardInterrupt while waiting: don't leave it running,
                # and start no replacement: the caller is most likely on its way out (Ctrl-C), and
                # the next call starts a fresh worker anyway
                self._workers.pop(backend).kill()
                raise
            if reply.status == "timeout":
                reply.error = f"task '{task}' exceeded {timeout:.1f} s; worker killed and restarted"
            if reply.status in ("timeout", "crash") or reply.restarted:
                self._replace(backend)
                reply.restarted = True
            return reply

    def _ready_worker(self, backend: str) -> _Worker:
        """The backend's worker, started and ready; two failed starts in a row raise
        `WorkerStartError` with the worker's output (an environment problem, not a candidate's)."""
        worker = self._get_worker(backend)
        failed = worker.wait_ready(self._start_timeout)
        if failed is None:
            return worker
        self._replace(backend)
        again = worker.wait_ready(self._start_timeout)
        if again is None:
            return worker
        worker.kill()
        raise WorkerStartError(
            f"the sandboxed {backend} worker failed to start twice ({failed.error}; then {again.error}). "
            f"Its output:\n{(again.log or failed.log).strip()[-4000:] or '(none)'}")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for worker in self._workers.values():
            worker.shutdown()
        self._workers.clear()
        if self._own_log_dir:
            shutil.rmtree(self._log_dir, ignore_errors=True)

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_DEFAULT_POOL: WorkerPool | None = None
_DEFAULT_LOCK = threading.Lock()


def get_pool(pool: WorkerPool | None = None) -> WorkerPool:
    """The pool to use: the one given, else a process-wide default created on first use."""
    global _DEFAULT_POOL
    if pool is not None:
        return pool
    with _DEFAULT_LOCK:
        if _DEFAULT_POOL is None or _DEFAULT_POOL.closed:
            _DEFAULT_POOL = WorkerPool()
        return _DEFAULT_POOL


def set_default_pool(pool: WorkerPool | None) -> WorkerPool | None:
    """Install ``pool`` as the process-wide default (e.g. one with a test cache dir); returns the
    previous default, which the caller owns from then on."""
    global _DEFAULT_POOL
    if pool is not None and not isinstance(pool, WorkerPool):
        raise ValueError(f"Expected a WorkerPool, got {type(pool).__name__}.")
    with _DEFAULT_LOCK:
        previous, _DEFAULT_POOL = _DEFAULT_POOL, pool
    return previous


def default_pool_if_started() -> WorkerPool | None:
    with _DEFAULT_LOCK:
        return _DEFAULT_POOL if _DEFAULT_POOL is not None and not _DEFAULT_POOL.closed else None


def shutdown_default_pool() -> None:
    global _DEFAULT_POOL
    with _DEFAULT_LOCK:
        if _DEFAULT_POOL is not None:
            _DEFAULT_POOL.close()
            _DEFAULT_POOL = None


atexit.register(shutdown_default_pool)
