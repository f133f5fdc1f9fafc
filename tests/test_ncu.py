"""Nsight Compute: CSV parsing and failure notes on the CPU, a real profile on a GPU with ncu."""
from pathlib import Path

import pytest
import scipy.sparse as sp

from sparseditto.harness import parse_ncu_csv, profile_ncu, summarize_ncu_rows
from sparseditto.harness.ncu import NVTX_RANGE, build_command, child_inputs, interpret_ncu_output, parse_number
from sparseditto.matrix import SparseMatrix

CANDIDATES = Path(__file__).parent / "candidates"

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
          '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def row(kid, kernel, metric, unit, value, block="(128, 1, 1)", grid="(1024, 1, 1)"):
    return (f'"{kid}","48213","python3.11","127.0.0.1","{kernel}","1","7","{block}","{grid}","0","9.0",'
            f'"Command line profiler metrics","{metric}","{unit}","{value}"')


K0 = "_csr_row_kernel"
K1 = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<c10::Half>>(int, T2, T3)"

# A hand-made sample in the layout `ncu --csv --metrics ...` prints: ==PROF== chatter, then one
# row per (kernel, metric), values with unit auto-scaling and thousands separators.
SAMPLE_LONG = "\n".join([
    "==PROF== Connected to process 48213 (/usr/bin/python3.11)",
    f'==PROF== Profiling "{K1}" - 0: 0%....50%....100% - 9 passes',
    f'==PROF== Profiling "{K0}" - 1: 0%....50%....100% - 9 passes',
    "==PROF== Disconnected from process 48213",
    HEADER,
    row(0, K1, "dram__bytes_read.sum", "Kbyte", "12.29", "(128, 1, 1)", "(64, 1, 1)"),
    row(0, K1, "dram__bytes_write.sum", "byte", "0", "(128, 1, 1)", "(64, 1, 1)"),
    row(0, K1, "dram__throughput.avg.pct_of_peak_sustained_elapsed", "%", "10.00", "(128, 1, 1)", "(64, 1, 1)"),
    row(0, K1, "gpu__time_duration.sum", "nsecond", "2,016", "(128, 1, 1)", "(64, 1, 1)"),
    row(0, K1, "launch__block_size", "", "128", "(128, 1, 1)", "(64, 1, 1)"),
    row(0, K1, "launch__grid_size", "", "64", "(128, 1, 1)", "(64, 1, 1)"),
    row(0, K1, "launch__registers_per_thread", "register/thread", "16", "(128, 1, 1)", "(64, 1, 1)"),
    row(0, K1, "launch__shared_mem_per_block_dynamic", "byte/block", "0", "(128, 1, 1)", "(64, 1, 1)"),
    row(0, K1, "launch__shared_mem_per_block_static", "byte/block", "512", "(128, 1, 1)", "(64, 1, 1)"),
    row(0, K1, "sm__throughput.avg.pct_of_peak_sustained_elapsed", "%", "3.10", "(128, 1, 1)", "(64, 1, 1)"),
    row(0, K1, "sm__warps_active.avg.pct_of_peak_sustained_active", "%", "20.00", "(128, 1, 1)", "(64, 1, 1)"),
    row(1, K0, "dram__bytes_read.sum", "Mbyte", "3.15"),
    row(1, K0, "dram__bytes_write.sum", "byte", "1,048,576"),
    row(1, K0, "dram__throughput.avg.pct_of_peak_sustained_elapsed", "%", "61.50"),
    row(1, K0, "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed", "%", "64.25"),
    row(1, K0, "gpu__time_duration.sum", "usecond", "12.48"),
    row(1, K0, "launch__block_size", "", "128"),
    row(1, K0, "launch__grid_size", "", "1,024"),
    row(1, K0, "launch__registers_per_thread", "register/thread", "40"),
    row(1, K0, "launch__shared_mem_per_block_dynamic", "Kbyte/block", "8.19"),
    row(1, K0, "launch__shared_mem_per_block_static", "byte/block", "0"),
    row(1, K0, "lts__t_sector_hit_rate.pct", "%", "35.20"),
    row(1, K0, "sm__throughput.avg.pct_of_peak_sustained_elapsed", "%", "22.75"),
    row(1, K0, "sm__warps_active.avg.pct_of_peak_sustained_active", "%", "n/a"),
])


def test_parse_long_csv_skips_prof_lines():
    rows = parse_ncu_csv(SAMPLE_LONG)
    assert len(rows) == 24
    assert rows[0]["Kernel Name"] == K1 and rows[0]["Metric Name"] == "dram__bytes_read.sum"
    assert rows[-1]["Metric Value"] == "n/a"


