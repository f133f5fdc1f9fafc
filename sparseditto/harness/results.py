"""Result models of the harness tools.

Every tool the agents call returns one of these pydantic models rather than raising: a kernel that
fails to compile, crashes its worker or computes a wrong answer is an *outcome* the debugger agent
reads, not an exception that would end the graph. They are plain JSON-able data so they can go into
the SQLite memory, the graph state and the reports unchanged.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

VerifyStatus = Literal[
    "verified",          # every check passed
    "static_rejected",   # the AST checks refused the source (vendor GEMM, I/O, escapes, caches...)
    "compile_error",     # syntax/import error, Triton or CUDA compilation failure
    "runtime_error",     # prepare()/spmm() raised a Python exception
    "crash",             # the worker process died, or its CUDA context was poisoned
    "timeout",           # the worker ran past the limit and was killed
    "wrong_result",      # outputs outside the tolerance (or NaN/Inf written by the kernel)
    "unwritten_output",  # some output entries were never written (NaN pre-fill survived)
    "input_modified",    # B or a tensor of the packed format changed during spmm()
    "unstable",          # two runs on identical inputs disagree beyond the tolerance
    "refused",           # the sandbox or the launch tracing refused what the candidate did: a vendor
                         # library call, file/network/process access, introspection, state kept
                         # between calls, a monkeypatch (failure_class says which)
]

ExecBackend = Literal["cuda", "interpret"]


class StaticCheckResult(BaseModel):
    """Outcome of the AST checks on a candidate source (`static_checks.check_source`)."""

    ok: bool
    violations: list[str] = Field(default_factory=list)
    syntax_error: str | None = None  # set when the source does not even parse


class CompileResult(BaseModel):
    """Outcome of `compile_candidate`: imported, JIT-compiled (and optionally nvcc-compiled)."""

    ok: bool
    log: str = ""
    seconds: float = 0.0
    backend: str = ""            # execution backend used: "cuda" or "interpret"
    failure_class: str | None = None
    violations: list[str] = Field(default_factory=list)


class NCheck(BaseModel):
    """One numerical comparison of a candidate run against the fp64 reference (or a rerun).

    ``rel_err`` is the normwise error max|C - ref| / max|ref|; ``tol_ratio`` is the elementwise
    worst max(|C - ref| / (atol + rtol_i * (|A| @ |B|)_ij)), the number that decides ``ok``
    (ok iff tol_ratio <= 1). ``tol`` is the dtype's base relative tolerance. ``kind`` says which
    run: "base" (fresh values), "repeat" (same inputs again, compared with the first run) or
    "scaled" (fresh inputs scaled by 2^-6, written into B's storage in place).
    """

    n: int
    rel_err: float
    max_abs_err: float
    tol: float
    ok: bool
    kind: str = "base"
    tol_ratio: float = 0.0
    dist: str = "uniform"        # the distribution B was drawn from (numerics.DISTRIBUTIONS)
    prefill: str = "nan"         # what out held before the call: "nan" or "garbage"


class VerifyResult(BaseModel):
    """Outcome of `run_and_verify`. ``status`` is the one field the graph routes on."""

    ok: bool
    status: VerifyStatus
    failure_class: str | None = None
    message: str = ""
    checks: list[NCheck] = Field(default_factory=list)
    log: str = ""
    seconds: float = 0.0
    backend: str = ""
    gpu_timings: bool = False    # True when the candidate ran on a GPU (backend "cuda")
    violations: list[str] = Field(default_factory=list)
    seed: int | None = None      # the verification's seed: run_and_verify(..., seed=seed) reproduces it
    sandbox: dict = Field(default_factory=dict)   # the isolation layers in force in the worker


class Timing(BaseModel):
    """Distribution of one measured operation, in milliseconds."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    repeats: int
    min_ms: float | None = None


class BaselineTiming(BaseModel):
    """One vendor/library baseline. A failed baseline is kept with its reason, never dropped.

    ``timing`` is the eager launch; ``graph_timing`` the same call replayed from a CUDA graph (only
    when asked for, on a GPU, and when the library's call can be captured). ``rechecked`` is None
    when no re-check was asked for, else whether the library, rebuilt on a fresh B after timing,
    still matched the fp64 reference (``recheck_message`` says what was compared or what failed).
    """

    name: str
    ok: bool
    timing: Timing | None = None
    graph_timing: Timing | None = None
    chain_timing: Timing | None = None   # dense cuBLAS only: launches chained in one graph (bench(chain=True))
    error: str | None = None
    note: str | None = None
    rechecked: bool | None = None
    recheck_message: str = ""


class BenchResult(BaseModel):
    """Outcome of `bench`: candidate vs dense cuBLAS vs vendor sparse baselines, same process.

    ``candidate`` is the eager launch (what users without CUDA graphs pay); ``candidate_graph`` is
    one launch replayed from a CUDA graph, the kernel's own time. Both with a cold L2.
    ``speedup_vs_dense`` = dense.median / candidate.median (eager vs eager, like for like);
    ``speedup_vs_best_baseline`` uses the fastest ok baseline (dense included).
    ``conversion_ms`` is one prepare() call (format build + upload), never hidden in the kernel time.
    ``packed_bytes``: what the candidate keeps of A (each storage once), for its byte roofline.
    ``reused_baselines``: the baselines (``cublas_dense`` included) whose timings an earlier bench
    of the same ``baseline_scope`` measured in this worker process, by the same method.
    """

    n: int
    dtype: str
    backend: str
    gpu_name: str
    timings_are_gpu: bool
    candidate: Timing
    candidate_graph: Timing | None = None
    # bench(chain=True): per launch, launches back to back from one CUDA graph, each on its own L2-cold
    # copy of the prepared matrix (harness.timing.time_cuda_chain): a layer inside a model's graph
    candidate_chain: Timing | None = None
    chain_copies: int | None = None
    conversion_ms: float
    packed_bytes: int | None = None      # bytes of the arrays prepare() returned (outside "scratch")
    dense: Timing | None = None          # None only when bench(..., time_dense=False)
    dense_graph: Timing | None = None
    dense_chain: Timing | None = None
    baselines: list[BaselineTiming] = Field(default_factory=list)
    speedup_vs_dense: float | None = None
    speedup_vs_dense_graph: float | None = None
    speedup_vs_dense_chain: float | None = None
    speedup_vs_best_baseline: float | None = None
    best_baseline: str | None = None
    reverified: bool
    reverify_message: str = ""
    l2_flush_bytes: int = 0
    notes: list[str] = Field(default_factory=list)
    reused_baselines: list[str] = Field(default_factory=list)
    # wall seconds of the bench's steps in the worker (prepare, check, eager / graph timing, dense,
    # vendor baselines, state check): where a profiler step's time goes (an H200 run spent 57 s in
    # one bench of an 11008x4096 weight)
    stage_seconds: dict[str, float] = Field(default_factory=dict)


class NcuResult(BaseModel):
    """Outcome of `profile_ncu`. ``available`` False carries the reason in ``note``."""

    available: bool
    note: str = ""
    metrics: dict[str, float] = Field(default_factory=dict)
    raw_csv: str | None = None
    kernels: list[str] = Field(default_factory=list)
