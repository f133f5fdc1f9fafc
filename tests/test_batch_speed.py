"""The batch's speed-ups that need no GPU to test: the shape's dense baseline taken from the
search's dense vendor record, the one vendor a reused layer re-times, a timing miss confirmed by
a second timing and judged against the group's median (stubbed GPU timings), and the parallel
analysis keeping the model's order."""
from __future__ import annotations

import types

import pytest

from sparseditto.batch import group, reuse, runner
from sparseditto.batch.baselines import DenseTiming, ShapeBaselines, vendor_names
from sparseditto.batch.models import LayerResult


def _record(**kw):
    base = dict(origin="template", template="delta_spmv", status="verified", timings_are_gpu=True, median_ms=0.013,
                eager_ms=0.07, graph_ms=0.013)
    return types.SimpleNamespace(**{**base, **kw})


def test_dense_baseline_comes_from_the_dense_vendor_record_not_the_benchmark_beside_the_best():
    # the H200 case: the dense run beside the best kernel's benchmark read 71.5 us, the dense path 14.6 us
    dense_rec = _record(origin="vendor", template="dense", median_ms=0.0146, eager_ms=0.031, graph_ms=0.0146)
    result = types.SimpleNamespace(candidates=[_record(), dense_rec],
                                   dense={"timings_are_gpu": True, "median_ms": 0.0715, "graph": {"median_ms": 0.0715},
                                          "eager": {"median_ms": 0.0715}})
    timing = group._dense_timing(result)
    cache = ShapeBaselines()
    cache.seed((4096, 4096), "float16", 1, "cuda", timing, "search of q")
    got = cache.dense[cache.key((4096, 4096), "float16", 1, "cuda")]
    assert got.for_basis(graph=True) == pytest.approx(0.0146) and got.for_basis(graph=False) == pytest.approx(0.031)
    # no dense vendor record (an older run): the benchmark's dense, as before
    result.candidates = [_record()]
    assert group._dense_timing(result) is result.dense


def test_a_reused_layer_re_times_only_the_leads_fastest_vendor():
    assert vendor_names({"cusparse_csr_torch": 0.07, "cusparse_csr_cupy": 0.3, "triton_bsr_torch": 0.66,
                         "cublas_dense": 0.02, "semi_structured": None}) == ["cusparse_csr_torch"]
    assert vendor_names({}) == [] and vendor_names(None) == []


class _Timing:
    def __init__(self, ms):
        self.median_ms = ms


class _Bench:
    def __init__(self, ms):
        self.candidate_graph = _Timing(ms)
        self.candidate = _Timing(ms * 3)
        self.baselines = []


def _settings():
    from sparseditto.targets import get_target

    s = reuse.BatchSettings(target=get_target("H200"), n_values=[1], dtype="float16", backend="cuda", budget=None,
                            tolerance=0.05, memory=None, checkpoint="")
    s.baselines.dense[s.baselines.key((64, 64), "float16", 1, "cuda")] = DenseTiming(0.02, 0.05, "search of lead")
    return s


@pytest.mark.parametrize("times, kept, benches", [
    ([0.0130], 0.0130, 1),              # within tolerance: one timing
    ([0.0200, 0.0131], 0.0131, 2),      # a miss, but the second timing is on time: kept, no search
    ([0.0200, 0.0190], 0.0190, 2),      # a miss confirmed: the caller searches
])
def test_a_timing_miss_is_confirmed_by_a_second_timing(monkeypatch, times, kept, benches):
    from sparseditto import harness

    calls = []

    def fake_bench(*args, **kwargs):
        calls.append(kwargs.get("baselines"))
        return _Bench(times[len(calls) - 1])

    monkeypatch.setattr(harness, "bench", fake_bench)
    monkeypatch.setattr(reuse, "estimates", lambda *a, **k: {"kernel": 1.0})
    A = types.SimpleNamespace(shape=(64, 64), name="layer")
    winner = LayerResult(name="lead", shape=(64, 64), dtype="float16", status="searched", template="delta_spmv",
                         source="def spmm(): pass", kernel_ms=0.0130, vendor_ms={"cusparse_csr_torch": 0.07})
    phases: dict = {}
    got = reuse._gpu_timing(winner, {}, A, {"kernel": 1.0}, _settings(), phases)
    observed, expected, dense_ms, _source, _vendors, basis, _scale = got
    assert len(calls) == benches and observed == pytest.approx(kept) and expected == pytest.approx(0.0130)
    assert calls[0] == ["cusparse_csr_torch"] and all(c is False for c in calls[1:])   # vendors timed once
    assert dense_ms == pytest.approx(0.02) and "time" in phases and "dense" in phases
    assert ("a second timing" in basis) == (benches == 2)


