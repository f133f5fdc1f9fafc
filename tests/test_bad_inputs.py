"""Malformed input, table-driven: each case is a clear ValueError naming the problem (or a
documented warning), raised before anything expensive runs. The absurd headers must fail in well
under a second without allocating what they declare."""
from __future__ import annotations

import gzip
import json
import os
import sqlite3
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from sparseditto import cli
from sparseditto.api import SpMMKernel, run_graph
from sparseditto.harness import BenchError, WorkerPool, bench, compile_candidate, run_and_verify
from sparseditto.io import load_matrix
from sparseditto.matrix import SparseMatrix
from sparseditto.memory import Memory, _open_error, n_bucket

MM = "%%MatrixMarket matrix coordinate real general\n"
SMALL = SparseMatrix.from_scipy(sp.random(6, 5, density=0.5, random_state=0, format="csr"), name="small")
GOOD_SRC = (Path(__file__).parent / "candidates" / "good_torch_scatter.py").read_text()


def text_file(name: str, text: str | bytes):
    def make(tmp: Path) -> Path:
        path = tmp / name
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return path
    return make


def loads(name, text, **kw):
    make = text_file(name, text)
    return lambda tmp: load_matrix(make(tmp), **kw)


def run(**kw):
    def call(tmp):
        base = dict(backend="interpret", memory=False, checkpoint=tmp / "c.sqlite")
        return run_graph(SMALL, **{**base, **kw})
    return call


def cli_main(*argv):
    def call(tmp):
        args = [a.replace("{tmp}", str(tmp)) for a in argv]
        code = cli.main(args)
        if code != 0:
            raise ValueError(f"exit {code}")
        return code
    return call


def npz_file(name, **arrays):
    def make(tmp):
        path = tmp / name
        np.savez(path, **arrays)
        return load_matrix(path)
    return make


def torch_file(name, obj, **kw):
    def make(tmp):
        path = tmp / name
        torch.save(obj, path)
        return load_matrix(path, **kw)
    return make


def gzip_bomb(tmp):
    """96 MB of zeros in a ~100 kB file, against a 64 MB memory limit (SPARSEDITTO_MEMORY_LIMIT)."""
    path = tmp / "bomb.mtx.gz"
    with gzip.open(path, "wb", compresslevel=9) as fh:
        fh.write(MM.encode() + b"2 2 1\n1 1 1\n")
        for _ in range(6):
            fh.write(b"\0" * (16 << 20))
    assert path.stat().st_size < 1 << 20
    os.environ["SPARSEDITTO_MEMORY_LIMIT"] = str(64 << 20)
    try:
        return load_matrix(path)
    finally:
        del os.environ["SPARSEDITTO_MEMORY_LIMIT"]


class _Module(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(2, 2))


def readonly_db_error(tmp):
    path = tmp / "ro.sqlite"
    sqlite3.connect(path).execute("CREATE TABLE t (x)").connection.commit()
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        conn.execute("INSERT INTO t VALUES (1)")
    except sqlite3.OperationalError as exc:
        raise _open_error(path, exc)


def memory_write(action):
    def call(tmp):
        with Memory(tmp / "m.sqlite") as mem:
            return action(mem)
    return call


def dir_path(tmp):
    (tmp / "adir").mkdir(exist_ok=True)
    return tmp / "adir"


def under_a_file(tmp):
    (tmp / "afile").write_text("x")
    return tmp / "afile" / "x.sqlite"


def with_path(fn, make_path):
    return lambda tmp: fn(make_path(tmp))


