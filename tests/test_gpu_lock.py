"""The cross-process GPU lock (harness.gpu_lock): timings alone on the GPU, verifications side by side.

Real processes and real flock on files in a temporary folder; no GPU needed (the lock names a GPU,
it never touches one). Times are recorded by each process as it enters and leaves its section."""
import multiprocessing as mp
import os
import signal
import time

import pytest

from sparseditto.harness import gpu_lock

CTX = mp.get_context("fork")


def _hold(folder, mode, hold_s, log, ready=None):
    lock = gpu_lock.lock_for("gpu-test", folder)
    section = lock.exclusive() if mode == "exclusive" else lock.shared()
    with section:
        log.put((os.getpid(), mode, "in", time.monotonic()))
        if ready is not None:
            ready.set()
        time.sleep(hold_s)
        log.put((os.getpid(), mode, "out", time.monotonic()))


def _events(log, count):
    return sorted((log.get(timeout=20) for _ in range(count)), key=lambda e: e[3])


def _start(*args, **kw):
    p = CTX.Process(target=_hold, args=args, kwargs=kw)
    p.start()
    return p


def test_a_timing_excludes_verifications_and_verifications_run_together(tmp_path):
    log, held = CTX.Queue(), CTX.Event()
    writer = _start(tmp_path, "exclusive", 0.6, log, ready=held)
    assert held.wait(10)
    readers = [_start(tmp_path, "shared", 0.4, log) for _ in range(2)]
    for p in [writer, *readers]:
        p.join(20)
        assert p.exitcode == 0
    ev = _events(log, 6)
    w_out = next(e[3] for e in ev if e[1] == "exclusive" and e[2] == "out")
    r_in = [e[3] for e in ev if e[1] == "shared" and e[2] == "in"]
    r_out = [e[3] for e in ev if e[1] == "shared" and e[2] == "out"]
    assert min(r_in) >= w_out                 # no shared step while the timing held the GPU
    assert max(r_in) < min(r_out)             # the two shared steps overlapped


def test_a_waiting_timing_goes_before_later_verifications(tmp_path):
    log, first_in = CTX.Queue(), CTX.Event()
    r1 = _start(tmp_path, "shared", 0.8, log, ready=first_in)
    assert first_in.wait(10)
    w = _start(tmp_path, "exclusive", 0.3, log)
    time.sleep(0.3)                            # the writer is now waiting for r1
    r2 = _start(tmp_path, "shared", 0.1, log)
    for p in (r1, w, r2):
        p.join(20)
        assert p.exitcode == 0
    ev = _events(log, 6)
    order = [(e[1], e[2]) for e in ev]
    assert order.index(("exclusive", "in")) > order.index(("shared", "out"))   # waited for r1 to leave
    r2_in = [e[3] for e in ev if e[0] == r2.pid and e[2] == "in"][0]
    w_out = [e[3] for e in ev if e[1] == "exclusive" and e[2] == "out"][0]
    assert r2_in >= w_out                      # r2 came after the writer asked: it waited for it


def test_a_killed_holder_releases_the_gpu(tmp_path):
    log, held = CTX.Queue(), CTX.Event()
    holder = _start(tmp_path, "exclusive", 60.0, log, ready=held)
    assert held.wait(10)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(10)
    lock = gpu_lock.lock_for("gpu-test", tmp_path)
    t0 = time.monotonic()
    with lock.shared():
        pass
    assert time.monotonic() - t0 < 5


def test_reentrant_inside_a_process_and_no_upgrade(tmp_path):
    lock = gpu_lock.lock_for("gpu-test", tmp_path)
    with lock.exclusive():
        with lock.exclusive():
            with lock.shared():
                assert lock._mode == "exclusive"
    assert lock._mode is None
    with lock.shared():
        with pytest.raises(RuntimeError, match="exclusive"):
            with lock.exclusive():
                pass
    assert lock._mode is None and lock._depth == 0


def test_sections_without_a_prepared_lock_are_no_ops_and_keys_are_checked(tmp_path, monkeypatch):
    gpu_lock._ACTIVE.clear()
    with gpu_lock.exclusive_section(), gpu_lock.shared_section():
        pass
    with pytest.raises(ValueError, match="plain file name"):
        gpu_lock.GpuLock(tmp_path, "../escape")
    monkeypatch.setenv("SPARSEDITTO_GPU_LOCK", "0")
    assert gpu_lock.for_current_device() is None and gpu_lock.active() is None


def _bench_seconds(result_box):
    from sparseditto import generate, harness
    from sparseditto.kernel_templates.registry import get_template

    A = generate.unstructured(256, 512, 0.9, seed=3)
    source = get_template("csr_rowsplit").instantiate({}).source
    t0 = time.monotonic()
    res = harness.bench(source, A, 8, dtype="float16", backend="cuda", repeats=5, warmup=1, baselines=False)
    result_box.append((time.monotonic() - t0, res))


@pytest.mark.gpu
def test_gpu_a_sandboxed_bench_waits_while_another_process_times():
    """On a GPU: the sandbox worker's timing takes the real device's lock (opened before the candidate's
    scope, so the audit hook has nothing to refuse) and waits while this process holds it."""
    import threading

    from sparseditto import harness

    lock = gpu_lock.lock_for(_device_key())
    box: list = []
    _bench_seconds(box)                        # warm: the worker is up, the kernel compiled
    assert box[0][1].candidate.median_ms > 0
    box.clear()
    with lock.exclusive():
        runner = threading.Thread(target=_bench_seconds, args=(box,))
        runner.start()
        time.sleep(3.0)
        assert runner.is_alive(), "the bench timed while another process held the GPU"
    runner.join(120)
    seconds, res = box[0]
    assert seconds >= 3.0 and res.candidate.median_ms > 0
    assert isinstance(res, harness.BenchResult)


def _device_key():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return gpu_lock.device_key()
