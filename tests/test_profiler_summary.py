"""The profiler's one-line bottleneck summary, which the planner reads and the user sees."""
from __future__ import annotations

from sparseditto.agents.profiler import bottleneck_summary


def test_a_kernel_under_its_decode_floor_is_not_called_compute_bound():
    """A measured decode floor (tc_sp24 at wide N) sits above the byte roofline: a kernel that beats
    the floor was reported "compute-bound at 107% of the roofline peak" (H200, session 28, 11008x4096
    2:4 at N = 64). It must say which bound it is measured against and where it stands on the bytes."""
    est = {"estimate_ms": 0.0245, "measured_ms": 0.0245, "bound": "decode", "bytes": 52.66e6, "flops": 2.9e12,
           "a_bytes": 50.7e6, "a_bytes_measured": False, "roofline_only_ms": 0.0147}
    line = bottleneck_summary(0.0230, True, est, 100.0 * 0.0245 / 0.0230, None, "NVIDIA H200", 22544384)
    assert "compute-bound" not in line and "peak" not in line
    assert line.startswith("decode-bound: 107% of the model's measured decode floor (24.5 us)")
    assert "64% of the byte roofline (52.66 MB at 2290 GB/s)" in line
    memory = dict(est, bound="memory", measured_ms=0.0147)
    assert bottleneck_summary(0.0230, True, memory, 64.0, None, "NVIDIA H200").startswith("memory-bound at 64%")
