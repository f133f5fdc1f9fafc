"""The SQLite memory of past optimization trajectories ("ditto": start from what worked).

Every graph run leaves a record here: the matrix's pattern report and normalized feature vector,
the settings (target, N values, dtype, backend, policy, LLM), the software versions it ran under,
every candidate it tried (with its kernel source, stored once per content hash), and its whole
trajectory as ordered steps (decisions, prompts, code, feedback, outcomes). Two look-ups feed the
planner of the next run:

* ``exact_hit(signature, n_bucket, dtype, gpu)``: the same pattern, N range, dtype and GPU were
  optimized before, so the best verified kernel is reused (after re-verification by the graph).
* ``neighbours(features)``: the nearest past runs on the normalized pattern features seed the
  planner's ordering when nothing matches exactly.

The file is also a data set: ``export()`` writes one JSON object per run with its trajectory, in
order, for others to learn from.

Concurrency model: the default memory file is shared by every run a user starts, so many
processes write it at once. WAL journal mode lets readers (``sparseditto memory list``, Studio)
never block writers and see only committed data; every write is one ``BEGIN IMMEDIATE``
transaction (the write lock is taken up front, so two writers never deadlock upgrading a read
lock), with a busy timeout and a bounded, jittered retry when the lock stays taken; a crash in
the middle of a write loses only that write. Each run records the host, pid and process start
time that own it; opening the memory marks the runs of processes that died without finishing
as ``crashed`` (a resumed run claims its row back). Every kernel source read back for reuse is
checked against its content hash, and a mismatch (a tampered or corrupted file) is refused with
`MemoryIntegrityError` before anything could execute it.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import importlib.resources
import json
import math
import os
import platform
import random
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
import warnings
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import sqlite_utils

from sparseditto.harness.source_loader import source_hash
from sparseditto.transcripts import TranscriptStore, create_table as create_transcript_table

SCHEMA_VERSION = 3

#: Run status values. A run starts "running"; it finishes with one of the others. "crashed": the
#: process that owned it died without finishing (found when a later process opens the memory).
RUN_STATUSES = ("running", "ok", "failed", "interrupted", "crashed")
BUSY_TIMEOUT_MS = 30_000
WRITE_RETRIES = 8          # after the busy timeout: bounded, jittered retries of BEGIN IMMEDIATE
#: Runs whose results may seed later runs (neighbours); exact hits need "ok".
USABLE_RUN_STATUSES = ("ok", "interrupted")
#: Candidate statuses that mean "passed verification" (later stages keep the candidate verified).
VERIFIED_STATUSES = ("verified", "benchmarked", "profiled")
#: Kinds of trajectory steps. "event" carries notes such as an LLM policy's fallback to the expert.
STEP_KINDS = ("decision", "prompt", "code", "feedback", "outcome", "event")

_RUN_JSON = ("n_values", "llm_settings", "versions", "features", "report", "token_usage")
_CANDIDATE_JSON = ("params", "timings", "metrics")
_CANDIDATE_FIELDS = ("step", "template", "params", "source", "source_hash", "origin", "status",
                     "failure_class", "message", "timings", "metrics", "rationale", "backend")
_CANDIDATE_UPDATABLE = ("status", "failure_class", "message", "timings", "metrics", "rationale")


class MemoryIntegrityError(ValueError):
    """A stored kernel does not match its content hash (tampered or corrupted): never loaded."""


class MemoryBusyError(RuntimeError):
    """The memory file stayed locked by other writers through every retry."""


def _process_start(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (Linux /proc): tells a live owner from a reused pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _owner_alive(pid: int | None, started: str | None) -> bool:
    if not pid:
        return True  # unknown owner: never declared dead
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    now = _process_start(int(pid))
    return started is None or now is None or now == started


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _open_error(path, exc: Exception) -> ValueError:
    """A clear message for a memory file that cannot be opened or written."""
    text = str(exc).lower()
    where = Path(path)
    if "readonly" in text or "read-only" in text or (where.exists() and not os.access(where, os.W_OK)):
        return ValueError(f"Memory file {path} is read-only ({exc}); make it writable or point --memory / "
                          "SPARSEDITTO_MEMORY at a writable file.")
    if "unable to open" in text or isinstance(exc, PermissionError):
        return ValueError(f"Cannot open memory file {path}: {exc}; check that its folder exists and is "
                          "writable, or point --memory / SPARSEDITTO_MEMORY elsewhere.")
    return ValueError(f"Memory file {path} is not a usable SQLite database ({exc}); "
                      "point --memory / SPARSEDITTO_MEMORY at another file.")


def check_writable_file(path: Path, what: str) -> None:
    """ValueError naming ``path`` when it cannot hold a SQLite file (used for memory and
    checkpoint paths before a long run starts)."""
    if path.is_dir():
        raise ValueError(f"{what} path {path} is a directory; expected a .sqlite file path.")
    parent = path.parent
    probe = parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"{what} path {path}: the folder {probe} is not a writable directory.")
    if path.exists() and not os.access(path, os.R_OK | os.W_OK):
        raise ValueError(f"{what} file {path} is read-only; make it writable or choose another file.")


# ---- small pure helpers ------------------------------------------------------------------------
def default_memory_path() -> Path:
    """``$SPARSEDITTO_MEMORY``, else ``memory.sqlite`` in the cache directory (`sparseditto.paths`)."""
    from sparseditto.paths import cache_dir

    env = os.environ.get("SPARSEDITTO_MEMORY")
    if env:
        return Path(env).expanduser()
    return cache_dir() / "memory.sqlite"


N_CLOSE_RATIO = 2.0   # a past run speaks for these N when each is within 2x of an N it ran at


def found_at_this_n(stored: Iterable[int] | None, n_values: Iterable[int]) -> bool:
    """Whether a past run's N values speak for these: every N within `N_CLOSE_RATIO` of one the run
    was found at. Why: a bucket ('<=128') spans 17..128, and on the H200 graphs suite (session 39) the
    2-D and 3-D Laplacians at N = 128 stopped on their exact hit, the N = 32 winner (csr_rowsplit,
    33.5 / 34.5 us; cuSPARSE won the 3-D one), where csr_rowdecomp, the planner's first pick without
    memory, had measured 18.8 / 19.8 us (session 30). A run stored without N values is taken at its word."""
    stored = [int(s) for s in stored or []]
    if not stored:
        return True
    return all(any(max(int(n), s) <= N_CLOSE_RATIO * min(int(n), s) for s in stored) for n in n_values)


def n_bucket(n: int | Iterable[int]) -> str:
    """The N range a kernel choice generalizes over: '1', '<=16', '<=128', '<=1024', '>1024'.

    SpMV (N=1), decode-sized N and prefill-sized N favour different kernels, while N=12 and N=16
    usually favour the same one; bucketing lets an exact hit survive a small change of N. A list of
    N values (a run optimizing several at once) maps to its distinct buckets joined by '|', so an
    exact hit needs the same set of regimes.
    """
    if isinstance(n, (list, tuple, set, frozenset, np.ndarray)):
        values = sorted({int(v) for v in n})
        if not values:
            raise ValueError("Expected at least one N value, got an empty list.")
        buckets: list[str] = []
        for v in values:
            b = n_bucket(v)
            if b not in buckets:
                buckets.append(b)
        return "|".join(buckets)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise ValueError(f"Expected an integer N (columns of B), got {n!r}.")
    n = int(n)
    if n < 1:
        raise ValueError(f"Expected N >= 1 (columns of B), got {n}.")
    if n == 1:
        return "1"
    for limit in (16, 128, 1024):
        if n <= limit:
            return f"<={limit}"
    return ">1024"


def hash_matches(source: str, stored: str | None) -> bool:
    """True when ``stored`` is the sha256 of ``source`` (the full hash, or the 32-character
    prefix that files written before the harness's one source_hash used)."""
    if not isinstance(source, str) or not stored:
        return False
    full = hashlib.sha256(source.encode("utf-8")).hexdigest()
    return len(stored) >= 32 and full.startswith(stored)


def _owner() -> tuple[str, int, str | None]:
    return socket.gethostname(), os.getpid(), _process_start(os.getpid())


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _jsonable(obj: Any) -> Any:
    """json.dumps default: pydantic models, dataclasses, numpy scalars/arrays, paths, sets."""
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if isinstance(obj, (Path, datetime)):
        return str(obj)
    if isinstance(obj, BaseException):
        return f"{type(obj).__name__}: {obj}"
    return repr(obj)


def _dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value, default=_jsonable, sort_keys=False)


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _decode(row: dict, json_columns: Iterable[str]) -> dict:
    out = dict(row)
    for col in json_columns:
        if col in out:
            out[col] = _loads(out[col])
    return out


