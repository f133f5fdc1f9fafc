"""GPU targets: the datasheet numbers the planner reasons with, and roofline lower bounds.

The planner has to rank strategies before anything runs, often on a machine other than the one
the kernel is meant for (a laptop planning for an H100). So each target is a row of public
datasheet/whitepaper numbers: SM count, memory bandwidth, cache and shared-memory sizes, and peak
throughput of the three execution units a sparse kernel can land on (dense tensor cores, 2:4
sparse tensor cores, plain CUDA-core FMA). `roofline()` turns bytes and flops into the lower-bound
time max(bytes / bandwidth, flops / peak), which is what "near roofline, stop tuning" and "this
format moves fewer bytes than dense" are measured against.

Conventions: TFLOP/s are dense (no "with sparsity" doubling) except in `sparse_tensor_tflops`;
the `float32` key of the tensor tables means TF32. GeForce cards list the FP32-accumulate tensor
rate, because SparseDitto kernels always accumulate in fp32 (their FP16-accumulate rate is 2x).
"""
from __future__ import annotations

import difflib
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator

PEAK_DTYPES = ("float16", "bfloat16", "float32")
UNITS = ("tensor", "sparse_tensor", "cuda_core")
VALUE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


class Target(BaseModel):
    """One GPU model, as the planner sees it (all numbers per GPU; GB and TB are decimal)."""

    model_config = ConfigDict(frozen=True)

    name: str
    aliases: tuple[str, ...] = ()
    arch: str                                   # e.g. "sm_90"
    compute_capability: tuple[int, int]
    sm_count: int
    memory_gb: float
    mem_bandwidth_gbs: float                    # datasheet DRAM bandwidth, GB/s
    measured_bandwidth_gbs: float | None = None  # sustained copy bandwidth measured on a real card
    l2_mb: float
    smem_per_sm_kb: float                       # max shared memory per SM (carve-out maximum)
    max_smem_per_block_kb: float                # max dynamic shared memory one block may opt into
    tensor_tflops: dict[str, float]             # dense tensor-core peak; float32 = TF32
    sparse_tensor_tflops: dict[str, float]      # 2:4 structured-sparse tensor-core peak
    cuda_core_tflops: dict[str, float]          # non-tensor FMA peak
    supports_sparse_mma: bool
    source: str                                 # URL of the public datasheet / whitepaper
    note: str | None = None                     # set for detected GPUs not in the table
    device_name: str | None = None              # torch.cuda.get_device_name when detected locally

    @model_validator(mode="after")
    def _check_peaks(self) -> "Target":
        for table in ("tensor_tflops", "sparse_tensor_tflops", "cuda_core_tflops"):
            peaks = getattr(self, table)
            missing = [d for d in PEAK_DTYPES if d not in peaks]
            if missing:
                raise ValueError(f"Target {self.name}: {table} lacks dtype(s) {missing}.")
            bad = {d: v for d, v in peaks.items() if not v > 0}
            if bad:
                raise ValueError(f"Target {self.name}: {table} must be positive, got {bad}.")
        for fld in ("sm_count", "memory_gb", "mem_bandwidth_gbs", "l2_mb", "smem_per_sm_kb", "max_smem_per_block_kb"):
            if not getattr(self, fld) > 0:
                raise ValueError(f"Target {self.name}: {fld} must be positive, got {getattr(self, fld)}.")
        return self

    def bandwidth_gbs(self, use_measured: bool = True) -> float:
        """DRAM bandwidth for estimates: the measured figure when known (the datasheet number is
        not reachable in practice, so it would make every kernel look further from roofline)."""
        if use_measured and self.measured_bandwidth_gbs:
            return self.measured_bandwidth_gbs
        return self.mem_bandwidth_gbs

    def peak_tflops(self, unit: str = "tensor", dtype: str = "float16") -> float:
        if unit not in UNITS:
            raise ValueError(f"Unknown compute unit {unit!r}; expected one of {', '.join(UNITS)}.")
        if dtype not in PEAK_DTYPES:
            raise ValueError(f"No peak for dtype {dtype!r}; expected one of {', '.join(PEAK_DTYPES)}.")
        return {"tensor": self.tensor_tflops, "sparse_tensor": self.sparse_tensor_tflops,
                "cuda_core": self.cuda_core_tflops}[unit][dtype]