def test_parallel_analysis_records_layers_in_the_models_order(monkeypatch):
    """Whatever order the threads finish in, skips are journaled and groups built in model order."""
    import random
    import time as _time

    refs = [types.SimpleNamespace(name=f"w{i}") for i in range(12)]

    def fake_one(ref, min_sparsity):
        _time.sleep(random.random() * 0.02)
        i = int(ref.name[1:])
        if i % 5 == 0:
            return LayerResult(name=ref.name, shape=(4, 4), dtype="float16", status="skipped", reason="x"), None
        return None, {"shape": [4, 4], "pattern": "unstructured", "sparsity": 0.5 if i % 2 else 0.7, "nnz": 8,
                      "signature": ref.name}

    recorded = []
    monkeypatch.setattr(runner, "_analyze_one", fake_one)
    monkeypatch.setattr(runner, "record_layer", lambda journal, bar, layer: recorded.append(layer.name) or layer)
    monkeypatch.setattr(runner, "group_key", lambda report, dtype: f"s{report['sparsity']}")
    bar = types.SimpleNamespace(working=lambda *a: None)
    groups = runner._analyze(refs, {}, None, bar, 0.3, "float16")
    assert recorded == ["w0", "w5", "w10"]
    assert [r.name for r, _ in groups["s0.5"]] == [f"w{i}" for i in range(12) if i % 2 and i % 5]
    assert [r.name for r, _ in groups["s0.7"]] == [f"w{i}" for i in range(12) if not i % 2 and i % 5]


def test_a_resumed_batch_takes_the_analyses_from_the_journal(monkeypatch, tmp_path):
    """Every analyzed weight's report is journaled at once; a resumed batch (a new process, the
    same OUT) analyzes only the weights it has no report of, and groups them all as before."""
    from sparseditto.batch.journal import Journal

    refs = [types.SimpleNamespace(name=f"w{i}") for i in range(6)]
    analyzed = []

    def fake_one(ref, min_sparsity):
        analyzed.append(ref.name)
        return None, {"shape": [4, 4], "pattern": "unstructured", "sparsity": 0.5, "nnz": 8, "signature": ref.name}

    monkeypatch.setattr(runner, "_analyze_one", fake_one)
    monkeypatch.setattr(runner, "group_key", lambda report, dtype: "g")
    bar = types.SimpleNamespace(working=lambda *a: None)
    journal = Journal(tmp_path)
    first = runner._analyze(refs[:4], {}, journal, bar, 0.3, "float16")      # a batch killed after 4 analyses
    journal.close()
    assert analyzed == ["w0", "w1", "w2", "w3"] and len(first["g"]) == 4
    analyzed.clear()
    journal = Journal(tmp_path)
    again = runner._analyze(refs, {}, journal, bar, 0.3, "float16")
    assert analyzed == ["w4", "w5"]
    assert [r.name for r, _ in again["g"]] == [f"w{i}" for i in range(6)]
    assert again["g"][1][1]["signature"] == "w1" and set(journal.analyses()) == {f"w{i}" for i in range(6)}
    journal.close()


def test_ncu_setting_is_checked_and_reaches_every_search(monkeypatch, tmp_path):
    from sparseditto import api
    from sparseditto.batch.runner import run_batch

    with pytest.raises(ValueError, match="ncu must be one of best, all, off"):
        run_batch(tmp_path / "missing.safetensors", ncu="sometimes", out=tmp_path / "out")
    assert not (tmp_path / "out").exists()          # refused before anything was written

    seen = {}

    class Stop(Exception):
        pass

    def fake_run_graph(A, **kw):
        seen.update(kw)
        raise Stop

    monkeypatch.setattr(api, "run_graph", fake_run_graph)
    settings = _settings()
    settings.ncu = "off"
    base = LayerResult(name="w", shape=(64, 64), dtype="float16", status="failed")
    with pytest.raises(Stop):
        group._search(object(), base, {}, settings, None)
    assert seen["ncu"] == "off" and seen["n"] == [1]


