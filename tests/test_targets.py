"""GPU target table, lookup, local detection (with torch.cuda faked on CPU) and roofline math."""
from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest
import torch

from sparseditto import targets as T
from sparseditto.targets import (PEAK_DTYPES, RooflineEstimate, Target, dense_gemm_roofline, detect_local_target,
                                 get_target, list_targets, match_device_name, resolve_target, roofline)

REQUIRED = ("A100-40GB", "A100-80GB", "H100-SXM", "H100-PCIe", "H200", "L40S", "RTX4090", "RTX3090")


def fake_cuda(monkeypatch, name: str | None, props=None):
    """Make torch.cuda report one GPU called `name` (None: no GPU)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: name is not None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: name)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=None: props)


# ---- the table --------------------------------------------------------------------------------
def test_table_has_required_targets_with_complete_positive_peaks():
    table = {t.name: t for t in list_targets()}
    assert set(REQUIRED) <= set(table)
    for t in table.values():
        for peaks in (t.tensor_tflops, t.sparse_tensor_tflops, t.cuda_core_tflops):
            assert set(PEAK_DTYPES) <= set(peaks), t.name
            assert all(v > 0 for v in peaks.values()), t.name
        assert t.source.startswith("https://"), t.name
        assert t.arch == f"sm_{t.compute_capability[0]}{t.compute_capability[1]}"
        assert t.max_smem_per_block_kb < t.smem_per_sm_kb
        # 2:4 sparse tensor cores double the dense rate on every architecture in the table (the L40S
        # datasheet prints 733 for 2 x 362.05, hence the 3% tolerance)
        assert all(t.sparse_tensor_tflops[d] == pytest.approx(2 * t.tensor_tflops[d], rel=0.03) for d in PEAK_DTYPES)
        assert t.tensor_tflops["float16"] > t.cuda_core_tflops["float16"]


def test_datasheet_numbers_spot_checks():
    a100, h100, h200 = get_target("A100-80GB"), get_target("H100-SXM"), get_target("H200")
    assert (a100.sm_count, a100.mem_bandwidth_gbs, a100.tensor_tflops["float16"]) == (108, 2039.0, 312.0)
    assert get_target("A100-40GB").mem_bandwidth_gbs == 1555.0
    assert (h100.sm_count, h100.mem_bandwidth_gbs, h100.tensor_tflops["bfloat16"]) == (132, 3350.0, 989.5)
    assert (h200.memory_gb, h200.mem_bandwidth_gbs, h200.measured_bandwidth_gbs) == (141.0, 4800.0, 4300.0)
    assert get_target("H100-PCIe").sm_count == 114
    assert get_target("RTX4090").tensor_tflops["float16"] == 165.2  # fp32-accumulate rate


def test_target_validation_rejects_missing_or_bad_peaks():
    fields = get_target("H100").model_dump()
    with pytest.raises(ValueError, match="lacks dtype"):
        Target(**{**fields, "tensor_tflops": {"float16": 1.0, "float32": 1.0}})
    with pytest.raises(ValueError, match="must be positive"):
        Target(**{**fields, "cuda_core_tflops": {"float16": 1.0, "bfloat16": 0.0, "float32": 1.0}})


def test_target_is_json_round_trippable():
    t = get_target("L40S")
    assert Target.model_validate_json(t.model_dump_json()) == t


def test_returned_targets_do_not_alias_the_table():
    get_target("H100").tensor_tflops["float16"] = 1.0
    assert get_target("H100").tensor_tflops["float16"] == 989.5


# ---- lookup -----------------------------------------------------------------------------------
@pytest.mark.parametrize("query,expected", [
    ("A100", "A100-80GB"), ("a100_80gb", "A100-80GB"), ("A100 40GB", "A100-40GB"), ("a100-sxm4-40gb", "A100-40GB"),
    ("H100", "H100-SXM"), ("h100 sxm", "H100-SXM"), ("H100_PCIe", "H100-PCIe"), ("h200", "H200"),
    ("L40S", "L40S"), ("RTX 4090", "RTX4090"), ("rtx_3090", "RTX3090"), ("A100-PCIe", "A100-80GB-PCIe"),
])
def test_get_target_names_and_aliases(query, expected):
    assert get_target(query).name == expected


def test_get_target_unknown_lists_known_names():
    with pytest.raises(ValueError) as info:
        get_target("H300")
    message = str(info.value)
    assert "Unknown GPU target 'H300'" in message and "Closest: H200" in message
    for name in REQUIRED:
        assert name in message
    assert "'auto'" in message


def test_get_target_accepts_a_target():
    t = get_target("H200")
    assert get_target(t) is t


def test_auto_without_gpu_raises_with_names(monkeypatch):
    fake_cuda(monkeypatch, None)
    assert detect_local_target() is None
    with pytest.raises(ValueError, match="no CUDA GPU was found") as info:
        get_target("auto")
    assert "H100-SXM" in str(info.value) and "RTX4090" in str(info.value)


def test_resolve_target_falls_back_with_note(monkeypatch):
    fake_cuda(monkeypatch, None)
    target, note = resolve_target("auto")
    assert target.name == "H100-SXM" and "no CUDA GPU" in note and "H100-SXM" in note
    target, note = resolve_target("AUTO", fallback="A100")
    assert target.name == "A100-80GB" and "A100-80GB" in note
    assert resolve_target("L40S") == (get_target("L40S"), None)


# ---- detection --------------------------------------------------------------------------------
@pytest.mark.parametrize("device_name,expected", [
    ("NVIDIA H200", "H200"), ("NVIDIA H100 80GB HBM3", "H100-SXM"), ("NVIDIA H100 PCIe", "H100-PCIe"),
    ("NVIDIA A100-SXM4-80GB", "A100-80GB"), ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
    ("NVIDIA A100-PCIE-40GB", "A100-40GB"), ("NVIDIA A100 80GB PCIe", "A100-80GB-PCIe"),
    ("NVIDIA L40S", "L40S"), ("NVIDIA GeForce RTX 4090", "RTX4090"), ("NVIDIA GeForce RTX 3090", "RTX3090"),
    # different products that merely contain a listed name: must not borrow its numbers
    ("NVIDIA GH200 480GB", None), ("NVIDIA H200 NVL", None), ("NVIDIA H100 NVL", None),
    ("NVIDIA GeForce RTX 3090 Ti", None), ("NVIDIA L40", None), ("Tesla V100-SXM2-16GB", None),
])
def test_match_device_name(device_name, expected):
    found = match_device_name(device_name)
    assert (found.name if found else None) == expected
    if found:
        assert found.device_name == device_name


def test_detect_known_gpu(monkeypatch):
    fake_cuda(monkeypatch, "NVIDIA H200")
    t = detect_local_target()
    assert t.name == "H200" and t.device_name == "NVIDIA H200" and t.note is None
    assert get_target("auto").name == "H200"
    assert resolve_target("auto") == (t, None)


def test_detect_unknown_gpu_builds_conservative_target(monkeypatch):
    props = SimpleNamespace(name="NVIDIA Future GPU", major=8, minor=9, multi_processor_count=100,
                            total_memory=32 * 10**9, L2_cache_size=64 * 2**20,
                            shared_memory_per_multiprocessor=100 * 1024, shared_memory_per_block_optin=99 * 1024)
    fake_cuda(monkeypatch, "NVIDIA Future GPU", props)
    t, note = resolve_target("auto")
    assert t.name == "NVIDIA Future GPU" and t.arch == "sm_89" and t.sm_count == 100
    # no clocks reported: 1.0 GHz assumed; sm_89 fp32-accumulate tensor rate 512 flops/clk/SM
    assert t.tensor_tflops["float16"] == pytest.approx(100 * 512 * 1e9 / 1e12)
    assert t.cuda_core_tflops["float32"] == pytest.approx(100 * 256 * 1e9 / 1e12)
    assert t.mem_bandwidth_gbs == 500.0 and t.l2_mb == 64.0 and t.max_smem_per_block_kb == 99.0
    assert t.supports_sparse_mma and t.sparse_tensor_tflops["float16"] == 2 * t.tensor_tflops["float16"]
    assert note == t.note and "not in the SparseDitto target table" in note and "assumed" in note


def test_unknown_gpu_uses_reported_clocks():
    props = SimpleNamespace(major=9, minor=0, multi_processor_count=10, total_memory=10**10,
                            clock_rate=2_000_000, memory_clock_rate=5_000_000, memory_bus_width=1024)
    t = T.target_from_properties(props, "Custom")
    assert t.tensor_tflops["float16"] == pytest.approx(10 * 4096 * 2.0e9 / 1e12)
    assert t.mem_bandwidth_gbs == pytest.approx(2 * 5e9 * 1024 / 8 / 1e9)  # double data rate
    assert "reported" in t.note


@pytest.mark.gpu
def test_auto_on_a_real_gpu():
    t = get_target("auto")
    assert t.device_name == torch.cuda.get_device_name()
    assert t.sm_count == torch.cuda.get_device_properties(0).multi_processor_count


# ---- roofline ---------------------------------------------------------------------------------
def test_roofline_memory_bound_hand_computed():
    est = roofline("H100", bytes_moved=3.35e9, flops=1e9, use_measured_bandwidth=True)
    assert isinstance(est, RooflineEstimate)
    assert est.memory_s == pytest.approx(1e-3)            # 3.35 GB / 3350 GB/s (no measured figure)
    assert est.compute_s == pytest.approx(1e9 / 989.5e12)
    assert est.seconds == est.memory_s and est.bound == "memory"


def test_roofline_compute_bound_and_units():
    est = roofline("A100", bytes_moved=2039e6, flops=312e12, dtype="bfloat16")
    assert est.compute_s == pytest.approx(1.0) and est.memory_s == pytest.approx(1e-3)
    assert est.bound == "compute" and est.seconds == pytest.approx(1.0)
    assert roofline("A100", 0, 624e12, unit="sparse_tensor").seconds == pytest.approx(1.0)
    assert roofline("A100", 0, 39e12, dtype="bfloat16", unit="cuda_core").seconds == pytest.approx(1.0)
    assert roofline("A100", 0, 156e12, dtype="float32").seconds == pytest.approx(1.0)  # TF32


def test_roofline_measured_bandwidth_and_launch_overhead():
    assert roofline("H200", 4.3e12, 0).seconds == pytest.approx(1.0)
    assert roofline("H200", 4.8e12, 0, use_measured_bandwidth=False).seconds == pytest.approx(1.0)
    est = roofline("H200", 4.3e9, 0, launch_s=3e-6)
    assert est.seconds == pytest.approx(1e-3 + 3e-6) and est.launch_s == 3e-6
    assert est.percent_of_roofline(2 * est.seconds) == pytest.approx(50.0)


def test_dense_gemm_roofline_hand_computed():
    small = dense_gemm_roofline("H100", 4096, 4096, 16, "float16")
    assert small.bytes == (4096 * 4096 + 4096 * 16 + 4096 * 16) * 2 == 33816576
    assert small.flops == 2 * 4096 * 4096 * 16
    assert small.memory_s == pytest.approx(33816576 / 3350e9) and small.bound == "memory"
    big = dense_gemm_roofline("H100", 4096, 4096, 4096, "float16")
    assert big.compute_s == pytest.approx(2 * 4096**3 / 989.5e12) and big.bound == "compute"
    tf32 = dense_gemm_roofline("A100-40GB", 1024, 512, 256, "float32")
    assert tf32.bytes == (1024 * 512 + 512 * 256 + 1024 * 256) * 4
    assert tf32.peak_tflops == 156.0 and tf32.bandwidth_gbs == 1555.0


@pytest.mark.parametrize("call,words", [
    (lambda: roofline("H100", 1, 1, unit="tensorcore"), ["Unknown compute unit", "cuda_core"]),
    (lambda: roofline("H100", 1, 1, dtype="float64"), ["float64", "bfloat16"]),
    (lambda: roofline("H100", -1, 1), ["bytes_moved >= 0", "-1"]),
    (lambda: dense_gemm_roofline("H100", 0, 4, 4), ["positive integer m", "0"]),
    (lambda: dense_gemm_roofline("H100", 4, 4, 4, "int8"), ["int8"]),
    (lambda: roofline("B9000", 1, 1), ["Unknown GPU target"]),
])
def test_roofline_errors(call, words):
    with pytest.raises(ValueError) as info:
        call()
    for word in words:
        assert word in str(info.value)


def test_cli_targets_command_reads_these_fields(capsys):
    from sparseditto.cli import cmd_targets

    assert cmd_targets(argparse.Namespace()) == 0
    out = capsys.readouterr().out
    for name in ("H200", "A100-80GB", "RTX3090"):
        assert name in out
