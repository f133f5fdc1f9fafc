"""Large matrices go to a sandbox worker once, then by reference.

Why: every verify, bench, compile and baselines call sends its task's matrix through the worker's pipe, and
an LLM layer's is large: 11008x4096 at 50% is 180 MB of pattern and values, 1.1 s a call to pickle, pipe and
unpickle on the 2-core CI machine (session 38), against 0.1 s for a call without it. A run_graph sends it for
each candidate's verification and benchmark (5 calls for 2 candidates on the CPU; the H200 bench's LLM cases
verify 6-8, vendor paths included), a batch's reused layer 2-3 times. So the driver ships a large matrix whole
once per worker process, keyed by a SHA-256 of its contents, and afterwards only that key; the worker keeps the
last few it was sent.

Trust: the driver computes every key from the contents it is about to use, so a matrix changed in place
on the driver side gets a new key and is shipped again. Candidate code runs inside the worker and is handed
arrays of the cached matrix, so before a cached matrix is reused the worker hashes it again and, when the
digest differs (something wrote into it), drops it and asks for the matrix anew (MATRIX_MISSING), which the
driver answers by shipping it whole.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any

from sparseditto.matrix import SparseMatrix

#: Matrices below this many bytes of pattern and values are sent whole every call: hashing them would
#: cost about what sending them does.
BY_REFERENCE_MIN_BYTES = 16 << 20
#: How many matrices a worker keeps, and how many bytes at most (the oldest go first).
WORKER_KEEPS = 3
WORKER_KEEPS_BYTES = 3 << 30
#: The error a worker answers when a referenced matrix is not (or no longer intact) in its cache.
MATRIX_MISSING = "SparseDitto worker: matrix not cached here: "


@dataclass(frozen=True)
class MatrixRef:
    """A matrix this worker was sent before, by its content key (its arrays and dtype), with this call's
    name and meta (not part of the key: the same weight may come under another name)."""
    key: str
    shape: tuple[int, int]
    nnz: int
    name: str = "matrix"
    meta: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ShippedMatrix:
    """A matrix sent whole, with the key the worker keeps it under."""
    key: str
    matrix: SparseMatrix


def matrix_bytes(matrix: SparseMatrix) -> int:
    return int(matrix.indptr.nbytes + matrix.indices.nbytes + matrix.data.nbytes)


def matrix_key(matrix: SparseMatrix) -> str:
    """SHA-256 of the shape, the arrays' dtypes and their bytes (~0.1 s per 180 MB)."""
    h = hashlib.sha256(repr((tuple(matrix.shape), str(matrix.dtype), matrix.indptr.dtype.str, matrix.indices.dtype.str,
                              matrix.data.dtype.str)).encode())
    for arr in (matrix.indptr, matrix.indices, matrix.data):
        h.update(memoryview(arr.reshape(-1).view("u1")) if arr.flags.c_contiguous else arr.tobytes())
    return h.hexdigest()


def outgoing(payload: Any, held: set[str]) -> tuple[Any, list[str]]:
    """``payload`` with each large top-level SparseMatrix replaced by a reference when the worker holds its
    key (``held``), else shipped whole with its key; and the keys shipped whole (the worker holds them once
    it answered). Anything else passes unchanged."""
    if not isinstance(payload, dict):
        return payload, []
    out, shipped = dict(payload), []
    for name, value in payload.items():
        if isinstance(value, SparseMatrix) and matrix_bytes(value) >= BY_REFERENCE_MIN_BYTES:
            key = matrix_key(value)
            if key in held:
                out[name] = MatrixRef(key, tuple(value.shape), value.nnz, value.name, dict(value.meta))
            else:
                out[name] = ShippedMatrix(key, value)
                shipped.append(key)
    return out, shipped


class WorkerMatrices:
    """The worker's side: the matrices it was shipped, last used last, checked before each reuse."""

    def __init__(self, keeps: int = WORKER_KEEPS, keeps_bytes: int = WORKER_KEEPS_BYTES) -> None:
        self._kept: OrderedDict[str, SparseMatrix] = OrderedDict()
        self._keeps, self._keeps_bytes = keeps, keeps_bytes

    def __contains__(self, key: str) -> bool:
        return key in self._kept

    def incoming(self, payload: Any) -> Any:
        """``payload`` with shipped matrices kept and references resolved; a reference to a matrix not kept,
        or kept but no longer matching its key, raises LookupError with MATRIX_MISSING."""
        if not isinstance(payload, dict):
            return payload
        out = dict(payload)
        for name, value in payload.items():
            if isinstance(value, ShippedMatrix):
                self._keep(value.key, value.matrix)
                out[name] = value.matrix
            elif isinstance(value, MatrixRef):
                out[name] = self._lookup(value)
        return out

    def _lookup(self, ref: MatrixRef) -> SparseMatrix:
        matrix = self._kept.pop(ref.key, None)
        if matrix is None:
            raise LookupError(f"{MATRIX_MISSING}{ref.key[:16]} ({ref.shape[0]}x{ref.shape[1]}, nnz={ref.nnz})")
        if matrix_key(matrix) != ref.key:   # written into since it was shipped (a candidate's prepare, say)
            raise LookupError(f"{MATRIX_MISSING}{ref.key[:16]} changed since it was shipped; dropped")
        self._kept[ref.key] = matrix
        return matrix if (matrix.name, matrix.meta) == (ref.name, ref.meta) else replace(matrix, name=ref.name,
                                                                                           meta=dict(ref.meta))

    def _keep(self, key: str, matrix: SparseMatrix) -> None:
        self._kept.pop(key, None)
        self._kept[key] = matrix
        while len(self._kept) > 1 and (len(self._kept) > self._keeps
                                       or sum(matrix_bytes(m) for m in self._kept.values()) > self._keeps_bytes):
            self._kept.popitem(last=False)
