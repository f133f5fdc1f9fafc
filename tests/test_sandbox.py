"""The sandboxed worker pool: crashes, hangs and exits are outcomes; the caller and pool survive."""
from pathlib import Path

import pytest
import scipy.sparse as sp

from sparseditto.harness import WorkerPool, run_and_verify, sandbox
from sparseditto.matrix import SparseMatrix

CANDIDATES = Path(__file__).parent / "candidates"


@pytest.fixture(scope="session")
def pool(tmp_path_factory):
    """One pool for the whole session (shared with the other harness test modules)."""
    existing = sandbox.default_pool_if_started()
    if existing is not None:
        return existing
    created = WorkerPool(cache_dir=tmp_path_factory.getbasetemp() / "harness-cache")
    sandbox.set_default_pool(created)
    return created


@pytest.fixture(scope="module")
def small():
    return SparseMatrix.from_scipy(sp.random(8, 12, density=0.3, random_state=3, format="csr"))


def ping(pool, backend="interpret"):
    reply = pool.call("ping", {"echo": 7}, backend=backend, timeout=120)
    assert reply.status == "ok", reply
    return reply.value


def test_interpreter_worker_runs_with_triton_interpret(pool):
    info = ping(pool)
    assert info["echo"] == 7
    assert info["triton_interpret"] == "1"
    assert info["backend"] == "interpret"
    assert pool.worker_info("interpret")["backend"] == "interpret"


def test_ctypes_segfault_is_refused_by_the_audit_hook(pool, small):
    before = ping(pool)["pid"]
    src = (CANDIDATES / "broken_segfault_ctypes.py").read_text()
    result = run_and_verify(src, small, pool=pool, timeout=60, check_static=False, n_values=(1,))
    assert (result.status, result.failure_class) == ("refused", "sandbox_violation") and not result.ok
    assert "ctypes.string_at" in result.message
    assert ping(pool)["pid"] == before  # refused before it could crash anything


def test_os_exit_is_a_crash_with_its_exit_code(pool, small):
    src = (CANDIDATES / "broken_os_exit.py").read_text()
    result = run_and_verify(src, small, pool=pool, timeout=60, check_static=False, n_values=(1,))
    assert result.status == "crash"
    assert result.failure_class == "worker_crash"
    assert "exited with code 3" in result.message


def test_out_of_bounds_triton_load_is_a_crash_and_the_pool_recovers(pool, small):
    before = ping(pool)["pid"]
    src = (CANDIDATES / "broken_oob_triton.py").read_text()
    result = run_and_verify(src, small, pool=pool, timeout=60, n_values=(1,), extra_ns=False)
    assert result.status == "crash" and result.failure_class == "worker_crash_SIGSEGV", result.message
    assert "Segmentation fault" in result.message  # faulthandler's report from the dead worker
    after = ping(pool)
    assert after["pid"] != before and after["triton_interpret"] == "1"


def test_infinite_loop_times_out_and_the_next_call_works(pool, small):
    src = (CANDIDATES / "broken_infinite_loop.py").read_text()
    result = run_and_verify(src, small, pool=pool, timeout=3, n_values=(1,))
    assert result.status == "timeout" and result.failure_class == "timeout"
    assert "exceeded 3.0 s" in result.message
    good = (CANDIDATES / "good_torch_scatter.py").read_text()
    assert run_and_verify(good, small, pool=pool, timeout=120, n_values=(1,)).status == "verified"


def test_a_harness_exception_is_an_error_reply_and_the_worker_stays(pool):
    pid = ping(pool)["pid"]
    reply = pool.call("verify", {"not": "a verify payload"}, backend="interpret", timeout=60)
    assert reply.status == "error" and "KeyError" in reply.error and not reply.restarted
    assert ping(pool)["pid"] == pid


def test_bad_calls_are_value_errors(pool):
    with pytest.raises(ValueError, match="Unknown worker task"):
        pool.call("rm -rf", None, backend="interpret", timeout=5)
    with pytest.raises(ValueError, match="Unknown execution backend"):
        pool.call("ping", None, backend="rocm", timeout=5)
    with pytest.raises(ValueError, match="positive timeout"):
        pool.call("ping", None, backend="interpret", timeout=0)


def test_resolve_backend():
    import torch

    assert sandbox.resolve_backend("interpret") == "interpret"
    assert sandbox.resolve_backend("auto") == ("cuda" if torch.cuda.is_available() else "interpret")
    with pytest.raises(ValueError, match="Unknown execution backend"):
        sandbox.resolve_backend("metal")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            sandbox.resolve_backend("cuda")


def test_closed_pool_refuses_work_and_its_workers_are_gone(tmp_path):
    with WorkerPool(cache_dir=tmp_path) as own:
        pid = own.call("ping", None, backend="interpret", timeout=120).value["pid"]
        proc = own._workers["interpret"].proc
        assert proc.poll() is None
    assert own.closed and proc.poll() is not None
    with pytest.raises(RuntimeError, match="closed"):
        own.call("ping", None, backend="interpret", timeout=5)
    assert pid > 0


def test_worker_log_tail_and_exit_description():
    assert sandbox._describe_exit(-11) == ("worker killed by SIGSEGV", "SIGSEGV")
    assert sandbox._describe_exit(3) == ("worker exited with code 3", None)
    assert sandbox._describe_exit(None) == ("worker vanished", None)