def test_the_eta_counts_one_search_per_group_without_a_winner_and_reused_layers_after():
    from sparseditto.batch.progress import Eta

    def layer(name, group, status, seconds):
        return LayerResult(name=name, shape=(4, 4), dtype="float16", status=status, group=group, seconds=seconds)

    eta = Eta()
    assert eta.seconds_left() is None                     # no group planned yet (workers: the analysis runs)
    eta.plan({"a": ["a0", "a1", "a2", "a3"], "b": ["b0", "b1", "b2"]}, {})
    assert eta.seconds_left() is None                     # nothing seen yet
    eta.finished(layer("a0", "a", "searched", 60.0))
    assert eta.seconds_left() is None                     # no reused layer seen yet
    eta.finished(layer("a1", "a", "reused", 4.0))
    # a: 2 reused left at 4 s; b: one search (60 s) and 2 reused at the only median there is (4 s)
    assert eta.seconds_left() == pytest.approx(2 * 4 + 60 + 2 * 4)
    eta.finished(layer("b0", "b", "searched", 80.0))
    eta.finished(layer("b1", "b", "reused", 10.0))
    assert eta.seconds_left() == pytest.approx(2 * 4 + 10)   # each group its own median
    # a resumed batch: the finished layers are known, a group with a winner needs no search
    again = Eta()
    again.plan({"a": ["a0", "a1", "a2"]}, {"a0": layer("a0", "a", "searched", 60.0)})
    again.finished(layer("a1", "a", "reused", 5.0))
    assert again.seconds_left() == pytest.approx(5.0)


def test_group_times_expect_the_groups_median_once_three_layers_measured_it():
    times = reuse.GroupTimes()
    times.add(0.0134)                                  # the lead's own (lowest-of-two) measurement
    assert times.winner_ms(0.0134) == pytest.approx(0.0134)
    times.add(0.0272, scale=2.0)                       # a layer the cost model puts at twice the lead's time
    assert times.winner_ms(0.0134) == pytest.approx(0.0134)   # two samples: still the lead's own
    times.add(0.0137)
    times.add(0.0138)
    assert times.winner_ms(0.0134) == pytest.approx(0.01365)  # median of 13.4, 13.6, 13.7, 13.8 us
    times.add(None)                                    # a layer without a time adds nothing
    assert len(times.normalized_ms) == 4


def test_group_times_note_a_search_only_when_it_chose_the_winners_kernel():
    lead = LayerResult(name="lead", shape=(64, 64), dtype="float16", status="searched", template="delta_spmv",
                       params={"LANES": "auto"}, source_hash="abc", kernel_ms=0.0134)
    other = lead.model_copy(update=dict(name="l7", params={"LANES": 16}, source_hash="def"))
    same = lead.model_copy(update=dict(name="l9"))
    times = reuse.GroupTimes()
    times.confirm(lead, other)
    assert times.search_confirmed is None              # the search found another kernel: misses still search
    times.confirm(lead, same)
    times.confirm(lead, lead.model_copy(update=dict(name="l12")))
    assert times.search_confirmed == "l9"              # the first confirming search is the one named


@pytest.mark.parametrize("observed, confirmed, kept", [
    (0.0140, None, True),       # within 5% of the group's median (13.55 us)
    (0.0145, None, False),      # 7% over, no search has confirmed the kernel: the caller searches
    (0.0145, "l3", True),       # 7% over, a search sent by such a miss chose this kernel: kept
    (0.0152, "l3", False),      # 12% over: beyond twice the tolerance, searched whatever came before
])
def test_a_reused_layer_is_judged_against_the_groups_median(monkeypatch, observed, confirmed, kept):
    from sparseditto import harness

    monkeypatch.setattr(harness, "bench", lambda *a, **k: _Bench(observed))
    monkeypatch.setattr(harness, "run_and_verify", lambda *a, **k: types.SimpleNamespace(
        ok=True, status="verified", seed=1, backend="cuda", seconds=0.1, message="", checks=[]))
    monkeypatch.setattr(reuse, "estimates", lambda *a, **k: {"kernel": 1.0, "dense": 2.0, "best": 1.0,
                                                              "format_bytes": 10})
    A = types.SimpleNamespace(shape=(64, 64), name="layer")
    winner = LayerResult(name="lead", shape=(64, 64), dtype="float16", status="searched", template="delta_spmv",
                         source="def spmm(): pass", kernel_ms=0.0130, vendor_ms={})
    times = reuse.GroupTimes(normalized_ms=[0.0130, 0.0135, 0.0136, 0.0138], search_confirmed=confirmed)
    base = LayerResult(name="l20", shape=(64, 64), dtype="float16", status="failed")
    got = reuse.try_reuse(winner, {}, base, A, {}, _settings(), {}, times)
    assert isinstance(got, LayerResult) == kept
    if kept:
        assert got.expected_ms == pytest.approx(0.01355) and got.kernel_ms == pytest.approx(observed)
        assert "the group's median (4 layers)" in got.reason
        assert ("kept: within 10%" in got.reason) == (observed > 0.01355 * 1.05)
        assert len(times.normalized_ms) == 5           # its time joins the group's
    else:
        assert "not within 5% of its expected time" in got and len(times.normalized_ms) == 4