def _peaks(fp16: float, bf16: float, fp32: float) -> dict[str, float]:
    return {"float16": fp16, "bfloat16": bf16, "float32": fp32}


# Shared-memory limits per compute capability: CUDA C++ Programming Guide, "Technical
# Specifications per Compute Capability" (https://docs.nvidia.com/cuda/cuda-c-programming-guide/):
# 8.0: 164 KB/SM, 163 KB/block; 8.6 and 8.9: 100 KB/SM, 99 KB/block; 9.0: 228 KB/SM, 227 KB/block.
_A100_DATASHEET = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
_H100_DATASHEET = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
_H200_PAGE = "https://www.nvidia.com/en-us/data-center/h200/"
_L40S_DATASHEET = "https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413"
_ADA_WHITEPAPER = "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"
_GA102_WHITEPAPER = "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf"

# A100 datasheet: tensor FP16/BF16 312 (624 sparse), TF32 156 (312 sparse); FP32 19.5. The Ampere
# GA100 whitepaper adds 108 SMs, 40 MB L2 and non-tensor FP16 78 / BF16 39 TFLOP/s:
# https://images.nvidia.com/aem-dam/en-zz/Solutions/data-center/nvidia-ampere-architecture-whitepaper.pdf
_A100_COMMON = dict(arch="sm_80", compute_capability=(8, 0), sm_count=108, l2_mb=40.0, smem_per_sm_kb=164.0,
                    max_smem_per_block_kb=163.0, tensor_tflops=_peaks(312.0, 312.0, 156.0),
                    sparse_tensor_tflops=_peaks(624.0, 624.0, 312.0), cuda_core_tflops=_peaks(78.0, 39.0, 19.5),
                    supports_sparse_mma=True, source=_A100_DATASHEET)
# Hopper GH100 (H100/H200 datasheets; 132/114 SMs, 50 MB L2 and non-tensor FP16/BF16 rates from the
# Hopper whitepaper, https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper).
_HOPPER_SMEM = dict(arch="sm_90", compute_capability=(9, 0), smem_per_sm_kb=228.0, max_smem_per_block_kb=227.0,
                    supports_sparse_mma=True)

