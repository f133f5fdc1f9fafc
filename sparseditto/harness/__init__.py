"""Tools the agents call: static checks, sandboxed compile/verify, cold-L2 benchmarks, ncu.

Every entry point takes a kernel candidate (a registry ``Candidate`` or raw source text defining
``prepare(A, dtype, device)`` and ``spmm(packed, B, out)``) and returns a pydantic result; the
candidate itself only ever runs inside a sandboxed worker process (`sandbox.WorkerPool`).
Importing this package does not import torch or triton.
"""
from .baselines import BASELINE_NAMES, run_baselines
from .bench import BenchError, bench
from .candidate_spec import CandidateSpec, as_spec, vendor_spec
from .compile import compile_candidate
from .ncu import parse_ncu_csv, profile_ncu, summarize_ncu_rows
from .numerics import RTOL
from .results import (BaselineTiming, BenchResult, CompileResult, NCheck, NcuResult, StaticCheckResult,
                      Timing, VerifyResult)
from .sandbox import WorkerPool, WorkerReply, WorkerStartError, get_pool, resolve_backend, shutdown_default_pool
from .source_loader import load_module, write_source
from .static_checks import check_source
from .vendor_kernels import VENDOR_NAMES, is_vendor_kernel, unavailable_reason, vendor_kernel
from .verify import run_and_verify

__all__ = [
    "BASELINE_NAMES", "BaselineTiming", "BenchError", "BenchResult", "CandidateSpec", "CompileResult",
    "NCheck", "NcuResult", "RTOL", "StaticCheckResult", "Timing", "VerifyResult", "WorkerPool",
    "WorkerReply", "WorkerStartError", "as_spec", "bench", "check_source", "compile_candidate", "get_pool", "load_module",
    "parse_ncu_csv", "profile_ncu", "resolve_backend", "run_and_verify", "run_baselines",
    "shutdown_default_pool", "summarize_ncu_rows", "write_source", "VENDOR_NAMES", "is_vendor_kernel",
    "unavailable_reason", "vendor_kernel", "vendor_spec",
]