CASES = {
    # ---- Matrix Market: headers checked before anything is allocated --------------------------------
    "mtx 8e9 rows in 100 bytes": (loads("huge.mtx", MM + "8000000000 8000000000 2\n1 1 1\n2 2 2\n"),
                                  ["8000000000 rows", "maximum"]),
    "mtx 1e8 x 1e8": (loads("h2.mtx", MM + "100000000 100000000 2\n1 1 1\n2 2 2\n"), ["100000000 rows"]),
    "mtx 8e9 columns": (loads("h3.mtx", MM + "2 8000000000 2\n1 1 1\n2 2 2\n"), ["8000000000 columns"]),
    "mtx nnz beyond cells": (loads("h4.mtx", MM + "2 2 9\n1 1 1\n"), ["9 entries", "2 x 2 cells"]),
    "mtx 1e12 entries declared": (loads("h5.mtx", MM + "1000000 1000000 1000000000000\n1 1 1\n"),
                                  ["1000000000000 entries"]),
    "mtx array 6e4 x 6e4 in 30 bytes": (loads("h6.mtx", "%%MatrixMarket matrix array real general\n60000 60000\n1\n"),
                                        ["60000"]),
    "mtx negative rows": (loads("n.mtx", MM + "-3 3 1\n1 1 1\n"), ["negative"]),
    "mtx negative nnz": (loads("n2.mtx", MM + "3 3 -1\n"), ["negative"]),
    "mtx no banner": (loads("nb.mtx", "3 3 1\n1 1 1\n"), ["%%MatrixMarket"]),
    "mtx short banner": (loads("sb.mtx", "%%MatrixMarket matrix coordinate\n3 3 1\n1 1 1\n"), ["malformed Matrix Market header"]),
    "mtx vector object": (loads("v.mtx", "%%MatrixMarket vector coordinate real general\n3 1\n1 1\n"), ["'vector'"]),
    "mtx complex field": (loads("c.mtx", "%%MatrixMarket matrix coordinate complex general\n1 1 1\n1 1 1 0\n"), ["complex"]),
    "mtx hermitian": (loads("he.mtx", "%%MatrixMarket matrix coordinate real hermitian\n1 1 1\n1 1 1\n"), ["hermitian"]),
    "mtx unknown field": (loads("u.mtx", "%%MatrixMarket matrix coordinate quaternion general\n1 1 1\n1 1 1\n"), ["quaternion"]),
    "mtx unknown symmetry": (loads("us.mtx", "%%MatrixMarket matrix coordinate real diagonal\n1 1 1\n1 1 1\n"), ["diagonal"]),
    "mtx unknown layout": (loads("ul.mtx", "%%MatrixMarket matrix banded real general\n1 1 1\n1 1 1\n"), ["banded"]),
    "mtx size line 2 numbers": (loads("s2.mtx", MM + "3 3\n1 1 1\n"), ["rows cols nnz"]),
    "mtx size line text": (loads("st.mtx", MM + "three 3 1\n1 1 1\n"), ["size line", "'three'"]),
    "mtx no size line": (loads("ns.mtx", MM + "% only a comment\n"), ["no size line"]),
    "mtx truncated": (loads("t.mtx", MM + "3 3 4\n1 1 1\n2 2 2\n3 3 3\n"), ["truncated", "4 entries"]),
    "mtx extra entries": (loads("x.mtx", MM + "3 3 1\n1 1 1\n2 2 2\n"), ["1 entries"]),
    "mtx bad token": (loads("bt.mtx", MM + "2 2 2\n1 1 1\n2 x 2\n"), ["'2 x 2'", "line 4"]),
    "mtx fractional index": (loads("fi.mtx", MM + "2 2 1\n1.5 1 1\n"), ["indices are integers", "'1.5 1 1'"]),
    "mtx zero index": (loads("zi.mtx", MM + "2 2 1\n0 1 1\n"), ["out-of-range", "1-based"]),
    "mtx index past rows": (loads("ip.mtx", MM + "2 2 1\n3 1 1\n"), ["out-of-range", "(3, 1)"]),
    "mtx NaN value": (loads("nan.mtx", MM + "2 2 1\n1 1 nan\n"), ["NaN/Inf"]),
    "mtx Inf value": (loads("inf.mtx", MM + "2 2 1\n1 1 inf\n"), ["NaN/Inf"]),
    "mtx value beyond float32": (loads("big.mtx", MM + "2 2 1\n1 1 1e39\n", dtype="float32"), ["NaN/Inf"]),
    "mtx all zero": (loads("z.mtx", MM + "2 2 0\n"), ["no nonzeros"]),
    "mtx symmetric not square": (loads("sq.mtx", "%%MatrixMarket matrix coordinate real symmetric\n2 3 1\n1 1 1\n"), ["square"]),
    "mtx skew diagonal": (loads("sk.mtx", "%%MatrixMarket matrix coordinate real skew-symmetric\n2 2 1\n1 1 5\n"), ["diagonal"]),
    "mtx array pattern": (loads("ap.mtx", "%%MatrixMarket matrix array pattern general\n2 2\n"), ["pattern"]),
    "mtx array truncated": (loads("at.mtx", "%%MatrixMarket matrix array real general\n2 2\n1\n2\n3\n"), ["needs 4 values"]),
    "mtx empty file": (loads("e.mtx", ""), ["%%MatrixMarket"]),
    "mtx gzip corrupt": (loads("g.mtx.gz", b"\x1f\x8b\x08\x00garbage"), ["gzip"]),
    "mtx gzip bomb": (gzip_bomb, ["decompresses to more than"]),
    # ---- DLMC .smtx -----------------------------------------------------------------------------------
    "smtx bad header": (loads("a.smtx", "3, 3\n0 1 2 3\n0 1 2\n"), ["rows, cols, nnz"]),
    "smtx 8e9 rows": (loads("b.smtx", "8000000000, 4, 2\n0 1 2\n0 1\n"), ["8000000000 rows"]),
    "smtx nnz beyond cells": (loads("c.smtx", "2, 2, 9\n0 9 9\n0 1 0 1 0 1 0 1 0\n"), ["9 entries"]),
    "smtx offsets count": (loads("d.smtx", "2, 2, 2\n0 2\n0 1\n"), ["row offsets"]),
    "smtx indices count": (loads("e.smtx", "2, 2, 2\n0 1 2\n0\n"), ["column indices"]),
    "smtx offsets decrease": (loads("f.smtx", "2, 2, 2\n0 2 1\n0 1\n"), ["start at 0", "end at nnz"]),
    "smtx offsets not from zero": (loads("g.smtx", "2, 2, 2\n1 1 2\n0 1\n"), ["start at 0"]),
    "smtx column out of range": (loads("h.smtx", "2, 2, 2\n0 1 2\n0 5\n"), ["out-of-range"]),
    "smtx too many lines": (loads("i.smtx", "2, 2, 2\n0 1 2\n0 1\n4\n"), ["3 lines"]),
    # ---- containers -----------------------------------------------------------------------------------
    "npz not a zip": (loads("a.npz", b"not a zip"), ["Cannot load"]),
    "npz two arrays, no name": (npz_file("b.npz", a=np.eye(2), b=np.eye(3)), ["tensor=NAME"]),
    "npz 3-D array": (npz_file("c.npz", a=np.ones((2, 2, 2))), ["2-D", "3-D"]),
    "npz complex array": (npz_file("d.npz", a=np.ones((2, 2), complex)), ["complex"]),
    "npz string array": (npz_file("e.npz", a=np.array([["a", "b"]])), ["Unsupported value dtype"]),
    "npz 1-D array": (npz_file("f.npz", a=np.ones(4)), ["2-D", "1-D"]),
    "pt pickled module": (torch_file("a.pt", _Module()), ["weights_only", "state_dict"]),
    "pt wrong tensor name": (torch_file("b.pt", {"w": torch.eye(2)}, tensor="v"), ["'v' not found", "w"]),
    "pt 1-D tensor": (torch_file("c.pt", torch.ones(3)), ["2-D", "1-D"]),
    "pt not a torch file": (loads("d.pt", b"garbage bytes"), ["Cannot load"]),
    "safetensors garbage": (loads("a.safetensors", b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage"), ["safetensors"]),
    "unknown suffix": (loads("m.csv", "1,2\n"), ["Unknown matrix file format"]),
    "missing file": (lambda tmp: load_matrix(tmp / "nope.mtx"), ["not found"]),
    "directory as matrix": (lambda tmp: load_matrix(tmp), ["directory"]),
    "tensor= for a single-matrix file": (loads("s.mtx", MM + "1 1 1\n1 1 1\n", tensor="w"), ["single matrix"]),
    # ---- in-memory objects ----------------------------------------------------------------------------
    "numpy 1-D": (lambda tmp: load_matrix(np.ones(3)), ["2-D"]),
    "numpy 3-D": (lambda tmp: load_matrix(np.ones((2, 2, 2))), ["3-D"]),
    "numpy empty": (lambda tmp: load_matrix(np.ones((0, 4))), ["non-empty"]),
    "numpy object dtype": (lambda tmp: load_matrix(np.array([[object()]])), ["Unsupported value dtype"]),
    "python list": (lambda tmp: load_matrix([[1, 0], [0, 1]]), ["Unsupported matrix source", "list"]),
    "None": (lambda tmp: load_matrix(None), ["NoneType"]),
    "torch meta": (lambda tmp: load_matrix(torch.empty(3, 3, device="meta")), ["meta"]),
    "torch complex": (lambda tmp: load_matrix(torch.ones(2, 2, dtype=torch.complex64)), ["complex"]),
    "torch bool": (lambda tmp: load_matrix(torch.ones(2, 2, dtype=torch.bool)), ["torch.bool"]),
    "scipy with NaN": (lambda tmp: load_matrix(sp.csr_array(np.array([[np.nan, 1.0]]))), ["NaN/Inf"]),
    "dtype override int8": (lambda tmp: load_matrix(np.eye(2), dtype="int8"), ["dtype override"]),
    "tensor= on an array": (lambda tmp: load_matrix(np.eye(2), tensor="w"), ["in-memory"]),
    "shape beyond the limit": (lambda tmp: load_matrix(sp.coo_array(([1.0], ([0], [0])), shape=(10 ** 9, 2))),
                               ["1000000000 rows"]),
    # ---- run_graph settings -------------------------------------------------------------------------
    "dtype int8": (run(dtype="int8"), ["Unsupported dtype", "int8"]),
    "dtype float64": (run(dtype="float64"), ["Unsupported dtype"]),
    "backend metal": (run(backend="metal"), ["Unknown backend", "metal"]),
    "n = 0": (run(n=0), ["N >= 1", "0"]),
    "n = -4": (run(n=-4), ["N >= 1"]),
    "n = []": (run(n=[]), ["empty list"]),
    "n = 1.5": (run(n=1.5), ["integer N", "1.5"]),
    "n = '16'": (run(n="16"), ["integer N"]),
    "n = True": (run(n=True), ["integer N", "True"]),
    "n = 10**9": (run(n=10 ** 9), ["1000000000", "maximum"]),
    "n list with 0": (run(n=[16, 0]), ["N >= 1"]),
    "budget 0": (run(budget=0), ["budget", "positive"]),
    "budget -2": (run(budget=-2), ["budget"]),
    "budget True": (run(budget=True), ["budget"]),
    "budget 10**6": (run(budget=10 ** 6), ["maximum"]),
    "seed -1": (run(seed=-1), ["non-negative int", "-1"]),
    "seed 1.5": (run(seed=1.5), ["non-negative int"]),
    "seed '0'": (run(seed="0"), ["non-negative int"]),
    "seed True": (run(seed=True), ["non-negative int"]),
    "seed 2**64": (run(seed=2 ** 64), ["2**63"]),
    "unknown target": (run(target="Z999"), ["Z999"]),
    "memory of a wrong type": (run(memory=123), ["memory must be"]),
    "memory empty path": (run(memory=""), ["empty"]),
    "memory is a directory": (lambda tmp: run(memory=dir_path(tmp))(tmp), ["is a directory"]),
    "memory under a file": (lambda tmp: run(memory=under_a_file(tmp))(tmp), ["not a writable directory"]),
    "checkpoint is a directory": (lambda tmp: run(checkpoint=dir_path(tmp))(tmp), ["Checkpoint", "directory"]),
    "checkpoint under a file": (lambda tmp: run(checkpoint=under_a_file(tmp))(tmp), ["Checkpoint", "not a writable"]),
    "unknown option": (run(colour="red"), ["Unknown run_graph option", "colour"]),
    "approve=True without a terminal": (run(approve=True), ["not interactive"]),
    "tensor= with an in-memory matrix": (run(tensor="w"), ["tensor='w'"]),
    # ---- CLI: output paths checked before the run ---------------------------------------------------
    "cli --out is a directory": (cli_main("run", "{tmp}/m.mtx", "--out", "{tmp}", "--backend", "interpret"), ["exit 2"]),
    "cli --out folder missing": (cli_main("analyze", "{tmp}/m.mtx", "--out", "{tmp}/no/such/r.json"), ["exit 2"]),
    "cli -n 0": (cli_main("run", "{tmp}/m.mtx", "-n", "0"), ["exit 2"]),
    "cli --budget 0": (cli_main("run", "{tmp}/m.mtx", "--budget", "0"), ["exit 2"]),
    "cli missing matrix": (cli_main("analyze", "{tmp}/missing.mtx"), ["exit 2"]),
    "cli export --out directory": (cli_main("memory", "export", "--memory", "{tmp}/m.sqlite", "--out", "{tmp}"), ["exit 2"]),
    "cli memory is a directory": (cli_main("memory", "list", "--memory", "{tmp}"), ["exit 2"]),
    # ---- harness entry points ---------------------------------------------------------------------
    "verify seed -1": (lambda tmp: run_and_verify(GOOD_SRC, SMALL, seed=-1), ["non-negative int"]),
    "verify N 0": (lambda tmp: run_and_verify(GOOD_SRC, SMALL, n_values=(0,)), ["positive N"]),
    "verify N 2**21": (lambda tmp: run_and_verify(GOOD_SRC, SMALL, n_values=(2 ** 21,)), ["maximum"]),
    "verify N 2.5": (lambda tmp: run_and_verify(GOOD_SRC, SMALL, n_values=(2.5,)), ["integer N"]),
    "verify dtype int8": (lambda tmp: run_and_verify(GOOD_SRC, SMALL, dtype="int8"), ["Unsupported dtype"]),
    "verify not a matrix": (lambda tmp: run_and_verify(GOOD_SRC, np.eye(3)), ["SparseMatrix"]),
    "verify not a candidate": (lambda tmp: run_and_verify(object(), SMALL), ["Candidate"]),
    "bench N 0": (lambda tmp: bench(GOOD_SRC, SMALL, 0), ["positive N"]),
    "bench repeats 0": (lambda tmp: bench(GOOD_SRC, SMALL, 4, repeats=0), ["repeats >= 1"]),
    "compile arch 'hopper'": (lambda tmp: compile_candidate(GOOD_SRC, arch="hopper"), ["CUDA arch"]),
    "pool unknown task": (lambda tmp: WorkerPool(cache_dir=tmp).call("rm -rf", None, backend="interpret", timeout=5),
                          ["Unknown worker task"]),
    "pool zero timeout": (lambda tmp: WorkerPool(cache_dir=tmp).call("ping", None, backend="interpret", timeout=0),
                          ["positive timeout"]),
    # ---- memory ---------------------------------------------------------------------------------------
    "memory read-only database": (readonly_db_error, ["read-only"]),
    "memory junk file": (lambda tmp: Memory(text_file("junk.sqlite", b"not sqlite" * 200)(tmp)), ["not a usable SQLite"]),
    "memory n_bucket 0": (lambda tmp: n_bucket(0), ["N >= 1"]),
    "memory unknown run id": (memory_write(lambda m: m.get_run("nope")), ["Unknown run id"]),
    "memory bad step kind": (memory_write(lambda m: m.record_step(m.start_run(signature="s"), "x", "gossip")),
                             ["Unknown step kind"]),
    "memory unknown candidate field": (memory_write(lambda m: m.record_candidate(m.start_run(signature="s"),
                                                                                 template="t", status="v", colour=1)),
                                       ["Unknown candidate field"]),
    "memory bad final status": (memory_write(lambda m: m.finish_run(m.start_run(signature="s"), "great")),
                                ["Unknown final run status"]),
    "memory empty signature": (memory_write(lambda m: m.start_run(signature="")), ["signature"]),
    # ---- the chosen kernel ----------------------------------------------------------------------------
    "kernel int64 B on dense": (lambda tmp: SpMMKernel(SMALL, None)(torch.ones(5, 2, dtype=torch.int64)),
                                ["floating point"]),
    "kernel int8 B": (lambda tmp: SpMMKernel(SMALL, GOOD_SRC, "c", verified_ns=[2], verified_dtype="float16")(
        torch.ones(5, 2, dtype=torch.int8)), ["floating point"]),
    "kernel wrong dtype": (lambda tmp: SpMMKernel(SMALL, GOOD_SRC, "c", verified_ns=[2], verified_dtype="float16")(
        torch.ones(5, 2)), ["verified for float16"]),
    "kernel wrong rows": (lambda tmp: SpMMKernel(SMALL, None)(torch.ones(7, 2)), ["7 rows"]),
    "kernel 3-D B": (lambda tmp: SpMMKernel(SMALL, None)(torch.ones(5, 2, 1)), ["2-D B"]),
    "kernel unverified N, no first-use check": (
        lambda tmp: SpMMKernel(SMALL, GOOD_SRC, "c", verified_ns=[2], verified_dtype="float32", verify_new_n=False)(
            torch.ones(5, 9)), ["not N=9"]),
}


@pytest.fixture(autouse=True)
def small_mtx(tmp_path):
    (tmp_path / "m.mtx").write_text(MM + "2 2 2\n1 1 1\n2 2 2\n")


def test_the_table_is_large():
    assert len(CASES) >= 90, len(CASES)


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_a_clear_value_error(case, tmp_path):
    make, expected = CASES[case]
    start = time.perf_counter()
    with pytest.raises(ValueError) as info:
        make(tmp_path)
    seconds = time.perf_counter() - start
    text = str(info.value)
    for fragment in expected:
        assert fragment in text, f"{case}: {fragment!r} missing from {text!r}"
    limit = 10.0 if case == "mtx gzip bomb" else 5.0
    assert seconds < limit, f"{case} took {seconds:.1f} s"


def test_absurd_headers_fail_in_well_under_a_second(tmp_path):
    for name, text in (("a.mtx", MM + "8000000000 8000000000 2\n1 1 1\n2 2 2\n"),
                       ("b.smtx", "8000000000, 4, 2\n0 1 2\n0 1\n")):
        path = tmp_path / name
        path.write_text(text)
        assert path.stat().st_size < 100
        start = time.perf_counter()
        with pytest.raises(ValueError):
            load_matrix(path)
        assert time.perf_counter() - start < 0.5


def test_float16_overflow_is_warned_documented_fallback(tmp_path):
    big = SparseMatrix.from_scipy(sp.csr_array(np.array([[1e5, 0.0], [0.0, 2.0]])), name="big")
    from sparseditto.api import warn_float16_overflow

    with pytest.warns(UserWarning, match="exceed float16's range"):
        warn_float16_overflow(big, "float16")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_float16_overflow(big, "bfloat16")  # in range: no warning
        warn_float16_overflow(SMALL, "float16")


def test_output_paths_are_checked_before_any_work(tmp_path, capsys, monkeypatch):
    import sparseditto.api as api

    def never(*a, **k):  # the run must not start when its output cannot be written
        raise AssertionError("run_graph started despite an unusable --out path")

    monkeypatch.setattr(api, "run_graph", never)
    assert cli.main(["run", str(tmp_path / "m.mtx"), "--out", str(tmp_path / "missing" / "r.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    out = tmp_path / "r.json"
    json.dumps({})  # a plain writable file path passes the check
    assert cli.check_output_path(str(out), "--out") == out
    assert os.access(tmp_path, os.W_OK)