_TABLE: tuple[Target, ...] = (
    # A100 SXM4 40GB: 40 GB HBM2, 1,555 GB/s (datasheet). The 40GB PCIe card lists the same peaks
    # and bandwidth (at 250 W it sustains them less long), so it shares this row.
    Target(name="A100-40GB", aliases=("A100-SXM4-40GB", "A100-40GB-SXM", "A100-PCIe-40GB"),
           memory_gb=40.0, mem_bandwidth_gbs=1555.0, **_A100_COMMON),
    # A100 SXM4 80GB: 80 GB HBM2e, 2,039 GB/s (datasheet). "A100" means this one.
    Target(name="A100-80GB", aliases=("A100", "A100-SXM4-80GB", "A100-SXM", "A100-80GB-SXM"),
           memory_gb=80.0, mem_bandwidth_gbs=2039.0, **_A100_COMMON),
    # A100 80GB PCIe: 80 GB HBM2e, 1,935 GB/s (datasheet); same peaks.
    Target(name="A100-80GB-PCIe", aliases=("A100-PCIe", "A100-PCIe-80GB"),
           memory_gb=80.0, mem_bandwidth_gbs=1935.0, **_A100_COMMON),
    # H100 SXM5: 80 GB HBM3, 3.35 TB/s; FP16/BF16 tensor 1,979 and TF32 989 TFLOP/s *with sparsity*
    # (datasheet), so dense = 989.5 / 494.5; FP32 67. Whitepaper: 132 SMs, non-tensor FP16/BF16 133.8.
    Target(name="H100-SXM", aliases=("H100", "H100-SXM5", "H100-80GB-HBM3"), sm_count=132,
           memory_gb=80.0, mem_bandwidth_gbs=3350.0, l2_mb=50.0,
           tensor_tflops=_peaks(989.5, 989.5, 494.5), sparse_tensor_tflops=_peaks(1979.0, 1979.0, 989.0),
           cuda_core_tflops=_peaks(133.8, 133.8, 67.0), source=_H100_DATASHEET, **_HOPPER_SMEM),
    # H100 PCIe: 80 GB HBM2e, 2 TB/s; FP16/BF16 tensor 1,513 and TF32 756 with sparsity (datasheet),
    # dense 756.5 / 378; FP32 51. Whitepaper: 114 SMs, 50 MB L2, non-tensor FP16/BF16 102.4.
    Target(name="H100-PCIe", aliases=("H100-PCIE-80GB",), sm_count=114, memory_gb=80.0,
           mem_bandwidth_gbs=2000.0, l2_mb=50.0,
           tensor_tflops=_peaks(756.5, 756.5, 378.0), sparse_tensor_tflops=_peaks(1513.0, 1513.0, 756.0),
           cuda_core_tflops=_peaks(102.4, 102.4, 51.0), source=_H100_DATASHEET, **_HOPPER_SMEM),
    # H200 SXM: 141 GB HBM3e, 4.8 TB/s; same GH100 compute as H100 SXM (datasheet: FP16/BF16 1,979,
    # TF32 989 with sparsity; FP32 67). L2: the GH100 die has 60 MB, tied to its twelve memory
    # controllers; H100 SXM's five HBM stacks leave 50 MB usable, the H200's six enable all 60 (our
    # H200 reports 60 MiB). Measured: about 4,300 GB/s sustained copy bandwidth on the project's H200.
    Target(name="H200", aliases=("H200-SXM", "H200-SXM5", "H200-141GB"), sm_count=132, memory_gb=141.0,
           mem_bandwidth_gbs=4800.0, measured_bandwidth_gbs=4300.0, l2_mb=60.0,
           tensor_tflops=_peaks(989.5, 989.5, 494.5), sparse_tensor_tflops=_peaks(1979.0, 1979.0, 989.0),
           cuda_core_tflops=_peaks(133.8, 133.8, 67.0), source=_H200_PAGE, **_HOPPER_SMEM),
    # L40S (AD102): 48 GB GDDR6, 864 GB/s; FP16/BF16 tensor 362.05 (733 sparse), TF32 183 (366),
    # FP32 91.6 (datasheet; its 733 is not exactly 2 x 362.05, kept as printed). Ada runs non-tensor FP16/BF16 at the FP32 rate (Ada whitepaper).
    # 142 SMs, 96 MB L2.
    Target(name="L40S", aliases=(), arch="sm_89", compute_capability=(8, 9), sm_count=142, memory_gb=48.0,
           mem_bandwidth_gbs=864.0, l2_mb=96.0, smem_per_sm_kb=100.0, max_smem_per_block_kb=99.0,
           tensor_tflops=_peaks(362.05, 362.05, 183.0), sparse_tensor_tflops=_peaks(733.0, 733.0, 366.0),
           cuda_core_tflops=_peaks(91.6, 91.6, 91.6), supports_sparse_mma=True, source=_L40S_DATASHEET),
    # GeForce RTX 4090 (Ada whitepaper): 128 SMs, 72 MB L2, 24 GB GDDR6X at 1,008 GB/s;
    # FP16/BF16 tensor with FP32 accumulate 165.2 (330.4 sparse), TF32 82.6 (165.2); FP32 82.6.
    Target(name="RTX4090", aliases=("GeForce-RTX-4090", "4090"), arch="sm_89", compute_capability=(8, 9),
           sm_count=128, memory_gb=24.0, mem_bandwidth_gbs=1008.0, l2_mb=72.0, smem_per_sm_kb=100.0,
           max_smem_per_block_kb=99.0, tensor_tflops=_peaks(165.2, 165.2, 82.6),
           sparse_tensor_tflops=_peaks(330.4, 330.4, 165.2), cuda_core_tflops=_peaks(82.6, 82.6, 82.6),
           supports_sparse_mma=True, source=_ADA_WHITEPAPER),
    # GeForce RTX 3090 (GA102 whitepaper): 82 SMs, 6 MB L2, 24 GB GDDR6X at 936 GB/s;
    # FP16/BF16 tensor with FP32 accumulate 71 (142 sparse), TF32 35.6 (71); FP32 and non-tensor
    # FP16/BF16 35.6.
    Target(name="RTX3090", aliases=("GeForce-RTX-3090", "3090"), arch="sm_86", compute_capability=(8, 6),
           sm_count=82, memory_gb=24.0, mem_bandwidth_gbs=936.0, l2_mb=6.0, smem_per_sm_kb=100.0,
           max_smem_per_block_kb=99.0, tensor_tflops=_peaks(71.0, 71.0, 35.6),
           sparse_tensor_tflops=_peaks(142.0, 142.0, 71.0), cuda_core_tflops=_peaks(35.6, 35.6, 35.6),
           supports_sparse_mma=True, source=_GA102_WHITEPAPER),
)

