"""bench / run_baselines / timing: the interpreter path on CPU, the real cold-L2 path on a GPU."""
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.sparse as sp

from sparseditto.harness import BASELINE_NAMES, BenchError, bench, run_and_verify, run_baselines
from sparseditto.harness.baselines import choose_bsr_block, is_2to4_rows
from sparseditto.harness.timing import check_repeats, summarize, time_cpu
from sparseditto.matrix import SparseMatrix

CANDIDATES = Path(__file__).parent / "candidates"


def source(name: str) -> str:
    return (CANDIDATES / name).read_text()


def small_matrix(m=10, k=16, seed=4):
    return SparseMatrix.from_scipy(sp.random(m, k, density=0.3, random_state=seed, format="csr"))


def two_four_matrix(m, k, seed=0):
    """Exactly 2 nonzeros in every group of 4 consecutive columns of every row."""
    rng = np.random.default_rng(seed)
    keep = np.argsort(rng.random((m, k // 4, 4)), axis=2)[:, :, :2]
    mask = np.zeros((m, k // 4, 4), bool)
    np.put_along_axis(mask, keep, True, axis=2)
    dense = np.where(mask.reshape(m, k), rng.uniform(0.5, 1.5, (m, k)), 0.0)
    return SparseMatrix.from_scipy(sp.csr_array(dense), name="two_four")


def test_bench_on_the_interpreter(pool):
    result = bench(source("good_triton_csr.py"), small_matrix(), 7, dtype="float32", repeats=2,
                   warmup=0, pool=pool, chain=True)
    assert result.backend == "interpret" and result.timings_are_gpu is False
    assert result.candidate_chain is None and result.dense_chain is None   # chained timing: GPU only
    assert "not GPU timings" in result.gpu_name
    assert result.dense.median_ms > 0 and result.candidate.median_ms > 0 and result.candidate.repeats == 2
    assert result.candidate_graph is None and result.conversion_ms >= 0
    assert result.reverified, result.reverify_message
    assert [b.name for b in result.baselines] == list(BASELINE_NAMES)
    by_name = {b.name: b for b in result.baselines}
    assert by_name["cublas_dense"].ok and by_name["cusparse_csr_torch"].ok  # CPU-capable in fp32
    for name in ("cusparse_csr_cupy", "cusparselt_2to4", "triton_bsr_torch"):
        assert not by_name[name].ok and "needs a CUDA GPU" in by_name[name].error
    assert result.speedup_vs_dense == pytest.approx(result.dense.median_ms / result.candidate.median_ms)
    assert result.best_baseline in ("cublas_dense", "cusparse_csr_torch")
    # where the bench's time went, step by step (no graph timing on the interpreter)
    assert list(result.stage_seconds) == ["prepare", "first check", "eager timing", "dense", "vendor baselines",
                                          "state check"]
    assert all(v >= 0 for v in result.stage_seconds.values())
    assert result.stage_seconds["prepare"] == pytest.approx(result.conversion_ms / 1e3, abs=0.05)
    assert result.model_dump_json()


def test_bench_refuses_wrong_and_rejected_kernels(pool):
    with pytest.raises(BenchError) as wrong:
        bench(source("cheat_zeros.py"), small_matrix(), 4, repeats=1, warmup=0, baselines=False, pool=pool)
    assert wrong.value.result.status == "wrong_result"
    with pytest.raises(BenchError) as rejected:
        bench(source("cheat_torch_mm.py"), small_matrix(), 4, pool=pool)
    assert rejected.value.result.status == "static_rejected"
    with pytest.raises(ValueError, match="repeats"):
        bench(source("good_torch_scatter.py"), small_matrix(), 4, repeats=0, pool=pool)
    with pytest.raises(ValueError, match="Unknown baseline"):
        bench(source("good_torch_scatter.py"), small_matrix(), 4, baselines=["mkl"], pool=pool)


def test_run_baselines_on_the_interpreter_keeps_failures(pool):
    results = run_baselines(small_matrix(), 8, "float16", repeats=2, warmup=0, pool=pool)
    by_name = {b.name: b for b in results}
    assert set(by_name) == set(BASELINE_NAMES)
    assert by_name["cublas_dense"].ok and by_name["cublas_dense"].timing.repeats == 2
    assert not by_name["cusparse_csr_torch"].ok and "float16" in by_name["cusparse_csr_torch"].error


def test_bench_rechecks_baselines_on_a_fresh_b_after_timing(pool):
    result = bench(source("good_triton_csr.py"), small_matrix(), 5, dtype="float32", repeats=2, warmup=0,
                   pool=pool, baseline_graphs=True, recheck_baselines=True)
    by_name = {b.name: b for b in result.baselines}
    for name in ("cublas_dense", "cusparse_csr_torch"):
        assert by_name[name].rechecked is True, by_name[name].recheck_message
        assert "fresh B" in by_name[name].recheck_message
        assert by_name[name].graph_timing is None  # no CUDA graphs on the interpreter
    assert by_name["triton_bsr_torch"].rechecked is None  # never ran, so never re-checked
    plain = bench(source("good_triton_csr.py"), small_matrix(), 5, dtype="float32", repeats=1, warmup=0,
                  pool=pool, baselines=["cusparse_csr_torch"])
    assert all(b.rechecked is None for b in plain.baselines)


def test_fresh_recheck_catches_a_baseline_that_ignores_its_input(monkeypatch):
    """A library answer computed once and replayed (ignoring the B it is given) passes the first
    check and times well; the re-check on a fresh B must fail it."""
    import torch

    from sparseditto.harness import baselines as bl
    from sparseditto.harness.numerics import Reference, draw_dense, with_values

    A = small_matrix(12, 16, seed=7)
    a = with_values(A, A.data.astype(np.float64), "float32")
    b64 = draw_dense(np.random.default_rng(0), (16, 3), "float32")
    B = torch.from_numpy(b64).float()
    ref = Reference.compute(a, a.data.astype(np.float64), b64, "float32")
    stale = torch.from_numpy(ref.value).float()
    monkeypatch.setitem(bl.BUILDERS, "cusparse_csr_torch", lambda ctx: ((lambda: stale.clone()), "replays"))
    fresh = bl.FreshInputs(a, B, "float32", seed=3)
    out = bl.measure_baselines(a, B, "float32", "interpret", ref=ref, repeats=1, warmup=0,
                               include=["cublas_dense", "cusparse_csr_torch"], fresh=fresh)
    by_name = {b.name: b for b in out}
    assert by_name["cusparse_csr_torch"].ok, "the first check on the timing input passes"
    assert by_name["cusparse_csr_torch"].rechecked is False
    assert "outside tolerance" in by_name["cusparse_csr_torch"].recheck_message
    assert by_name["cublas_dense"].rechecked is True


def test_lap_clock_charges_each_interval_to_its_names():
    import time

    from sparseditto.harness.timing import LapClock

    clock = LapClock()
    time.sleep(0.02)
    assert clock.lap("a") >= 0.02
    time.sleep(0.02)
    clock.lap()                       # an interval charged to no step
    time.sleep(0.02)
    clock.lap("a", "b")               # split between two
    assert set(clock.seconds) == {"a", "b"}
    assert clock.seconds["a"] >= 0.03 and 0.01 <= clock.seconds["b"] < clock.seconds["a"]
    assert sum(clock.seconds.values()) < clock.elapsed() - 0.015
    assert clock.rounded(1) == {k: round(v, 1) for k, v in clock.seconds.items()}


def test_timing_helpers():
    t = summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (t.median_ms, t.min_ms, t.repeats) == (3.0, 1.0, 5)
    assert t.p10_ms == pytest.approx(1.4) and t.p90_ms == pytest.approx(4.6)
    calls = []
    timing = time_cpu(lambda: calls.append(1), repeats=4, warmup=2)
    assert len(calls) == 6 and timing.repeats == 4
    with pytest.raises(ValueError, match="repeats"):
        check_repeats(0, 1)
    with pytest.raises(ValueError, match="empty"):
        summarize([])


def test_pattern_helpers_for_baselines():
    assert is_2to4_rows(two_four_matrix(8, 16))[0]
    ok, why = is_2to4_rows(small_matrix(8, 18))
    assert not ok and "multiple of 4" in why
    dense = np.zeros((4, 8))
    dense[0, :3] = 1.0
    ok, why = is_2to4_rows(SparseMatrix.from_scipy(sp.csr_array(dense)))
    assert not ok and "3 nonzeros" in why
    block = np.zeros((128, 128))
    block[:16, :16] = 1.0  # one 16x16 block: 16 stores 256 elements, 32 would store 1024
    assert choose_bsr_block(SparseMatrix.from_scipy(sp.csr_array(block))) == 16
    assert choose_bsr_block(SparseMatrix.from_scipy(sp.csr_array((64, 64)))) == 32


# ---- GPU (run by the lead on an H200) --------------------------------------------------------------

def gpu_matrix():
    return SparseMatrix.from_scipy(sp.random(1024, 2048, density=0.1, random_state=5, format="csr"),
                                   dtype="float16", name="gpu_random")


@pytest.mark.gpu
def test_gpu_bench_cold_l2_graph_and_baselines(pool):
    import torch

    result = bench(source("good_triton_csr.py"), gpu_matrix(), 16, repeats=20, pool=pool)
    assert result.backend == "cuda" and result.timings_are_gpu
    assert result.candidate_graph is not None and result.dense_graph is not None, result.notes
    props = torch.cuda.get_device_properties(0)
    assert result.l2_flush_bytes >= 2 * int(getattr(props, "L2_cache_size", 0))
    assert result.reverified, result.reverify_message
    by_name = {b.name: b for b in result.baselines}
    assert by_name["cublas_dense"].ok and by_name["cusparse_csr_torch"].ok, by_name
    assert by_name["triton_bsr_torch"].ok, by_name["triton_bsr_torch"].error
    assert not by_name["cusparselt_2to4"].ok and "not 2:4" in by_name["cusparselt_2to4"].error
    assert result.speedup_vs_dense > 0 and result.best_baseline


@pytest.mark.gpu
def test_gpu_vendor_baselines_replayed_from_cuda_graphs_and_rechecked(pool):
    result = bench(source("good_triton_csr.py"), gpu_matrix(), 16, repeats=10, pool=pool,
                   baseline_graphs=True, recheck_baselines=True)
    by_name = {b.name: b for b in result.baselines}
    assert by_name["cublas_dense"].graph_timing is not None
    for b in result.baselines:
        if b.ok:
            assert b.rechecked is True, (b.name, b.recheck_message)
            # a library whose call cannot be captured says so and keeps its eager timing
            assert b.graph_timing is not None or "capture failed" in (b.note or ""), (b.name, b.note)


@pytest.mark.gpu
def test_gpu_2to4_baseline_runs_on_a_2to4_matrix(pool):
    results = run_baselines(two_four_matrix(1024, 1024), 16, "float16", repeats=10, pool=pool,
                            include=["cublas_dense", "cusparselt_2to4", "cusparse_csr_cupy"])
    by_name = {b.name: b for b in results}
    assert by_name["cusparselt_2to4"].ok, by_name["cusparselt_2to4"].error
    pytest.importorskip("cupy")
    # cupyx may refuse float16 SpMM: then the reason is recorded, never a crash
    assert by_name["cusparse_csr_cupy"].ok or by_name["cusparse_csr_cupy"].error


@pytest.mark.gpu
def test_gpu_illegal_address_is_a_crash_and_the_worker_is_replaced(pool):
    result = run_and_verify(source("broken_oob_triton.py"), gpu_matrix(), pool=pool, n_values=(1,))
    assert result.status == "crash", result.message
    good = run_and_verify(source("good_triton_csr.py"), gpu_matrix(), pool=pool, n_values=(1, 7, 16))
    assert good.status == "verified", good.message


@pytest.mark.gpu
def test_gpu_builtin_dense_and_cuda_template(pool):
    builtin = SimpleNamespace(source="", backend="builtin", template="dense", params={}, source_hash="")
    assert run_and_verify(builtin, gpu_matrix(), pool=pool).status == "verified"
    registry = pytest.importorskip("sparseditto.kernel_templates.registry")
    pytest.importorskip("cupy")
    cand = registry.get_template("csr_vector").instantiate({})
    from sparseditto.harness import compile_candidate

    compiled = compile_candidate(cand, arch="sm_90", pool=pool)
    assert compiled.ok, compiled.log
    result = run_and_verify(cand, gpu_matrix(), pool=pool)
    assert result.status == "verified", result.message
    timed = bench(cand, gpu_matrix(), 16, repeats=10, baselines=False, pool=pool)
    assert timed.reverified and timed.timings_are_gpu


@pytest.mark.gpu
def test_gpu_chained_timing_of_a_decode_kernel_and_dense(pool):
    """bench(chain=True): the candidate and dense chained over L2-cold copies (at least 4, together
    3 L2 sizes), both outputs checked, and the chained ratio beside the single-launch one."""
    registry = pytest.importorskip("sparseditto.kernel_templates.registry")
    pytest.importorskip("cupy")
    A = two_four_matrix(4096, 4096)
    cand = registry.get_template("tc_sp24").instantiate({})
    timed = bench(cand, A, 16, repeats=10, baselines=False, pool=pool, chain=True)
    assert timed.reverified, timed.reverify_message
    assert timed.candidate_chain is not None and timed.dense_chain is not None, timed.notes
    assert timed.chain_copies >= 4 and "chained timing" in timed.stage_seconds
    assert timed.speedup_vs_dense_chain == pytest.approx(timed.dense_chain.median_ms / timed.candidate_chain.median_ms)
    # a lone replay carries a fixed cost a chained launch does not
    assert timed.candidate_chain.median_ms < timed.candidate_graph.median_ms


def test_warm_up_keeps_the_gpu_busy_for_milliseconds_not_only_launches():
    """The timing loops' warm-up: at least `warmup` launches and at least WARM_MS of busy time
    (H200: a kernel timed right after an idle gap read up to 2x slow), with the hooks' negative
    indices; warmup=0 (asked for by the caller) stays 0."""
    import time as _time

    from sparseditto.harness.timing import WARM_MS, warm_up

    calls, seen = [], []

    def step():
        calls.append(1)
        _time.sleep(0.001)   # a 1 ms "launch"

    t0 = _time.perf_counter()
    made = warm_up(step, 3, seen.append, lambda i: None, sync=lambda: None)
    busy_ms = (_time.perf_counter() - t0) * 1e3
    assert made == len(calls) == len(seen) and made >= 3
    assert busy_ms >= WARM_MS and made < 2 * WARM_MS     # stops soon after the threshold
    assert seen == [-1 - w for w in range(made)]
    assert warm_up(step, 50, lambda i: None, lambda i: None, min_ms=1.0, sync=lambda: None) == 50
    assert warm_up(step, 0, lambda i: None, lambda i: None, sync=lambda: None) == 0


@pytest.mark.gpu
def test_host_latency_before_a_launch_is_not_counted_as_kernel_time():
    """The LEAD_US spin (harness/timing.py): a host that takes 60 us to submit a graph replay after
    the start event must not add those 60 us to the kernel's median."""
    import torch

    from sparseditto.harness import timing

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    x = torch.randn(1 << 20, device="cuda")
    y = torch.empty_like(x)
    graph = timing.capture_graph(lambda: torch.mul(x, 2.0, out=y))
    prompt = timing._time_launches(graph.replay, 30, 3, True, None, None).median_ms
    slow_host = timing._time_launches(timing.host_delayed(graph.replay, 60), 30, 3, True, None, None).median_ms
    assert slow_host < prompt + 0.015, f"{slow_host * 1e3:.1f} us with a 60 us host delay vs {prompt * 1e3:.1f} us"


@pytest.mark.parametrize("n,columns", [(1, 1024), (3, 4), (5, 5)])
def test_timed_launch_outputs_are_checked_in_batched_references(n, columns, monkeypatch):
    """The kept launches of a timing loop share fp64 products (REFERENCE_COLUMNS columns each, down
    to one launch per product): a correct set passes, one wrong launch anywhere is named."""
    import importlib

    import torch

    from sparseditto.harness.numerics import round_to_dtype

    bench_mod = importlib.import_module("sparseditto.harness.bench")   # the module (the package exports the function)

    monkeypatch.setattr(bench_mod, "REFERENCE_COLUMNS", columns)
    A = small_matrix(12, 20, seed=7)
    values = round_to_dtype(A.data, "float32")
    dense = torch.from_numpy(A.to_dense()).to(torch.float32)
    B = torch.zeros(20, n)
    out = torch.zeros(12, n)
    timed = bench_mod._TimedInputs(B, out, "float32", np.random.default_rng(0), 9, A)
    for i in range(-9, 9):
        timed.before(i)
        out.copy_(dense @ B)
        timed.after(i)
    assert len(timed.kept) == 18
    kept = list(timed.kept)
    assert timed.check(values, "eager") == []
    for bad in (0, 7, 17):
        timed.kept = [(i, b, o.clone()) for i, b, o in kept]
        timed.kept[bad][2][3, n - 1] += 1.0
        problems = timed.check(values, "graph")
        assert len(problems) == 1 and f"graph launch {kept[bad][0]} output" in problems[0], problems
    assert timed.kept == []


def test_clone_packed_copies_tensors_and_forgets_launch_plans():
    """A chained timing rotates over copies of a prepared matrix: every tensor (nested too) is a new
    storage with the same bits, the compiled kernels are shared, and `scratch` (plans holding the
    original's device pointers) starts empty."""
    import torch

    from sparseditto.harness.timing import clone_packed

    kernels = {"k": object()}
    packed = {"values": torch.arange(6.0), "splits": {4: {"split": torch.ones(3, dtype=torch.int32)}},
              "work": (torch.zeros(2), torch.ones(2)), "arrays": ["values"], "kernels": kernels,
              "shape": (2, 3), "scratch": {"plan": "pointer of the original"}}
    copy = clone_packed(packed)
    assert copy["scratch"] == {} and packed["scratch"] == {"plan": "pointer of the original"}
    assert copy["kernels"]["k"] is kernels["k"] and copy["shape"] == (2, 3) and copy["arrays"] == ["values"]
    for a, b in ((packed["values"], copy["values"]), (packed["splits"][4]["split"], copy["splits"][4]["split"]),
                 (packed["work"][1], copy["work"][1])):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
    assert isinstance(copy["work"], tuple)


def test_chain_copies_hold_several_l2_sizes(monkeypatch):
    from sparseditto.harness import timing

    monkeypatch.setattr(timing, "l2_cache_bytes", lambda device=None: 60 << 20)
    assert timing.chain_copies(90e6) == timing.CHAIN_MIN_COPIES            # big weights: the minimum
    small = timing.chain_copies(5e6)
    assert small * 5e6 >= timing.CHAIN_L2_MULTIPLE * (60 << 20) and small <= timing.CHAIN_MAX_COPIES
    assert timing.chain_copies(1) == timing.CHAIN_MAX_COPIES
    with pytest.raises(ValueError, match="at least one launch"):
        timing.time_cuda_chain([])


@pytest.mark.gpu
def test_gpu_chained_timing_is_per_launch_and_below_a_lone_replay():
    """time_cuda_chain divides one replay of R launches by R: for a tiny kernel that is its launch
    cost inside a graph (~1 us on the H200), well below a lone replay between events (~3-4 us)."""
    import torch

    from sparseditto.harness import timing

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    xs = [torch.randn(1 << 12, device="cuda") for _ in range(16)]
    ys = [torch.empty_like(x) for x in xs]
    launches = [lambda x=x, y=y: torch.mul(x, 2.0, out=y) for x, y in zip(xs, ys)]
    lone = timing.time_cuda_graph(launches[0], repeats=20).median_ms
    chained = timing.time_cuda_chain(launches, repeats=20)
    assert chained.median_ms < lone and chained.p10_ms <= chained.median_ms <= chained.p90_ms
    assert all(torch.equal(y, 2.0 * x) for x, y in zip(xs, ys))


def test_chained_timing_says_why_it_cannot_copy_a_prepared_matrix(monkeypatch):
    """The chained timing clones the packed dict per copy (timing.clone_packed) and keeps the copies
    within CHAIN_MAX_BYTES: anything else is a note and the single-launch timings stay."""
    from sparseditto.harness import timing
    from sparseditto.harness.bench import _chain_refusal
    from sparseditto.harness.timing import CHAIN_MAX_BYTES

    monkeypatch.setattr(timing, "l2_cache_bytes", lambda device=None: 60 << 20)   # an H200's L2
    assert timing.chain_copies(90e6) == 4 and timing.chain_copies(1 << 20) == timing.CHAIN_MAX_COPIES

    assert _chain_refusal({"values": None}, 1 << 20) is None
    assert "not a dict" in _chain_refusal(("values",), 1 << 20)
    assert "no tensor bytes" in _chain_refusal({}, 0)
    assert "too large" in _chain_refusal({"values": None}, CHAIN_MAX_BYTES)
