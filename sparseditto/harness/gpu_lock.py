"""Several processes on one GPU: each timing alone on it, all other GPU work side by side.

Why: a batch over a 7B-shaped model spends most of a reused layer's time on the host (packing
the layer's format, drawing values, fp64 references: 2.7 of 3.7 s per 4096 x 4096 layer and 5-6
of 7-8 s per 11008 x 4096 layer on the H200, session 39), so several batch workers sharing one
GPU would finish it several times sooner, but only if no worker's kernels run while another
worker times one. Processes on one GPU without MPS are time-sliced; a timing's CUDA events
would count another process's slice as kernel time.

The rule, a readers-writer lock per physical GPU across processes (``fcntl.flock`` on two files
under ``<cache dir>/gpu-locks/``):

* ``exclusive()`` around every timing loop (`timing._time_launches`: eager, graph and chained
  timings, their warm-up included) and every Nsight Compute run: nothing else of ours runs on
  the GPU meanwhile;
* ``shared()`` around the verification's GPU steps (a call of the candidate with its output
  read back, the fp64 reference product): any number at once, never during a timing.

A waiting timing goes first: it holds the turnstile while it waits for the shared holders to
leave, and a shared request passes the turnstile before it takes its share (writer preference,
so a steady stream of verifications cannot starve the timings). Work outside both (the host side
of ``prepare``: packing, uploads) runs freely; its device copies go through the copy engines.

Inside one process the lock is re-entrant (a timing inside an exclusive section is covered,
and so is a shared step inside one); asking for ``exclusive`` inside ``shared`` is a programming
error and raises. flock is released by the kernel when a process dies, so a killed worker never
leaves the GPU locked.

In a sandboxed worker the lock files are opened when a task starts (`for_current_device`, called
by the verify and bench tasks before any candidate code runs), since the cache root is closed to
file opens while a candidate's scope is active; the timing functions then only use the lock
already open (`active`). Without a prepared lock (scripts calling the timing functions directly,
the interpreter) they run unlocked, as before. ``SPARSEDITTO_GPU_LOCK=0`` turns it off.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import re
import threading
from pathlib import Path

_LOCKS: dict[str, "GpuLock"] = {}
_ACTIVE: list["GpuLock"] = []          # the lock of the device this process works on, once prepared
_MAKE = threading.Lock()


def enabled() -> bool:
    return os.environ.get("SPARSEDITTO_GPU_LOCK", "1") not in ("0", "off", "false", "no")


class GpuLock:
    """The cross-process readers-writer lock of one GPU (module docstring); ``path`` a folder."""

    def __init__(self, folder: str | os.PathLike, key: str):
        if not re.fullmatch(r"[A-Za-z0-9._-]+", key):
            raise ValueError(f"A GPU lock key is a plain file name (letters, digits, '._-'), got {key!r}.")
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.key = key
        self.pid = os.getpid()
        self._turn = os.open(folder / f"{key}.turnstile", os.O_RDWR | os.O_CREAT, 0o600)
        self._gate = os.open(folder / f"{key}.gate", os.O_RDWR | os.O_CREAT, 0o600)
        self._mode: str | None = None    # None, "shared" or "exclusive": what this process holds
        self._depth = 0
        self._state = threading.RLock()

    @contextlib.contextmanager
    def exclusive(self):
        """The GPU to this process alone (a timing, a profile)."""
        with self._state:
            if self._mode == "shared":
                raise RuntimeError("gpu_lock: exclusive() inside shared() would deadlock with another process "
                                   "upgrading the same way; take exclusive() first.")
            with self._holding("exclusive", self._take_exclusive):
                yield self

    @contextlib.contextmanager
    def shared(self):
        """GPU work that may run beside other processes' shared work, never during a timing."""
        with self._state, self._holding("shared", self._take_shared):
            yield self

    def _take_exclusive(self) -> None:
        fcntl.flock(self._turn, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._gate, fcntl.LOCK_EX)
        finally:
            fcntl.flock(self._turn, fcntl.LOCK_UN)

    def _take_shared(self) -> None:
        fcntl.flock(self._turn, fcntl.LOCK_EX)     # waits behind a timing that is waiting
        fcntl.flock(self._turn, fcntl.LOCK_UN)
        fcntl.flock(self._gate, fcntl.LOCK_SH)

    @contextlib.contextmanager
    def _holding(self, mode: str, take):
        """Take the lock in ``mode`` unless this process holds it already (re-entrant), release it at
        the outermost exit."""
        if self._mode is None:
            take()
            self._mode = mode
        self._depth += 1
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            fcntl.flock(self._gate, fcntl.LOCK_UN)
            self._mode = None

    def close(self) -> None:
        for fd in (self._turn, self._gate):
            with contextlib.suppress(OSError):
                os.close(fd)


def lock_folder() -> Path:
    from sparseditto.paths import cache_dir

    return cache_dir() / "gpu-locks"


def device_key(device=None) -> str:
    """A name for the physical GPU behind ``device`` (torch's current one by default) that every
    process agrees on whatever its CUDA_VISIBLE_DEVICES: the device's UUID, else its PCI bus id."""
    import torch

    index = torch.cuda.current_device() if device is None else torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    props = torch.cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)
    if uuid:
        return "gpu-" + re.sub(r"[^A-Za-z0-9]", "", str(uuid))
    bus = f"{getattr(props, 'pci_domain_id', 0)}-{getattr(props, 'pci_bus_id', index)}-{getattr(props, 'pci_device_id', 0)}"
    return "pci-" + re.sub(r"[^A-Za-z0-9-]", "", bus)


def lock_for(key: str, folder: str | os.PathLike | None = None) -> GpuLock:
    """The process's lock for the GPU named ``key`` (one per key and process)."""
    folder = Path(folder) if folder is not None else lock_folder()
    name = f"{os.getpid()}:{folder}/{key}"   # a forked child opens its own: flock is per open file
    with _MAKE:
        lock = _LOCKS.get(name)
        if lock is None:
            lock = _LOCKS[name] = GpuLock(folder, key)
        return lock


def for_current_device() -> GpuLock | None:
    """Open (once) the lock of the GPU this process uses and make it the one the timing and
    verification steps take (`active`); None when off or without a GPU."""
    if not enabled():
        return None
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        lock = lock_for(device_key())
    except (ImportError, OSError, RuntimeError):
        return None
    _ACTIVE[:] = [lock]
    return lock


def active() -> GpuLock | None:
    """The lock `for_current_device` prepared in this process, if any (never opens a file)."""
    lock = _ACTIVE[0] if _ACTIVE and enabled() else None
    return lock if lock is not None and lock.pid == os.getpid() else None


def exclusive_section():
    """``active().exclusive()``, or a no-op context without a prepared lock."""
    lock = active()
    return lock.exclusive() if lock is not None else contextlib.nullcontext()


def shared_section():
    """``active().shared()``, or a no-op context without a prepared lock."""
    lock = active()
    return lock.shared() if lock is not None else contextlib.nullcontext()
