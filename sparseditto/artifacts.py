"""Content-addressed store for the big objects the agent graph must not carry in its state.

Why: LangGraph checkpoints every state update (SQLite here), and Studio displays the state. A
4096x4096 weight in the state would be copied into every checkpoint and every streamed update.
So the graph carries a short key (the sha256 of the matrix content) and nodes fetch the matrix
from here. Files live under the cache directory (``$SPARSEDITTO_CACHE_DIR``, else
``$XDG_CACHE_HOME/sparseditto``, else ``~/.cache/sparseditto``), so a run resumed from its
checkpoint in a new process still finds its matrix; an in-process dict avoids re-reading it.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from pathlib import Path

import numpy as np

from sparseditto.matrix import SparseMatrix
from sparseditto.paths import cache_dir

KEY_PREFIX = "matrix-"


def matrix_key(matrix: SparseMatrix) -> str:
    """sha256 over everything `get_matrix` gives back: structure, values, shape, dtype and name."""
    h = hashlib.sha256()
    header = {"shape": list(matrix.shape), "dtype": matrix.dtype, "name": matrix.name,
              "data_dtype": str(matrix.data.dtype)}
    h.update(json.dumps(header, sort_keys=True).encode())
    for arr in (matrix.indptr, matrix.indices, matrix.data):
        h.update(np.ascontiguousarray(arr).tobytes())
    return KEY_PREFIX + h.hexdigest()


class ArtifactStore:
    """Matrices on disk as ``<root>/matrices/<key>.npz`` plus an in-process cache."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else cache_dir() / "artifacts"
        self._cache: dict[str, SparseMatrix] = {}
        self._lock = threading.Lock()

    def _path(self, key: str) -> Path:
        if not key.startswith(KEY_PREFIX) or len(key) != len(KEY_PREFIX) + 64:
            raise ValueError(f"Not a matrix artifact key: {key!r} (expected '{KEY_PREFIX}' + 64 hex digits).")
        return self.root / "matrices" / f"{key}.npz"

    def put_matrix(self, matrix: SparseMatrix) -> str:
        """Store `matrix` (idempotent) and return its key."""
        if not isinstance(matrix, SparseMatrix):
            raise ValueError(f"Expected a SparseMatrix, got {type(matrix).__name__}.")
        key = matrix_key(matrix)
        path = self._path(key)
        with self._lock:
            self._cache[key] = matrix
            if path.exists():
                return key
            path.parent.mkdir(parents=True, exist_ok=True)
            # Write then rename, so a concurrent reader never sees half a file.
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz.tmp")
            os.close(fd)
            try:
                with open(tmp, "wb") as fh:
                    np.savez(fh, indptr=matrix.indptr, indices=matrix.indices, data=matrix.data,
                             shape=np.asarray(matrix.shape, dtype=np.int64),
                             header=np.asarray(json.dumps({"dtype": matrix.dtype, "name": matrix.name,
                                                           "meta": _json_safe(matrix.meta)})))
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        return key

    def get_matrix(self, key: str) -> SparseMatrix:
        """The matrix stored under `key`; KeyError when this store never saw it."""
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None:
            return hit
        path = self._path(key)
        if not path.exists():
            raise KeyError(f"No matrix artifact {key} under {self.root}.")
        with np.load(path, allow_pickle=False) as z:
            header = json.loads(str(z["header"]))
            matrix = SparseMatrix(indptr=z["indptr"], indices=z["indices"], data=z["data"],
                                  shape=tuple(int(x) for x in z["shape"]), dtype=header["dtype"],
                                  name=header["name"], meta=header.get("meta") or {})
        with self._lock:
            self._cache[key] = matrix
        return matrix

    def has(self, key: str) -> bool:
        return key in self._cache or self._path(key).exists()

    def forget(self, key: str) -> None:
        """Drop the in-process copy of `key` (the file stays): a batch job that walks through many
        large matrices calls this when it is done with one, so memory does not grow with the job."""
        with self._lock:
            self._cache.pop(key, None)


def _json_safe(meta: dict) -> dict:
    """Keep only the JSON-serializable part of a matrix's meta (it is informational)."""
    out = {}
    for k, v in (meta or {}).items():
        try:
            json.dumps(v)
        except (TypeError, ValueError):
            v = repr(v)
        out[str(k)] = v
    return out


_DEFAULT: dict[Path, ArtifactStore] = {}


def default_store() -> ArtifactStore:
    """One store per cache root (the root follows $SPARSEDITTO_CACHE_DIR, so tests can redirect it)."""
    root = cache_dir() / "artifacts"
    store = _DEFAULT.get(root)
    if store is None:
        store = _DEFAULT[root] = ArtifactStore(root)
    return store


def put_matrix(matrix: SparseMatrix) -> str:
    return default_store().put_matrix(matrix)


def get_matrix(key: str) -> SparseMatrix:
    return default_store().get_matrix(key)


def forget_matrix(key: str) -> None:
    default_store().forget(key)
