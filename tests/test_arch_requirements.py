"""Templates that cannot run on a GPU are never planned for it: the tensor-core decode tier
(tc_stream.cu: thread-block clusters, bulk copies, mbarrier transaction counts) needs compute
capability 9.0 and does not compile for an A100 or an Ada GPU, so a run for `target="A100"` (or on
one) leaves it out and says so. The declared requirement is checked against nvcc itself where nvcc
is installed: the tc source fails for sm_89 and every other CUDA template compiles for sm_80, the
oldest GPU in the target table."""
from __future__ import annotations

import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from sparseditto.agents.costing import arch_exclusion_line, arch_exclusions, template_table
from sparseditto.kernel_templates.registry import get_template, list_templates
from sparseditto.targets import get_target

TC_TIER = {"tc_bitmap", "tc_dense", "tc_lanemask", "tc_scatter", "tc_sp24", "tc_words"}


def cuda_templates():
    return [t for t in list_templates() if t.backend == "cuda"]


def test_the_tensor_core_tier_declares_hopper_and_the_rest_declares_nothing():
    for t in cuda_templates():
        uses_tc_stream = t.meta.get("cuda_source") == "tc_stream.cu"
        assert (t.name in TC_TIER) == uses_tc_stream, t.name
        assert t.meta.get("min_compute_capability") == ([9, 0] if uses_tc_stream else None), t.name
    for t in list_templates():
        if t.backend != "cuda":
            assert "min_compute_capability" not in t.meta, t.name


def test_arch_reason_names_the_requirement_and_the_gpu():
    words = get_template("tc_words")
    assert words.arch_reason(get_target("H200")) is None and words.arch_reason(get_target("H100")) is None
    assert words.arch_reason(get_target("A100")) == "compute capability 9.0 required, A100-80GB has 8.0"
    assert words.arch_reason(get_target("L40S")) == "compute capability 9.0 required, L40S has 8.9"
    assert get_template("delta_spmv").arch_reason(get_target("RTX3090")) is None


def test_exclusions_cover_the_planned_gpu_and_the_measuring_one():
    assert arch_exclusions(get_target("H200")) == {}
    on_a100 = arch_exclusions(get_target("A100"))
    assert set(on_a100) == TC_TIER
    # planned for an H200 but measured on an Ada card: what runs must compile where it is timed
    assert set(arch_exclusions(get_target("H200"), get_target("L40S"))) == TC_TIER
    assert arch_exclusion_line(on_a100) == ("tc_bitmap, tc_dense, tc_lanemask, tc_scatter, tc_sp24, tc_words "
                                            "(compute capability 9.0 required, A100-80GB has 8.0)")


def test_the_planning_table_for_an_a100_has_no_hopper_kernel(analyzed_unstructured):
    """The same 70%-sparse weight at N = 16: the H200 table offers the tensor-core tier (tc_words among
    the CUDA templates), the A100 table the same templates less that tier (the CUDA-core ones stay)."""
    report = analyzed_unstructured
    h200, _ = template_table(report, 16, "float16", get_target("H200"), exec_backend="cuda")
    a100, _ = template_table(report, 16, "float16", get_target("A100"), exec_backend="cuda")
    on_h200, on_a100 = {t["name"] for t in h200}, {t["name"] for t in a100}
    assert "tc_words" in on_h200 and not on_a100 & TC_TIER
    assert on_a100 == on_h200 - TC_TIER
    assert {t["name"] for t in a100 if t["backend"] == "cuda"}, "the CUDA-core templates stay"


@pytest.fixture(scope="module")
def analyzed_unstructured():
    import numpy as np
    import scipy.sparse as sp

    from sparseditto.analysis import analyze
    from sparseditto.io import load_matrix

    rng = np.random.default_rng(0)
    dense = rng.standard_normal((512, 1024)).astype(np.float32)
    dense[np.abs(dense) < np.quantile(np.abs(dense), 0.7, axis=1, keepdims=True)] = 0.0
    return analyze(load_matrix(sp.csr_array(dense), name="w70")).model_dump(mode="json")


