"""Large matrices reach a sandbox worker once, then by key (harness.matrix_cache): the worker is handed the
same matrix as if it had been sent whole, under the caller's name; a worker that lost it, or whose copy was
written into, gets it whole again; small matrices are always sent whole."""
import numpy as np
import pytest
import scipy.sparse as sp

from sparseditto.harness import matrix_cache
from sparseditto.harness.matrix_cache import (MATRIX_MISSING, MatrixRef, ShippedMatrix, WorkerMatrices, matrix_key,
                                              outgoing)
from sparseditto.matrix import SparseMatrix


def _matrix(seed, name="w", rows=300, cols=200):
    return SparseMatrix.from_scipy(sp.random(rows, cols, density=0.2, random_state=seed, format="csr"), name=name)


def test_keys_follow_the_contents_not_the_name():
    a = _matrix(1, "a")
    same = SparseMatrix(a.indptr.copy(), a.indices.copy(), a.data.copy(), a.shape, a.dtype, "b")
    assert matrix_key(a) == matrix_key(same)
    changed = a.data.copy()
    changed[7] += 1.0
    assert matrix_key(a.with_values(changed)) != matrix_key(a)
    assert matrix_key(SparseMatrix(a.indptr, a.indices, a.data, a.shape, "float16")) != matrix_key(a)


def test_outgoing_and_incoming_round_trip(monkeypatch):
    monkeypatch.setattr(matrix_cache, "BY_REFERENCE_MIN_BYTES", 0)
    a, b = _matrix(1, "layer.0"), _matrix(2)
    worker = WorkerMatrices(keeps=2)
    sent, shipped = outgoing({"matrix": a, "n": 16}, set())
    assert isinstance(sent["matrix"], ShippedMatrix) and sent["n"] == 16 and shipped == [matrix_key(a)]
    assert worker.incoming(sent)["matrix"] is a and matrix_key(a) in worker
    renamed = SparseMatrix(a.indptr, a.indices, a.data, a.shape, a.dtype, "layer.1", {"k": 1})
    ref, shipped = outgoing({"matrix": renamed}, {matrix_key(a)})
    assert isinstance(ref["matrix"], MatrixRef) and shipped == []
    got = worker.incoming(ref)["matrix"]
    assert (got.name, got.meta) == ("layer.1", {"k": 1}) and got.indices is a.indices
    # the oldest goes once more than `keeps` were shipped; a reference to it is MATRIX_MISSING
    worker.incoming(outgoing({"matrix": b}, set())[0])
    worker.incoming(outgoing({"matrix": _matrix(3)}, set())[0])
    assert matrix_key(a) not in worker and matrix_key(b) in worker
    with pytest.raises(LookupError, match=MATRIX_MISSING):
        worker.incoming(outgoing({"matrix": a}, {matrix_key(a)})[0])
    # small matrices and other payloads pass unchanged
    monkeypatch.setattr(matrix_cache, "BY_REFERENCE_MIN_BYTES", 1 << 40)
    assert outgoing({"matrix": a}, {matrix_key(a)}) == ({"matrix": a}, [])
    assert outgoing(None, set()) == (None, [])


def test_a_kept_matrix_written_into_is_dropped(monkeypatch):
    """Candidate code runs in the worker with the kept arrays in hand: a write into them (a prepare that
    sorts or pads in place, say) must not reach the next call, so the next reference is refused and the
    driver ships the matrix whole again."""
    monkeypatch.setattr(matrix_cache, "BY_REFERENCE_MIN_BYTES", 0)
    a = _matrix(4)
    worker = WorkerMatrices()
    kept = worker.incoming(outgoing({"matrix": a}, set())[0])["matrix"]
    kept.data[0] = np.float32(99.0)   # the worker's copy is `a` itself here (no pipe in between)
    with pytest.raises(LookupError, match="changed since it was shipped"):
        worker.incoming({"matrix": MatrixRef(matrix_key(_matrix(4)), a.shape, a.nnz)})
    assert matrix_key(_matrix(4)) not in worker


def test_a_real_worker_gets_it_once_and_recovers_when_it_lost_it(pool, monkeypatch):
    monkeypatch.setattr(matrix_cache, "BY_REFERENCE_MIN_BYTES", 0)
    a, c = _matrix(5, "q_proj"), _matrix(6, "k_proj")

    def seen(matrix):
        reply = pool.call("ping", {"matrix": matrix}, backend="interpret", timeout=120)
        assert reply.status == "ok", reply
        return reply.value["matrix"]

    want = {"shape": [300, 200], "nnz": a.nnz, "data_sum": float(a.data.sum(dtype="f8"))}
    assert seen(a) == {"name": "q_proj", **want}
    worker = pool._workers["interpret"]
    assert matrix_key(a) in worker._held
    assert isinstance(outgoing({"matrix": a}, worker._held)[0]["matrix"], MatrixRef)
    assert seen(SparseMatrix(a.indptr, a.indices, a.data, a.shape, a.dtype, "v_proj")) == {"name": "v_proj", **want}
    worker._held.add(matrix_key(c))   # the driver believes the worker holds c; it never got it
    assert seen(c)["data_sum"] == pytest.approx(float(c.data.sum(dtype="f8")))
    assert matrix_key(c) in worker._held