def test_summarize_weights_sums_and_units():
    metrics, kernels = summarize_ncu_rows(parse_ncu_csv(SAMPLE_LONG))
    assert kernels == [K1, K0]
    assert metrics["kernels"] == 2
    assert metrics["duration_us"] == pytest.approx((2016 + 12480) / 1e3)
    w0, w1 = 2016.0, 12480.0
    assert metrics["dram_throughput_pct"] == pytest.approx((10.0 * w0 + 61.5 * w1) / (w0 + w1))
    assert metrics["sm_throughput_pct"] == pytest.approx((3.1 * w0 + 22.75 * w1) / (w0 + w1))
    assert metrics["memory_throughput_pct"] == pytest.approx(64.25)   # only one kernel reports it
    assert metrics["l2_hit_rate_pct"] == pytest.approx(35.2)
    assert metrics["achieved_occupancy_pct"] == pytest.approx(20.0)   # 'n/a' is skipped
    assert metrics["dram_bytes_read"] == pytest.approx(3.15e6 + 12.29e3)
    assert metrics["dram_bytes_write"] == pytest.approx(1048576)
    assert metrics["registers_per_thread"] == 40
    assert metrics["shared_mem_per_block_bytes"] == pytest.approx(8190)
    assert (metrics["grid_size"], metrics["block_size"]) == (1024, 128)  # of the longest kernel


def test_parse_wide_raw_page():
    text = "\n".join([
        '"ID","Process ID","Kernel Name","gpu__time_duration.sum","dram__bytes_read.sum","lts__t_sector_hit_rate.pct"',
        '"","","","usecond","Mbyte","%"',
        f'"0","9","{K0}","1.50","2.00","50"',
        f'"1","9","{K0}","0.50","1.00","70"',
    ])
    metrics, kernels = summarize_ncu_rows(parse_ncu_csv(text))
    assert kernels == [K0, K0]
    assert metrics["duration_us"] == pytest.approx(2.0)
    assert metrics["dram_bytes_read"] == pytest.approx(3e6)
    assert metrics["l2_hit_rate_pct"] == pytest.approx((50 * 1.5 + 70 * 0.5) / 2.0)


@pytest.mark.parametrize("value,unit,expected", [
    ("1,234.5", "nsecond", 1234.5), ("9,50", "%", 9.5), ("2", "msecond", 2e6),
    ("1.5", "Kbyte/block", 1500.0), ("n/a", "", None), ("", "byte", None), ("abc", "", None),
])
def test_parse_number(value, unit, expected):
    assert parse_number(value, unit) == expected


def test_failures_become_notes_not_exceptions():
    perm = interpret_ncu_output(1, "", "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission")
    assert not perm.available and "ERR_NVGPUCTRPERM" in perm.note
    none = interpret_ncu_output(0, "==PROF== Disconnected\n==WARNING== No kernels were profiled.\n", "")
    assert not none.available and "no kernels" in none.note
    crash = interpret_ncu_output(139, "", "Segmentation fault (core dumped)")
    assert not crash.available and "code 139" in crash.note
    slow = interpret_ncu_output(None, "", "", timed_out=True, timeout=5)
    assert not slow.available and "timed out after 5 s" in slow.note
    good = interpret_ncu_output(0, SAMPLE_LONG, "")
    assert good.available and good.metrics["kernels"] == 2 and good.raw_csv.startswith('"ID"')
    assert good.model_dump_json()


def test_missing_ncu_is_a_note(tmp_path):
    matrix = SparseMatrix.from_scipy(sp.random(8, 8, density=0.5, random_state=0, format="csr"))
    result = profile_ncu((CANDIDATES / "good_triton_csr.py").read_text(), matrix, 4,
                         ncu_path=str(tmp_path / "no-such-ncu"))
    assert not result.available and "not found" in result.note


def test_command_selects_one_spmm_by_nvtx_range():
    cmd = build_command("/usr/bin/ncu", "/tmp/args.json", kernel_regex="csr", launch_count=1)
    joined = " ".join(cmd)
    assert cmd[:3] == ["/usr/bin/ncu", "--clock-control", "none"]
    assert "--csv" in cmd and "--target-processes all" in joined
    assert f"--nvtx --nvtx-include {NVTX_RANGE}/" in joined
    assert "--kernel-name regex:csr" in joined and "--launch-count 1" in joined
    assert cmd[-3:] == ["-m", "sparseditto.harness.ncu_child", "/tmp/args.json"]