def _nvcc(source: str, arch: str, tmp_path, name: str) -> subprocess.CompletedProcess:
    src = tmp_path / f"{name}_{arch}.cu"
    src.write_text(source)
    return subprocess.run(["nvcc", f"-arch={arch}", "-std=c++17", "-DSPARSEDITTO_INSTANTIATE_ALL", "-cubin", str(src),
                           "-o", str(tmp_path / f"{name}_{arch}.cubin")], capture_output=True, text=True, timeout=600)


@pytest.mark.slow(seconds=60)
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_nvcc_agrees_with_the_declared_requirements(tmp_path):
    from sparseditto.harness.source_loader import cuda_sources

    sources = {t.name: cuda_sources(t.instantiate({}).source)["CUDA_SRC"] for t in cuda_templates()}
    tc = sorted(TC_TIER)[0]        # the six share tc_stream.cu: one compile says it for all
    refused = _nvcc(sources[tc], "sm_89", tmp_path, tc)
    assert refused.returncode != 0 and "__cluster_dims__" in refused.stderr, refused.stderr[-2000:]
    rest = [name for name in sources if name not in TC_TIER]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(zip(rest, pool.map(lambda n: _nvcc(sources[n], "sm_80", tmp_path, n), rest)))
    failed = {n: r.stderr[-1500:] for n, r in results.items() if r.returncode != 0}
    assert not failed, failed


def test_a_bundle_kernel_on_a_gpu_it_cannot_run_on_takes_the_dense_forward():
    """patch_model on an older GPU than the batch's: the layer's route names the reason (its one-time
    warning) instead of failing to compile inside the forward."""
    from sparseditto.batch.patch import arch_fallback

    assert arch_fallback("tc_sp24", "NVIDIA A100-SXM4-80GB", (8, 0)) == (
        "compute capability 9.0 required, NVIDIA A100-SXM4-80GB has 8.0")
    assert arch_fallback("tc_sp24", "NVIDIA H200", (9, 0)) is None
    assert arch_fallback("delta_spmv", "NVIDIA A100-SXM4-80GB", (8, 0)) is None
    assert arch_fallback("my_llm_kernel", "NVIDIA A100-SXM4-80GB", (8, 0)) is None   # declares nothing
    assert arch_fallback(None, "NVIDIA A100-SXM4-80GB", (8, 0)) is None


def test_planning_for_an_older_gpu_than_the_local_one_says_what_it_left_out():
    from sparseditto.agents.costing import arch_note

    note = arch_note(get_target("A100"), get_target("H200"))
    assert note == ("planned for A100-80GB (compute capability 8.0), so tc_bitmap, tc_dense, tc_lanemask, "
                    "tc_scatter, tc_sp24, tc_words were left out, though this H200 runs them: target='auto' "
                    "plans for this GPU")
    assert arch_note(get_target("H200"), get_target("H200")) is None
    assert arch_note(get_target("H100"), get_target("H200")) is None     # nothing left out for the H100
    assert arch_note(get_target("A100"), get_target("L40S")) is None     # the local GPU cannot run them either
    assert arch_note(get_target("A100"), None) is None                   # no GPU here


def test_the_planner_drops_memory_hits_the_target_cannot_run(analyzed_unstructured):
    """The memory is keyed by the GPU that measured: a tc_words exact hit from an H200 run must not be
    offered to a run on that H200 that plans for an A100; a CUDA-core neighbour still is."""
    from sparseditto.agents.planner import planning_input
    from sparseditto.agents.state import Context

    hits = [{"kind": "exact", "template": "tc_words", "params": {}, "run_id": "h200run"},
            {"kind": "neighbour", "template": "delta_spmv", "params": {}, "run_id": "other"}]
    state = {"report": analyzed_unstructured, "memory_hits": hits, "candidates": []}
    for target, expected in (("A100", ["delta_spmv"]), ("H200", ["tc_words", "delta_spmv"])):
        inp = planning_input(state, Context(target=target, backend="cuda", n_values=[16]))
        assert [h["template"] for h in inp.memory_hits] == expected, target