# torch.cuda.get_device_name() strings, normalized (lowercase; 'nvidia', spaces, '-', '_' removed),
# full-matched. Anchored so that e.g. "GH200", "H200 NVL", "H100 NVL" or "RTX 3090 Ti" (different
# clocks/power/memory) are not mistaken for a row above; they get a derived target instead.
_DEVICE_PATTERNS = {
    "A100-40GB": r"a100(sxm4?|pcie)?40gb",            # NVIDIA A100-SXM4-40GB, NVIDIA A100-PCIE-40GB
    "A100-80GB": r"a100(sxm4?)?80gb",                 # NVIDIA A100-SXM4-80GB
    "A100-80GB-PCIe": r"a100(80gbpcie|pcie80gb)",     # NVIDIA A100 80GB PCIe
    "H100-SXM": r"h100(sxm5?)?(80gb)?(hbm3)?",        # NVIDIA H100 80GB HBM3
    "H100-PCIe": r"h100(80gb)?pcie(80gb)?",           # NVIDIA H100 PCIe
    "H200": r"h200(sxm5?)?(141gb)?(hbm3e)?",          # NVIDIA H200
    "L40S": r"l40s",                                  # NVIDIA L40S
    "RTX4090": r"(geforce)?rtx4090",                  # NVIDIA GeForce RTX 4090
    "RTX3090": r"(geforce)?rtx3090",                  # NVIDIA GeForce RTX 3090
}


def _key(text: str) -> str:
    return re.sub(r"[\s_\-]", "", str(text).lower())


def _index() -> dict[str, Target]:
    index: dict[str, Target] = {}
    for target in _TABLE:
        for label in (target.name, *target.aliases):
            index[_key(label)] = target
    return index


_INDEX = _index()


def list_targets() -> list[Target]:
    """Every known target, in table order."""
    return [t.model_copy(deep=True) for t in _TABLE]


def _known_names() -> str:
    aliases = ", ".join(a for t in _TABLE for a in t.aliases)
    return f"{', '.join(t.name for t in _TABLE)} (aliases: {aliases}), or 'auto' for the local GPU"


def get_target(name: str | Target) -> Target:
    """Look a target up by name or alias (case-insensitive; '-', '_' and spaces ignored).
    'auto' detects the local GPU and raises when there is none (see `resolve_target`)."""
    if isinstance(name, Target):
        return name
    key = _key(name)
    if key == "auto":
        local = detect_local_target()
        if local is None:
            raise ValueError(f"target='auto' but no CUDA GPU was found on this machine; pass a target name "
                             f"instead: {_known_names()}.")
        return local
    if key in _INDEX:
        return _INDEX[key].model_copy(deep=True)
    close = difflib.get_close_matches(key, list(_INDEX), n=1)
    hint = f" Closest: {_INDEX[close[0]].name}." if close else ""
    raise ValueError(f"Unknown GPU target {name!r}.{hint} Known targets: {_known_names()}.")