def _feature_dict(features: Any) -> dict[str, float]:
    """Named features from a dict, or positional ones ('f0', 'f1', ...) from a sequence."""
    if features is None:
        return {}
    if isinstance(features, dict):
        items = [(str(k), v) for k, v in features.items()]
    else:
        arr = np.asarray(features, dtype=float).ravel()
        items = [(f"f{i}", v) for i, v in enumerate(arr)]
    out: dict[str, float] = {}
    for key, value in items:
        try:
            fvalue = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"Feature '{key}' must be a number, got {value!r}.") from None
        if not math.isfinite(fvalue):
            raise ValueError(f"Feature '{key}' must be finite, got {fvalue}.")
        out[key] = fvalue
    return out


# ---- environment -------------------------------------------------------------------------------
def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cupy_version() -> str | None:
    """CuPy's version from its distribution metadata: never imports cupy (which may fail on CPU)."""
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name == "cupy" or name.startswith("cupy-"):
            return f"{dist.version} ({name})"
    return None


def _driver_version() -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


def template_versions() -> dict[str, str]:
    """Content hashes of the installed kernel template files: a kernel's result is only comparable
    with runs of the same template code."""
    out: dict[str, str] = {}
    try:
        root = importlib.resources.files("sparseditto.kernel_templates")
    except ModuleNotFoundError:
        return out
    for sub in ("triton", "cuda"):
        folder = root / sub
        if not folder.is_dir():
            continue
        for entry in sorted(folder.iterdir(), key=lambda e: e.name):
            if entry.name.startswith("_") or not entry.name.endswith((".py", ".cu")):
                continue
            key = f"{sub}/{entry.name}"
            out[key] = hashlib.sha256(entry.read_bytes()).hexdigest()[:16]
    runtime = root / "runtime.py"   # the launch plumbing every template instance imports
    if runtime.is_file():
        out["runtime.py"] = hashlib.sha256(runtime.read_bytes()).hexdigest()[:16]
    return out