def test_the_run_story_names_why_the_tensor_core_tier_was_left_out(analyzed_unstructured):
    """`sparseditto run`'s story on a GPU run: tc_* left out for an A100 with the compute-capability
    reason, and for float32 with the dtype reason (before, a CUDA template the table dropped on a GPU
    run was listed with the reason "None")."""
    from types import SimpleNamespace

    from sparseditto.cli.story import _plan_table

    def left_out(target, dtype):
        result = SimpleNamespace(target={"spec": get_target(target).model_dump(mode="json")}, n_values=[16],
                                 report=analyzed_unstructured, dtype=dtype, backend="cuda")
        return _plan_table(result)[1]

    a100 = left_out("A100", "float16")
    assert ("tc_bitmap, tc_dense, tc_lanemask, tc_scatter, tc_sp24, tc_words "
            "(compute capability 9.0 required, A100-80GB has 8.0)") in a100
    h200_fp32 = left_out("H200", "float32")
    assert any(line.endswith("(float32 values: they take float16, bfloat16)") and "tc_words" in line
               for line in h200_fp32), h200_fp32
    assert not any(line.endswith("(None)") for line in a100 + h200_fp32)


def test_a_batch_report_carries_what_its_target_left_out():
    """run_batch plans for an A100 unless told, like run_graph: on an H200 its summary and report.html say
    which templates that left out (run_graph's note, kept as BatchReport.target_note)."""
    from sparseditto.agents.costing import arch_note
    from sparseditto.batch.models import BatchReport
    from sparseditto.batch.report import render_html

    note = arch_note(get_target("A100"), get_target("H200"))
    report = BatchReport(model="m", out="o", settings={"target": "A100-80GB"}, layers=[], complete=True,
                         wall_seconds=1.0, timings_are_gpu=True, target_note=note)
    assert f"note: {note}" in report.summary().splitlines()
    assert "tc_words were left out" in render_html(report)
    plain = BatchReport(model="m", out="o", settings={}, layers=[], complete=True, wall_seconds=1.0,
                        timings_are_gpu=True)
    assert "note:" not in plain.summary() and "Target:" not in render_html(plain)


def test_an_exact_hit_settles_only_a_search_at_least_as_narrow(tmp_path):
    """The memory is keyed by the GPU that measured: a run planned for an A100 on an H200 never tried the
    Hopper-only tier, so its answer is no exact hit for a run planned for the H200 on that GPU (it still
    comes back as the nearest neighbour); an H200 run's tc_words is none for an A100 run; the same target,
    or a target that left out no more, settles as before. On the interpreter nothing changes."""
    from sparseditto.agents.costing import exact_hit_usable
    from sparseditto.agents.state import Context
    from sparseditto.memory import Memory

    mem = Memory(tmp_path / "memory.sqlite")
    run = mem.start_run(signature="sig", n_values=[16], dtype="float16", gpu="NVIDIA H200", target="A100-80GB",
                        versions={"sparseditto": "test"})
    mem.record_candidate(run, template="delta_spmv", status="verified", source="# k\n", timings={"median_ms": 0.02})
    mem.finish_run(run, "ok", best_template="delta_spmv", best_speedup_vs_dense=1.2)
    hit = mem.exact_hit("sig", "<=16", "float16", "NVIDIA H200")
    assert hit["target"] == "A100-80GB" and hit["template"] == "delta_spmv"

    def usable(hit, target, backend="cuda"):
        return exact_hit_usable(hit, Context(target=target, backend=backend, n_values=[16]))

    assert usable(hit, "A100") and not usable(hit, "H200") and usable(hit, "H200", backend="interpret")
    tc = {"template": "tc_words", "target": "H200"}
    assert usable(tc, "H200") and usable(tc, "H100") and not usable(tc, "A100")
    assert usable({"template": "delta_spmv", "target": "H200"}, "A100")          # the H200 search was wider
    assert not usable({"template": "delta_spmv", "target": "NVIDIA GB10"}, "H200")  # unknown: only itself
    assert usable({"template": "delta_spmv", "target": None}, "H200")             # older rows: as before