def match_device_name(device_name: str) -> Target | None:
    """The table row for a `torch.cuda.get_device_name()` string, or None when it is not listed."""
    key = _key(device_name).replace("nvidia", "")
    for target_name, pattern in _DEVICE_PATTERNS.items():
        if re.fullmatch(pattern, key):
            return _INDEX[_key(target_name)].model_copy(update={"device_name": device_name}, deep=True)
    return None


# Dense flops per clock per SM for GPUs outside the table, by architecture (from the whitepapers'
# per-SM unit counts): (tensor fp16, tensor bf16, tensor tf32), (cuda fp16, cuda bf16, cuda fp32).
# Blackwell and later get Hopper's rates: conservative, never optimistic.
def _per_sm_clock_rates(major: int, minor: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    if major >= 9:
        return (4096, 4096, 2048), (512, 512, 256)
    if (major, minor) == (8, 0):
        return (2048, 2048, 1024), (512, 256, 128)
    if major == 8:  # GA10x / AD10x: fp32-accumulate tensor rate
        return (512, 512, 256), (256, 256, 256)
    if major == 7:  # Volta/Turing: fp16 tensor cores only
        return (1024, 128, 128), (256, 128, 128)
    return (128, 128, 128), (128, 128, 128)  # no tensor cores


def target_from_properties(props, device_name: str | None = None) -> Target:
    """A Target for a GPU not in the table, from `torch.cuda.get_device_properties` (or any object
    with the same attributes). Peaks are SMs x per-SM rate x clock; when torch does not report the
    clocks, 1.0 GHz core and 500 GB/s memory are assumed: conservative figures, flagged in `note`."""
    major, minor = int(props.major), int(props.minor)
    name = device_name or str(getattr(props, "name", "unknown GPU"))
    sms = int(props.multi_processor_count)
    clock_khz = int(getattr(props, "clock_rate", 0) or 0)
    clock_ghz = clock_khz / 1e6 if clock_khz else 1.0
    mem_khz = int(getattr(props, "memory_clock_rate", 0) or 0)
    bus_bits = int(getattr(props, "memory_bus_width", 0) or 0)
    bandwidth = 2.0 * mem_khz * 1e3 * bus_bits / 8 / 1e9 if mem_khz and bus_bits else 500.0
    tensor, cuda = _per_sm_clock_rates(major, minor)
    to_tflops = lambda per_clock: sms * per_clock * clock_ghz * 1e9 / 1e12  # noqa: E731
    sparse_ok = major >= 8
    dense_tc = _peaks(*(to_tflops(r) for r in tensor))
    note = (f"'{name}' is not in the SparseDitto target table: peaks are estimates from its properties "
            f"({sms} SMs, sm_{major}{minor} per-SM rates, {'reported' if clock_khz else 'assumed'} "
            f"{clock_ghz:.2f} GHz clock, {'reported' if mem_khz else 'assumed'} {bandwidth:.0f} GB/s). "
            f"Pass a known target name for planning with datasheet numbers.")
    return Target(
        name=name, arch=f"sm_{major}{minor}", compute_capability=(major, minor), sm_count=sms,
        memory_gb=round(int(props.total_memory) / 1e9, 1), mem_bandwidth_gbs=bandwidth,
        l2_mb=(int(getattr(props, "L2_cache_size", 0) or 0) / 2**20) or 4.0,
        smem_per_sm_kb=(int(getattr(props, "shared_memory_per_multiprocessor", 0) or 0) / 1024) or 64.0,
        max_smem_per_block_kb=(int(getattr(props, "shared_memory_per_block_optin", 0) or 0) / 1024) or 48.0,
        tensor_tflops=dense_tc,
        sparse_tensor_tflops={d: v * (2 if sparse_ok else 1) for d, v in dense_tc.items()},
        cuda_core_tflops=_peaks(*(to_tflops(r) for r in cuda)), supports_sparse_mma=sparse_ok,
        source="torch.cuda.get_device_properties", note=note, device_name=name)


def detect_local_target(device: int | None = None) -> Target | None:
    """The Target of the local CUDA GPU (table row, or one derived from its properties), or None."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        index = torch.cuda.current_device() if device is None else device
        name = torch.cuda.get_device_name(index)
        return match_device_name(name) or target_from_properties(torch.cuda.get_device_properties(index), name)
    except (ImportError, RuntimeError, AssertionError):  # no torch / broken driver: treat as no GPU
        return None


def resolve_target(name: str | Target = "auto", fallback: str = "H100") -> tuple[Target, str | None]:
    """Like `get_target`, but 'auto' on a machine without a GPU falls back to `fallback` and says
    so in the note (the graph still plans on CPU-only machines; it just cannot time kernels)."""
    if isinstance(name, Target):
        return name, name.note
    if _key(name) != "auto":
        return get_target(name), None
    local = detect_local_target()
    if local is not None:
        return local, local.note
    target = get_target(fallback)
    return target, (f"target='auto' found no CUDA GPU on this machine; planning for {target.name} "
                    f"({target.name} datasheet numbers) instead.")


# ---- roofline ---------------------------------------------------------------------------------
class RooflineEstimate(BaseModel):
    """Lower-bound time of a kernel: it can neither move its bytes faster than DRAM bandwidth nor
    do its flops faster than the unit's peak. `seconds` = max of the two + launch overhead."""

    target: str
    dtype: str
    unit: Literal["tensor", "sparse_tensor", "cuda_core"]
    bytes: float
    flops: float
    bandwidth_gbs: float
    peak_tflops: float
    memory_s: float
    compute_s: float
    launch_s: float
    seconds: float
    bound: Literal["memory", "compute"]

    def percent_of_roofline(self, measured_s: float) -> float:
        """How close a measured time is to this bound (100 = at the roofline)."""
        if not measured_s > 0:
            raise ValueError(f"Expected a positive measured time, got {measured_s}.")
        return 100.0 * self.seconds / measured_s


def roofline(target: Target | str, bytes_moved: float, flops: float, dtype: str = "float16",
             unit: str = "tensor", use_measured_bandwidth: bool = True, launch_s: float = 0.0) -> RooflineEstimate:
    """Roofline lower bound for moving `bytes_moved` DRAM bytes and doing `flops` on `unit`."""
    target = get_target(target)
    for label, value in (("bytes_moved", bytes_moved), ("flops", flops), ("launch_s", launch_s)):
        if not value >= 0:
            raise ValueError(f"Expected {label} >= 0, got {value}.")
    peak = target.peak_tflops(unit, dtype)
    bandwidth = target.bandwidth_gbs(use_measured_bandwidth)
    memory_s = bytes_moved / (bandwidth * 1e9)
    compute_s = flops / (peak * 1e12)
    return RooflineEstimate(
        target=target.name, dtype=dtype, unit=unit, bytes=float(bytes_moved), flops=float(flops),
        bandwidth_gbs=bandwidth, peak_tflops=peak, memory_s=memory_s, compute_s=compute_s, launch_s=launch_s,
        seconds=max(memory_s, compute_s) + launch_s, bound="memory" if memory_s >= compute_s else "compute")


def dense_gemm_roofline(target: Target | str, m: int, k: int, n: int, dtype: str = "float16", *,
                        use_measured_bandwidth: bool = True, launch_s: float = 0.0) -> RooflineEstimate:
    """The dense baseline C[m,n] = A[m,k] @ B[k,n] on tensor cores: every operand read or written
    once ((mk + kn + mn) values), 2mkn flops."""
    for label, value in (("m", m), ("k", k), ("n", n)):
        if int(value) != value or value <= 0:
            raise ValueError(f"Expected a positive integer {label}, got {value}.")
    if dtype not in PEAK_DTYPES:
        raise ValueError(f"No tensor-core peak for dtype {dtype!r}; expected one of {', '.join(PEAK_DTYPES)}.")
    value_bytes = VALUE_BYTES[dtype]
    return roofline(target, (m * k + k * n + m * n) * value_bytes, 2.0 * m * k * n, dtype=dtype, unit="tensor",
                    use_measured_bandwidth=use_measured_bandwidth, launch_s=launch_s)