def test_a_resumed_group_takes_in_what_its_finished_layers_measured(monkeypatch):
    """A resume (a new process) judges its layers against the group's median and the search that
    confirmed the kernel, as the batch it continues would have, not against the lead alone."""
    # the cost model puts layer "big" at twice the lead's time, every other layer at the lead's
    monkeypatch.setattr(reuse, "estimates", lambda report, *a, **k: {"kernel": report["est"]})
    lead = LayerResult(name="lead", shape=(64, 64), dtype="float16", status="searched", template="delta_spmv",
                       params={"LANES": "auto"}, source_hash="abc", kernel_ms=0.0130)
    done = [lead,
            lead.model_copy(update=dict(name="r1", status="reused", kernel_ms=0.0136)),
            lead.model_copy(update=dict(name="big", status="reused", kernel_ms=0.0274)),
            lead.model_copy(update=dict(name="s1", status="searched", kernel_ms=0.0135,
                                        reason="full search (delta_spmv from lead is not within 5% ...); ...")),
            lead.model_copy(update=dict(name="other", status="reused", params={"LANES": 16}, source_hash="x",
                                        kernel_ms=0.0200)),            # another kernel: not this group's times
            lead.model_copy(update=dict(name="nore", status="reused", kernel_ms=0.0150))]   # no analysis kept
    reports = {"lead": {"est": 1.0}, "r1": {"est": 1.0}, "big": {"est": 2.0}, "s1": {"est": 1.0},
               "other": {"est": 1.0}, "nore": None}
    times = reuse.GroupTimes()
    times.add(lead.kernel_ms)
    times.resumed(lead, reports["lead"], done, reports, _settings())
    assert times.normalized_ms == pytest.approx([0.0130, 0.0136, 0.0137])
    assert times.winner_ms(0.0130) == pytest.approx(0.0136) and times.search_confirmed == "s1"
    # without the lead's analysis only the confirming search is taken in
    times = reuse.GroupTimes()
    times.resumed(lead, None, done, reports, _settings())
    assert times.normalized_ms == [] and times.search_confirmed == "s1"


def test_a_resumed_batch_hands_the_finished_layers_analyses_to_their_groups(monkeypatch, tmp_path):
    """The finished layers of a resumed batch keep their journaled analyses in their group's members
    (the group's winner is not loaded and analyzed again: 10 s on the H200 for a 4096 x 4096 lead)."""
    from sparseditto.batch.journal import Journal

    refs = [types.SimpleNamespace(name=f"w{i}") for i in range(3)]
    monkeypatch.setattr(runner, "_analyze_one", lambda ref, s: (None, {"shape": [4, 4], "signature": ref.name}))
    monkeypatch.setattr(runner, "group_key", lambda report, dtype: "g")
    bar = types.SimpleNamespace(working=lambda *a: None)
    journal = Journal(tmp_path)
    runner._analyze(refs, {}, journal, bar, 0.3, "float16")
    done = {"w0": LayerResult(name="w0", shape=(4, 4), dtype="float16", status="searched", group="g")}
    groups = runner._analyze(refs, done, journal, bar, 0.3, "float16")
    assert [(r.name, rep and rep["signature"]) for r, rep in groups["g"]] == [("w0", "w0"), ("w1", "w1"), ("w2", "w2")]
    journal.close()