@functools.lru_cache(maxsize=1)
def environment_fingerprint() -> dict[str, Any]:
    """Versions a result depends on: python, sparseditto, torch, triton, cupy, CUDA runtime, GPU,
    driver, and the template source hashes. Works on a CPU-only machine (GPU fields are None)."""
    from sparseditto import __version__

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "sparseditto": __version__,
        "torch": _dist_version("torch"),
        "triton": _dist_version("triton"),
        "cupy": _cupy_version(),
        "cuda_runtime": None,
        "gpu": None,
        "driver": None,
        "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1",
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda_runtime"] = torch.version.cuda
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["driver"] = _driver_version()
    except Exception as exc:  # a broken torch install must not stop a run from being recorded
        info["torch_error"] = f"{type(exc).__name__}: {exc}"
    info["templates"] = template_versions()
    return info


# ---- the memory --------------------------------------------------------------------------------
class Memory(TranscriptStore):
    """One SQLite file of runs, candidates, kernel sources, lessons, trajectory steps and LLM
    transcripts (`sparseditto.transcripts`).

    ``path=None`` uses :func:`default_memory_path`; ``":memory:"`` keeps everything in RAM (tests).
    The object is safe to share between the threads of one process (LangGraph runs nodes in a
    thread pool): one connection guarded by a lock.
    """

    def __init__(self, path: str | os.PathLike | None = None):
        if path is None:
            path = default_memory_path()
        self.path = str(path) if str(path) == ":memory:" else Path(path).expanduser()
        if isinstance(self.path, Path):
            check_writable_file(self.path, "Memory")
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise _open_error(self.path, exc) from exc
        self._lock = threading.RLock()
        try:
            conn = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False)
        except sqlite3.Error as exc:
            raise _open_error(self.path, exc) from exc
        self.db = sqlite_utils.Database(conn)
        try:
            self.db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            version = self.db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise ValueError(f"Memory file {self.path} has schema version {version}, newer than this "
                                 f"sparseditto's {SCHEMA_VERSION}; upgrade sparseditto or use another file.")
            self.db.execute("PRAGMA foreign_keys = ON")
            if isinstance(self.path, Path):
                self._retry(self._enable_wal)
            self._create_schema()
            if isinstance(self.path, Path):
                self.mark_stale_runs()
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise _open_error(self.path, exc) from exc
        except (ValueError, MemoryBusyError):
            conn.close()
            raise

    def _enable_wal(self) -> None:
        if self.db.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            self.db.execute("PRAGMA journal_mode = WAL")

    def _retry(self, fn):
        """Run ``fn`` again (with jittered back-off) while the file is locked by other writers."""
        for attempt in range(WRITE_RETRIES + 1):
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc):
                    raise
                if attempt == WRITE_RETRIES:
                    raise MemoryBusyError(f"Memory file {self.path} stayed locked by other writers for "
                                          f"{WRITE_RETRIES} retries after a {BUSY_TIMEOUT_MS / 1000:.0f} s "
                                          f"timeout ({exc}).") from exc
                time.sleep(min(2.0, 0.05 * 2 ** attempt) * random.uniform(0.5, 1.5))

    @contextmanager
    def _writing(self):
        """One write transaction: ``BEGIN IMMEDIATE`` (retried while busy), commit or roll back.
        Re-entrant: a write inside a write joins the outer transaction."""
        with self._lock:
            conn = self.db.conn
            if conn.in_transaction:
                yield
                return
            try:
                self._retry(lambda: conn.execute("BEGIN IMMEDIATE"))
            except sqlite3.OperationalError as exc:
                raise _open_error(self.path, exc) from exc
            try:
                yield
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            try:
                conn.execute("COMMIT")
            except sqlite3.OperationalError as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise _open_error(self.path, exc) if not _is_busy(exc) else MemoryBusyError(str(exc)) from exc

    # -- lifecycle --
    def close(self) -> None:
        with self._lock:
            self.db.conn.close()

    def __enter__(self) -> "Memory":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Memory(path={str(self.path)!r})"

    @property
    def journal_mode(self) -> str:
        return self.db.journal_mode

    def _create_schema(self) -> None:
        with self._writing():
            self.db["runs"].create({
                "id": str, "created": str, "finished": str, "matrix_name": str, "signature": str,
                "shape_m": int, "shape_k": int, "nnz": int, "pattern": str, "n_values": str,
                "n_bucket": str, "dtype": str, "gpu": str, "target": str, "backend": str,
                "policy": str, "llm_model": str, "llm_settings": str, "versions": str,
                "features": str, "report": str, "status": str, "best_candidate_id": str,
                "best_template": str, "best_speedup_vs_dense": float, "best_speedup_estimate": float,
                "wall_seconds": float, "token_usage": str, "owner_host": str, "owner_pid": int, "owner_started": str,
            }, pk="id", not_null={"created", "signature", "status"}, if_not_exists=True)
            columns = {c.name for c in self.db["runs"].columns}
            for name, kind in (("owner_host", str), ("owner_pid", int), ("owner_started", str),
                               ("best_speedup_estimate", float)):
                if name not in columns:  # files written by an older schema version
                    self.db["runs"].add_column(name, kind)
            self.db["kernels"].create({
                "source_hash": str, "source": str, "template": str, "backend": str, "created": str,
            }, pk="source_hash", not_null={"source"}, if_not_exists=True)
            self.db["candidates"].create({
                "id": str, "run_id": str, "step": int, "template": str, "params": str,
                "source_hash": str, "origin": str, "status": str, "failure_class": str,
                "message": str, "timings": str, "metrics": str, "rationale": str, "created": str,
            }, pk="id", not_null={"run_id", "template", "status"},
                foreign_keys=[("run_id", "runs", "id"), ("source_hash", "kernels", "source_hash")],
                if_not_exists=True)
            self.db["lessons"].create({
                "id": int, "pattern": str, "signature": str, "text": str, "created": str,
            }, pk="id", not_null={"text"}, if_not_exists=True)
            self.db["steps"].create({
                "id": int, "run_id": str, "idx": int, "node": str, "kind": str, "payload": str,
                "created": str,
            }, pk="id", not_null={"run_id", "idx", "kind"}, foreign_keys=[("run_id", "runs", "id")],
                if_not_exists=True)
            create_transcript_table(self.db)
            self.db["runs"].create_index(["signature"], if_not_exists=True)
            self.db["runs"].create_index(["signature", "n_bucket", "dtype", "gpu"], if_not_exists=True)
            self.db["candidates"].create_index(["run_id"], if_not_exists=True)
            self.db["steps"].create_index(["run_id", "idx"], unique=True, if_not_exists=True)
            self.db["lessons"].create_index(["pattern"], if_not_exists=True)
            self.db["runs"].create_index(["status", "owner_host"], if_not_exists=True)
            self.db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    _now = staticmethod(_now)

    # -- runs whose process died --
    def mark_stale_runs(self) -> list[str]:
        """Mark as ``crashed`` the running runs of this host whose owning process is gone (or
        whose pid now belongs to another process); returns their ids."""
        host = socket.gethostname()
        with self._lock:
            rows = self.db.execute("SELECT id, owner_pid, owner_started FROM runs WHERE status = 'running' "
                                   "AND owner_host = ?", [host]).fetchall()
        stale = [run_id for run_id, pid, started in rows if not _owner_alive(pid, started)]
        if stale:
            with self._writing():
                for run_id in stale:
                    self.db.execute("UPDATE runs SET status = 'crashed', finished = ? WHERE id = ? AND "
                                    "status = 'running'", [_now(), run_id])
        return stale

    def claim_run(self, run_id: str) -> None:
        """This process continues ``run_id`` (a resume): it is running again, owned by us."""
        with self._writing():
            run_id = self._resolve_run_id(run_id)
            self.db.execute("UPDATE runs SET status = 'running', finished = NULL, owner_host = ?, owner_pid = ?, "
                            "owner_started = ? WHERE id = ?", [*_owner(), run_id])

    # -- id resolution --
    def _resolve_run_id(self, run_id: str) -> str:
        """Full id from a full id or a unique prefix (the CLI shows 8-character prefixes)."""
        if not isinstance(run_id, str) or not run_id:
            raise ValueError(f"Expected a run id string, got {run_id!r}.")
        rows = self.db.execute("SELECT id FROM runs WHERE id = ? OR id LIKE ? LIMIT 3",
                               [run_id, run_id.replace("%", "").replace("_", "") + "%"]).fetchall()
        ids = {r[0] for r in rows}
        if run_id in ids:
            return run_id
        if not ids:
            raise ValueError(f"Unknown run id '{run_id}' in memory {self.path}; "
                             "see `sparseditto memory list` for the recorded runs.")
        if len(ids) > 1:
            raise ValueError(f"Run id prefix '{run_id}' is ambiguous ({len(ids)}+ runs match); "
                             "give more characters (see `sparseditto memory list`).")
        return ids.pop()

    # -- writes --
    def start_run(self, *, signature: str, matrix_name: str = "matrix", shape: tuple[int, int] | None = None,
                  nnz: int | None = None, pattern: str | None = None, n_values: Iterable[int] = (16,),
                  dtype: str = "float16", gpu: str | None = None, target: str | None = None,
                  backend: str | None = None, policy: str = "expert", llm_model: str | None = None,
                  llm_settings: dict | None = None, versions: dict | None = None, features: Any = None,
                  report: Any = None) -> str:
        """Record the start of a graph run; returns its id (uuid4 hex).

        ``features`` is the normalized pattern feature vector (a dict of named values, or a list)
        that ``neighbours`` compares; ``versions`` defaults to :func:`environment_fingerprint`.
        """
        if not signature or not isinstance(signature, str):
            raise ValueError(f"Expected a pattern signature string, got {signature!r}.")
        n_list = [int(v) for v in n_values]
        bucket = n_bucket(n_list)
        if shape is not None and len(tuple(shape)) != 2:
            raise ValueError(f"Expected a 2-D shape (M, K), got {shape!r}.")
        feats = _feature_dict(features) if features is not None else None
        run_id = uuid.uuid4().hex
        record = {
            "id": run_id, "created": _now(), "finished": None, "matrix_name": matrix_name,
            "signature": signature, "shape_m": int(shape[0]) if shape else None,
            "shape_k": int(shape[1]) if shape else None, "nnz": None if nnz is None else int(nnz),
            "pattern": pattern, "n_values": _dumps(n_list), "n_bucket": bucket, "dtype": dtype,
            "gpu": gpu, "target": target, "backend": backend, "policy": policy, "llm_model": llm_model,
            "llm_settings": _dumps(llm_settings),
            "versions": _dumps(versions if versions is not None else environment_fingerprint()),
            "features": _dumps(feats), "report": _dumps(report), "status": "running",
        }
        record["owner_host"], record["owner_pid"], record["owner_started"] = _owner()
        with self._writing():
            self.db["runs"].insert(record)
        return run_id

    def record_step(self, run_id: str, node: str, kind: str, payload: Any = None) -> int:
        """Append one trajectory step to a run; returns its index within the run (0, 1, ...)."""
        if kind not in STEP_KINDS:
            raise ValueError(f"Unknown step kind '{kind}'; expected one of {STEP_KINDS}.")
        with self._writing():
            run_id = self._resolve_run_id(run_id)
            idx = self.db.execute("SELECT COALESCE(MAX(idx), -1) + 1 FROM steps WHERE run_id = ?",
                                  [run_id]).fetchone()[0]
            self.db["steps"].insert({"run_id": run_id, "idx": idx, "node": node, "kind": kind,
                                     "payload": _dumps(payload), "created": _now()})
        return int(idx)

    def record_candidate(self, run_id: str, **fields: Any) -> str:
        """Record one tried candidate (and its source, once per content hash); returns its id.

        Fields: template (required), status (required), step, params, source, source_hash, origin,
        failure_class, message, timings, metrics, rationale, backend (of the kernel source).
        """
        unknown = sorted(set(fields) - set(_CANDIDATE_FIELDS))
        if unknown:
            raise ValueError(f"Unknown candidate field(s) {unknown}; expected some of {list(_CANDIDATE_FIELDS)}.")
        for required in ("template", "status"):
            if not fields.get(required):
                raise ValueError(f"record_candidate needs a non-empty '{required}', got {fields.get(required)!r}.")
        source = fields.get("source")
        shash = fields.get("source_hash") or (source_hash(source) if source else None)
        if source and not hash_matches(source, shash):
            raise ValueError(f"source_hash {shash!r} is not the content hash of the given source.")
        cand_id = uuid.uuid4().hex
        with self._writing():
            run_id = self._resolve_run_id(run_id)
            if source:
                self.db["kernels"].insert({
                    "source_hash": shash, "source": source, "template": fields["template"],
                    "backend": fields.get("backend"), "created": _now()}, ignore=True)
            elif shash and self.db.execute("SELECT 1 FROM kernels WHERE source_hash = ?", [shash]).fetchone() is None:
                shash = None  # a hash without a stored source would break the foreign key
            self.db["candidates"].insert({
                "id": cand_id, "run_id": run_id, "step": fields.get("step"),
                "template": fields["template"], "params": _dumps(fields.get("params") or {}),
                "source_hash": shash, "origin": fields.get("origin"), "status": fields["status"],
                "failure_class": fields.get("failure_class"), "message": fields.get("message"),
                "timings": _dumps(fields.get("timings")), "metrics": _dumps(fields.get("metrics")),
                "rationale": fields.get("rationale"), "created": _now()})
        return cand_id

    def update_candidate(self, candidate_id: str, **fields: Any) -> None:
        """Update a candidate as it moves on (e.g. verified -> profiled with timings and metrics)."""
        unknown = sorted(set(fields) - set(_CANDIDATE_UPDATABLE))
        if unknown:
            raise ValueError(f"Cannot update candidate field(s) {unknown}; updatable: {list(_CANDIDATE_UPDATABLE)}.")
        values = {k: (_dumps(v) if k in _CANDIDATE_JSON else v) for k, v in fields.items()}
        with self._writing():
            if self.db.execute("SELECT 1 FROM candidates WHERE id = ?", [candidate_id]).fetchone() is None:
                raise ValueError(f"Unknown candidate id '{candidate_id}' in memory {self.path}.")
            if values:
                self.db["candidates"].update(candidate_id, values)

    def finish_run(self, run_id: str, status: str, best_candidate_id: str | None = None, *,
                   best_template: str | None = None, best_speedup_vs_dense: float | None = None,
                   best_speedup_estimate: float | None = None,
                   report: Any = None, wall_seconds: float | None = None, token_usage: Any = None) -> None:
        """Close a run with its outcome. ``best_template`` defaults to the best candidate's template
        ('dense' is a legal answer: the run found nothing faster than cuBLAS). ``best_speedup_vs_dense``
        is measured on a GPU; ``best_speedup_estimate`` is the roofline model's figure of a run without
        GPU timings (kept apart, so nothing ranks past runs by an estimate as if it were measured)."""
        if status not in RUN_STATUSES[1:]:
            raise ValueError(f"Unknown final run status '{status}'; expected one of {RUN_STATUSES[1:]}.")
        with self._writing():
            run_id = self._resolve_run_id(run_id)
            if best_candidate_id is not None:
                row = self.db.execute("SELECT template FROM candidates WHERE id = ? AND run_id = ?",
                                      [best_candidate_id, run_id]).fetchone()
                if row is None:
                    raise ValueError(f"Best candidate '{best_candidate_id}' is not a candidate of run '{run_id}'.")
                best_template = best_template or row[0]
            values: dict[str, Any] = {
                "finished": _now(), "status": status, "best_candidate_id": best_candidate_id,
                "best_template": best_template,
                "best_speedup_vs_dense": None if best_speedup_vs_dense is None else float(best_speedup_vs_dense),
                "best_speedup_estimate": None if best_speedup_estimate is None else float(best_speedup_estimate),
                "wall_seconds": None if wall_seconds is None else float(wall_seconds),
                "token_usage": _dumps(token_usage),
            }
            if report is not None:
                values["report"] = _dumps(report)
            self.db["runs"].update(run_id, values)

    def add_lesson(self, pattern: str | None, text: str, signature: str | None = None) -> int:
        """Store a one-line lesson learned for a pattern class (or one signature)."""
        if not text or not text.strip():
            raise ValueError("A lesson needs non-empty text.")
        with self._writing():
            table = self.db["lessons"].insert({"pattern": pattern, "signature": signature,
                                               "text": text.strip(), "created": _now()})
        return int(table.last_pk)

    # -- reads --
    def lessons(self, pattern: str | None = None, limit: int = 20) -> list[dict]:
        """Lessons for a pattern class (all when None), most recent first."""
        with self._lock:
            if pattern is None:
                rows = self.db.query("SELECT * FROM lessons ORDER BY id DESC LIMIT ?", [int(limit)])
            else:
                rows = self.db.query("SELECT * FROM lessons WHERE pattern = ? ORDER BY id DESC LIMIT ?",
                                     [pattern, int(limit)])
            return list(rows)

    def _candidates(self, run_id: str, with_source: bool = True) -> list[dict]:
        cols = "c.*, k.source AS source" if with_source else "c.*"
        rows = self.db.query(
            f"SELECT {cols} FROM candidates c LEFT JOIN kernels k ON k.source_hash = c.source_hash "
            "WHERE c.run_id = ? ORDER BY c.rowid", [run_id])
        return [_decode(r, _CANDIDATE_JSON) for r in rows]

    def _steps(self, run_id: str) -> list[dict]:
        rows = self.db.query("SELECT idx, node, kind, payload, created FROM steps WHERE run_id = ? ORDER BY idx",
                             [run_id])
        return [_decode(r, ("payload",)) for r in rows]

    def get_run(self, run_id: str) -> dict:
        """A run with its candidates (sources included), ordered steps and LLM transcript. Accepts a
        unique prefix."""
        with self._lock:
            run_id = self._resolve_run_id(run_id)
            run = _decode(self.db["runs"].get(run_id), _RUN_JSON)
            run["candidates"] = self._candidates(run_id)
            run["steps"] = self._steps(run_id)
            run["llm_calls"] = self.llm_calls(run_id)
            return run

    def list_runs(self, limit: int = 50) -> list[dict]:
        """The most recent runs first (without candidates and steps), each with its candidate count."""
        with self._lock:
            rows = self.db.query(
                "SELECT r.*, (SELECT COUNT(*) FROM candidates c WHERE c.run_id = r.id) AS n_candidates "
                "FROM runs r ORDER BY r.created DESC, r.rowid DESC LIMIT ?", [int(limit)])
            return [_decode(r, _RUN_JSON) for r in rows]

    def _best_verified(self, run: dict) -> dict | None:
        """The run's best candidate if verified, else its fastest verified candidate."""
        marks = ",".join("?" for _ in VERIFIED_STATUSES)
        rows = list(self.db.query(
            "SELECT c.*, k.source AS source, k.backend AS backend FROM candidates c "
            "JOIN kernels k ON k.source_hash = c.source_hash "
            f"WHERE c.run_id = ? AND c.status IN ({marks}) ORDER BY c.rowid",
            [run["id"], *VERIFIED_STATUSES]))
        if not rows:
            return None
        cands = [_decode(r, _CANDIDATE_JSON) for r in rows]
        for cand in cands:
            if cand["id"] == run.get("best_candidate_id"):
                return cand

        def median_ms(cand: dict) -> float:
            timings = cand.get("timings") or {}
            value = timings.get("median_ms") if isinstance(timings, dict) else None
            return float(value) if isinstance(value, (int, float)) else math.inf

        return min(cands, key=median_ms)

    def best_kernel(self, run_id: str) -> dict | None:
        """A run's best verified candidate (its fastest verified one when no best was recorded) with
        its source checked against the content hash (MemoryIntegrityError else); None without one.
        Accepts a unique prefix. What `sparseditto export` writes out."""
        with self._lock:
            run = _decode(self.db["runs"].get(self._resolve_run_id(run_id)), _RUN_JSON)
            cand = self._best_verified(run)
            if cand is not None:
                cand["source"] = self._checked_source(cand)
            return cand

    def _chosen_vendor(self, run: dict) -> dict | None:
        """The run's answer when it was a vendor path (dense cuBLAS, cuSPARSE, ...): a candidate of
        origin 'vendor', stored without a source. None when the answer was a generated kernel."""
        if not run.get("best_candidate_id"):
            return None
        rows = list(self.db.query("SELECT c.*, NULL AS source, 'builtin' AS backend FROM candidates c "
                                  "WHERE c.id = ? AND c.origin = 'vendor'", [run["best_candidate_id"]]))
        return _decode(rows[0], _CANDIDATE_JSON) if rows else None

    def _checked_source(self, cand: dict) -> str:
        """The candidate's stored source after its content hash check (MemoryIntegrityError else)."""
        source, shash = cand.get("source"), cand.get("source_hash")
        if not hash_matches(source, shash):
            raise MemoryIntegrityError(
                f"Kernel {str(shash)[:16]} (run {str(cand.get('run_id'))[:8]}, {cand.get('template')}) in memory "
                f"{self.path} does not match its content hash: the stored source was changed after it was "
                f"recorded (tampered or corrupted), so it is refused and was not loaded. Remove the file or "
                f"point --memory / SPARSEDITTO_MEMORY at another one.")
        return source

    def exact_hit(self, signature: str, n_bucket: str, dtype: str, gpu: str | None) -> dict | None:
        """The best verified candidate of the most recent successful run with this exact key.

        Returns None when no "ok" run has the key, or when that run verified no kernel. The graph
        must re-verify the returned source before trusting it (templates or libraries may have
        changed: compare ``versions``).
        """
        with self._lock:
            row = self.db.execute(
                "SELECT id FROM runs WHERE signature = ? AND n_bucket = ? AND dtype = ? AND gpu IS ? "
                "AND status = 'ok' ORDER BY created DESC, rowid DESC LIMIT 1",
                [signature, n_bucket, dtype, gpu]).fetchone()
            if row is None:
                return None
            run = _decode(self.db["runs"].get(row[0]), _RUN_JSON)
            sourced = self._best_verified(run)
            if sourced is not None:   # checked even when a vendor path won: a tampered memory is reported
                self._checked_source(sourced)
            cand = self._chosen_vendor(run) or sourced   # a vendor path has no source: rebuilt from the matrix
            if cand is None:
                return None
            return {
                "run_id": run["id"], "candidate_id": cand["id"], "template": cand["template"],
                "params": cand["params"], "source": cand["source"], "source_hash": cand["source_hash"],
                "backend": cand.get("backend"), "origin": cand["origin"], "status": cand["status"],
                "timings": cand["timings"], "metrics": cand["metrics"],
                "run_best_template": run["best_template"], "matrix_name": run["matrix_name"],
                "signature": run["signature"], "n_bucket": run["n_bucket"], "n_values": run["n_values"],
                "dtype": run["dtype"], "gpu": run["gpu"], "target": run["target"],
                "best_speedup_vs_dense": run["best_speedup_vs_dense"], "versions": run["versions"],
                "created": run["created"],
            }

    def neighbours(self, features: Any, *, pattern: str | None = None, dtype: str | None = None,
                   n_bucket: str | None = None, k: int = 5, exclude_run: str | None = None) -> list[dict]:
        """The k past runs nearest to ``features`` (Euclidean distance on the stored normalized
        feature vectors; a feature missing on one side counts as 0), nearest first. Failed and
        unfinished runs are left out; ``pattern``/``dtype``/``n_bucket`` (`n_bucket()`'s N range)
        restrict the search."""
        query = _feature_dict(features)
        if not query:
            raise ValueError("neighbours() needs a non-empty feature vector.")
        if k < 1:
            raise ValueError(f"Expected k >= 1 neighbours, got {k}.")
        marks = ",".join("?" for _ in USABLE_RUN_STATUSES)
        sql = (f"SELECT * FROM runs WHERE features IS NOT NULL AND status IN ({marks})")
        args: list[Any] = list(USABLE_RUN_STATUSES)
        if pattern is not None:
            sql += " AND pattern = ?"
            args.append(pattern)
        if dtype is not None:
            sql += " AND dtype = ?"
            args.append(dtype)
        if n_bucket is not None:
            sql += " AND n_bucket = ?"
            args.append(n_bucket)
        if exclude_run is not None:
            sql += " AND id != ?"
            args.append(exclude_run)
        with self._lock:
            runs = [_decode(r, _RUN_JSON) for r in self.db.query(sql, args)]
            if not runs:
                return []
            keys = sorted(set(query).union(*(r["features"].keys() for r in runs)))
            col = {key: i for i, key in enumerate(keys)}
            stored = np.zeros((len(runs), len(keys)))
            for i, run in enumerate(runs):
                for key, value in run["features"].items():
                    stored[i, col[key]] = value
            q = np.zeros(len(keys))
            for key, value in query.items():
                q[col[key]] = value
            dist = np.sqrt(((stored - q) ** 2).sum(axis=1))
            # nearest first; among equal distances, the most recent run first
            by_recency = sorted(range(len(runs)), key=lambda i: runs[i]["created"], reverse=True)
            order = sorted(by_recency, key=lambda i: dist[i])[:k]
            out = []
            for i in order:
                run = runs[int(i)]
                best_params: dict = {}
                if run["best_candidate_id"]:
                    row = self.db.execute("SELECT params FROM candidates WHERE id = ?",
                                          [run["best_candidate_id"]]).fetchone()
                    best_params = _loads(row[0]) if row else {}
                out.append({
                    "run_id": run["id"], "distance": float(dist[int(i)]), "matrix_name": run["matrix_name"],
                    "signature": run["signature"], "pattern": run["pattern"],
                    "shape": [run["shape_m"], run["shape_k"]], "nnz": run["nnz"], "n_bucket": run["n_bucket"],
                    "n_values": run["n_values"], "dtype": run["dtype"], "gpu": run["gpu"],
                    "best_template": run["best_template"],
                    "best_params": best_params, "best_speedup_vs_dense": run["best_speedup_vs_dense"],
                    "created": run["created"],
                })
            return out

    def past_kernels(self, key: str, limit: int = 3) -> list[dict]:
        """Best verified kernels of past runs whose signature or pattern class equals ``key``
        (most recent first): what an LLM coder may adapt instead of starting from scratch."""
        with self._lock:
            rows = self.db.query(
                "SELECT * FROM runs WHERE (signature = ? OR pattern = ?) AND status = 'ok' "
                "ORDER BY created DESC, rowid DESC LIMIT ?", [key, key, int(limit) * 4])
            out = []
            for run in rows:
                cand = self._best_verified(_decode(run, _RUN_JSON))
                if cand is None or any(o["source_hash"] == cand["source_hash"] for o in out):
                    continue
                try:
                    self._checked_source(cand)
                except MemoryIntegrityError as exc:  # an example for a prompt: skip it, say so
                    warnings.warn(str(exc), stacklevel=2)
                    continue
                out.append({"run_id": run["id"], "matrix_name": run["matrix_name"], "pattern": run["pattern"],
                            "signature": run["signature"], "dtype": run["dtype"], "gpu": run["gpu"],
                            "template": cand["template"], "params": cand["params"],
                            "speedup_vs_dense": run["best_speedup_vs_dense"],
                            "source_hash": cand["source_hash"], "source": cand["source"]})
                if len(out) >= limit:
                    break
            return out

    # -- export (the CLI's tables are in sparseditto.cli.views) --
    def iter_export(self):
        """One dict per run, oldest first: settings, versions, report, candidates, ordered steps."""
        with self._lock:
            ids = [r[0] for r in self.db.execute("SELECT id FROM runs ORDER BY created, rowid").fetchall()]
        for run_id in ids:
            yield self.get_run(run_id)

    def export(self, path: str | os.PathLike | None = None, fmt: str = "jsonl") -> int:
        """Write every run with its trajectory as JSON Lines (one object per run) or one JSON array;
        ``path=None`` writes to stdout. Returns the number of runs written."""
        if fmt not in ("jsonl", "json"):
            raise ValueError(f"Unknown export format '{fmt}'; expected 'jsonl' or 'json'.")
        if path is not None:
            target = Path(path).expanduser()
            target.parent.mkdir(parents=True, exist_ok=True)
            stream = open(target, "w", encoding="utf-8")
        else:
            stream = sys.stdout
        count = 0
        try:
            if fmt == "json":
                stream.write("[")
            for record in self.iter_export():
                text = json.dumps(record, default=_jsonable)
                if fmt == "jsonl":
                    stream.write(text + "\n")
                else:
                    stream.write(("," if count else "") + "\n" + text)
                count += 1
            if fmt == "json":
                stream.write("\n]\n")
        finally:
            if path is not None:
                stream.close()
            else:
                stream.flush()
        return count