def _gpu_kernel(kind: str):
    from sparseditto.harness import vendor_spec
    from sparseditto.kernel_templates.registry import get_template

    return {"triton source": lambda: (CANDIDATES / "good_triton_csr.py").read_text(),
            "vendor": lambda: vendor_spec("cusparse_csr_torch"),
            "cuda template": lambda: get_template("csr_vector").instantiate({})}[kind]()


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["triton source", "vendor", "cuda template"])
def test_gpu_profile_with_ncu(kind):
    """One spmm profiled for each kind of kernel: a generated Triton source, a vendor library
    (trusted, loaded by name) and a CUDA C++ template (loaded with its own backend)."""
    from sparseditto.harness.ncu import find_ncu

    if find_ncu() is None:
        pytest.skip("ncu not installed")
    matrix = SparseMatrix.from_scipy(sp.random(1024, 2048, density=0.1, random_state=5, format="csr"),
                                     dtype="float16")
    result = profile_ncu(_gpu_kernel(kind), matrix, 16, timeout=600)
    if not result.available and "ERR_NVGPUCTRPERM" in result.note:
        pytest.skip(result.note)
    assert result.available, result.note
    assert result.metrics["duration_us"] > 0 and result.metrics["kernels"] >= 1
    if kind == "triton source":
        assert any("csr_row_kernel" in k for k in result.kernels), result.kernels
    assert 0 <= result.metrics["dram_throughput_pct"] <= 100

def test_what_ncu_profiles_for_each_kind_of_kernel():
    """Vendor paths (dense cuBLAS, the libraries: origin "vendor") are trusted harness code, loaded
    by name, profiled only when the library can run the matrix; generated kernels (Triton, CUDA C++
    through CuPy) pass the static checks and are loaded from their source with their own backend.
    The child rebuilds exactly that spec from the args."""
    from sparseditto.harness import as_spec, vendor_spec
    from sparseditto.harness.ncu import profiled_kernel
    from sparseditto.harness.ncu_child import child_spec
    from sparseditto.harness.vendor_kernels import VENDOR_NAMES, unavailable_reason
    from sparseditto.kernel_templates.registry import get_template

    matrix = SparseMatrix.from_scipy(sp.random(16, 32, density=0.3, random_state=1, format="csr"), dtype="float16")
    for name in VENDOR_NAMES:
        kernel, note = profiled_kernel(vendor_spec(name), matrix, "float16")
        why = unavailable_reason(name, matrix, "float16", "cuda")
        if why is None:
            assert kernel == {"vendor": name} and note == ""
            assert child_spec(kernel) == vendor_spec(name)
        else:   # cuSPARSELt on rows that are not 2:4 (and CuPy's path where CuPy is missing)
            assert kernel is None and name in note and why in note
    assert profiled_kernel(vendor_spec("cusparselt_2to4"), matrix, "float16")[0] is None
    for template, backend in (("csr_rowsplit", "triton"), ("csr_vector", "cuda")):
        candidate = get_template(template).instantiate({})
        kernel, note = profiled_kernel(as_spec(candidate), matrix, "float16")
        assert note == "" and kernel["backend"] == backend and "vendor" not in kernel
        rebuilt = child_spec(kernel)
        assert rebuilt.backend == backend and rebuilt.source == candidate.source and not rebuilt.is_builtin
    kernel, note = profiled_kernel(as_spec((CANDIDATES / "cheat_torch_mm.py").read_text()), matrix, "float16")
    assert kernel is None and "static checks" in note



def test_child_inputs_write_what_the_profiled_child_reads(tmp_path, monkeypatch):
    """profile_ncu and benchmarks/ncu_source.py hand the child the same files: the matrix as CSR
    arrays, the arguments as JSON (NVTX range included), and a worker's scrubbed environment."""
    import json

    import numpy as np

    from sparseditto import generate

    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-for-the-child")
    A = generate.unstructured(40, 70, 0.8, dtype="float16", seed=1)
    args_path, env = child_inputs(tmp_path, {"vendor": "dense"}, A, 9, "float16", seed=5)
    args = json.loads(open(args_path).read())
    assert args == {"kernel": {"vendor": "dense"}, "matrix_path": str(tmp_path / "matrix.npz"),
                    "matrix_dtype": A.dtype, "n": 9, "dtype": "float16", "warmup": 3, "seed": 5,
                    "range": NVTX_RANGE}
    saved = np.load(args["matrix_path"])
    assert tuple(saved["shape"]) == A.shape and np.array_equal(saved["indices"], A.indices)
    assert np.array_equal(saved["indptr"], A.indptr) and np.array_equal(saved["data"], A.data)
    assert "OPENAI_API_KEY" not in env and (tmp_path / "home").is_dir()
