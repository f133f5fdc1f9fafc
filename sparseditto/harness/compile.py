"""Compile a candidate (`compile_candidate`): static checks, import, JIT on a tiny run, optional nvcc.

"Compiled" means: the source passes the static checks, the module imports in the sandboxed worker,
and one ``prepare`` + ``spmm`` with N=1 ran to completion, which forces Triton's JIT (or CuPy's NVRTC
compile) for that specialization. When the candidate embeds CUDA C++ (a module-level string with a
``__global__`` kernel, e.g. the csr_vector template's ``CUDA_SRC``), ``nvcc`` is on the PATH and a
target ``arch`` such as ``"sm_90"`` is given, the CUDA source is also compiled ahead of time with
``nvcc -arch=<arch> -cubin``, which checks it for a GPU other than the local one. Correctness is
not judged here; that is `run_and_verify`'s job.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import time

import numpy as np

from .candidate_spec import as_spec
from .results import CompileResult

_ARCH_RE = re.compile(r"^(sm|compute)_\d{2,3}[af]?$")


def compile_candidate(candidate, backend: str = "auto", *, matrix=None, dtype: str = "float16",
                      arch: str | None = None, timeout: float = 120.0, pool=None,
                      nvcc: str | None = None) -> CompileResult:
    """Check, import and JIT-compile ``candidate`` in the sandbox; see the module docstring."""
    from .numerics import check_dtype
    from .sandbox import get_pool, resolve_backend
    from .static_checks import check_source

    check_dtype(dtype)
    if arch is not None and not _ARCH_RE.match(arch):
        raise ValueError(f"Expected a CUDA arch like 'sm_90' or 'sm_90a', got {arch!r}.")
    if matrix is not None:
        from .verify import check_matrix

        check_matrix(matrix)
    spec = as_spec(candidate)
    exec_backend = resolve_backend(backend)
    start = time.perf_counter()

    def result(ok: bool, log: str, failure_class: str | None = None, violations=()) -> CompileResult:
        return CompileResult(ok=ok, log=log.strip(), seconds=time.perf_counter() - start,
                             backend=exec_backend, failure_class=failure_class,
                             violations=list(violations))

    if spec.is_builtin:
        return result(True, f"vendor path {spec.template} (library code run by the harness): nothing to compile")
    static = check_source(spec.source)
    if not static.ok:
        return result(False, "static checks failed:\n" + "\n".join(static.violations),
                      "syntax_error" if static.syntax_error else "static_violation", static.violations)

    logs: list[str] = []
    nvcc_compiled = False
    if arch is not None:
        nvcc_ok, nvcc_compiled, nvcc_log = _nvcc_compile(spec.source, arch, nvcc, timeout,
                                                         get_pool(pool).cache_dir)
        if nvcc_log:
            logs.append(nvcc_log)
        if not nvcc_ok:
            return result(False, "\n".join(logs), "cuda_compile_error")

    if spec.backend == "cuda" and exec_backend != "cuda":
        # Without a GPU the CuPy path cannot run; an nvcc compile for the target is all we can do.
        logs.append("runtime (CuPy/NVRTC) compile skipped: CUDA C++ candidates need a GPU")
        return result(nvcc_compiled, "\n".join(logs), None if nvcc_compiled else "backend_unavailable")

    payload = {"spec": spec, "matrix": matrix, "dtype": dtype, "backend": exec_backend}
    reply = get_pool(pool).call("compile", payload, backend=exec_backend, timeout=timeout)
    if reply.log.strip():
        logs.append(reply.log)
    if reply.status == "ok":
        value = reply.value
        logs.insert(0, value["log"])
        return result(value["ok"], "\n".join(logs), value.get("failure_class"))
    if reply.status == "timeout":
        return result(False, "\n".join([reply.error] + logs), "timeout")
    if reply.status == "crash":
        return result(False, "\n".join([reply.error] + logs), "worker_crash")
    return result(False, "\n".join([reply.error] + logs), "harness_error")


def _nvcc_compile(source: str, arch: str, nvcc: str | None, timeout: float,
                  cache_dir) -> tuple[bool, bool, str]:
    """Ahead-of-time ``nvcc -cubin`` of every embedded CUDA source: (ok, compiled, log).

    ok=True, compiled=False when there is nothing to do (no CUDA source) or nvcc is missing.
    """
    from .source_loader import cuda_sources, default_cache_dir, source_hash

    sources = cuda_sources(source)
    if not sources:
        return True, False, ""
    exe = nvcc or shutil.which("nvcc")
    if exe is None:
        return True, False, f"nvcc not found on PATH: skipped the ahead-of-time compile for {arch}"
    base = default_cache_dir() if cache_dir is None else os.fspath(cache_dir)
    workdir = os.path.join(base, "nvcc")
    os.makedirs(workdir, exist_ok=True)
    logs = []
    for name, code in sources.items():
        if "@SPARSEDITTO_INLINE" in code:
            return False, False, f"{name} is still an uninstantiated template placeholder"
        stem = os.path.join(workdir, f"{source_hash(code)[:24]}_{arch}")
        with open(stem + ".cu", "w", encoding="utf-8") as fh:
            fh.write(code)
        cmd = [exe, f"-arch={arch}", "-cubin", "-std=c++17", "-o", stem + ".cubin", stem + ".cu"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return False, False, f"nvcc -arch={arch} timed out after {timeout:.0f} s on {name}"
        output = (proc.stdout + proc.stderr).strip()
        if proc.returncode != 0:
            return False, False, f"nvcc -arch={arch} failed on {name} (exit {proc.returncode}):\n{output}"
        logs.append(f"nvcc -arch={arch} -cubin {name}: ok" + (f"\n{output}" if output else ""))
    return True, True, "\n".join(logs)


# ---- worker side ---------------------------------------------------------------------------------

def tiny_matrix(dtype: str):
    """A small random pattern (with an empty row) that exercises the usual code paths."""
    import scipy.sparse as sp

    from sparseditto.matrix import SparseMatrix

    mat = sp.random(16, 24, density=0.3, random_state=np.random.default_rng(0), format="csr")
    mat = sp.csr_array(mat)
    mat.data[:] = np.linspace(-1.0, 1.0, mat.nnz)
    dense = mat.toarray()
    dense[5, :] = 0.0
    return SparseMatrix.from_scipy(sp.csr_array(dense), dtype=dtype, name="compile_probe")


def compile_task(payload: dict, wctx) -> dict:
    """Worker entry: import, then prepare + one N=1 spmm to force the JIT."""
    import torch

    from .execution import CandidateFailure, call_prepare, call_spmm, device_for, load_candidate
    from .numerics import torch_dtype

    spec, dtype, backend = payload["spec"], payload["dtype"], payload["backend"]
    device = device_for(backend)
    matrix = payload["matrix"] if payload["matrix"] is not None else tiny_matrix(dtype)
    steps = []
    try:
        t0 = time.perf_counter()
        module = load_candidate(spec, wctx)
        steps.append(f"import: ok ({time.perf_counter() - t0:.2f} s)")
        t0 = time.perf_counter()
        packed = call_prepare(module, matrix, dtype, device, wctx)
        steps.append(f"prepare on {matrix.shape} nnz={matrix.nnz}: ok ({time.perf_counter() - t0:.2f} s)")
        B = torch.ones((matrix.shape[1], 1), dtype=torch_dtype(dtype), device=device)
        out = torch.zeros((matrix.shape[0], 1), dtype=torch_dtype(dtype), device=device)
        t0 = time.perf_counter()
        call_spmm(module, packed, B, out, device, wctx, source=spec.source)
        steps.append(f"first spmm (N=1, JIT compile): ok ({time.perf_counter() - t0:.2f} s)")
    except CandidateFailure as failure:
        steps.append(failure.message)
        if failure.log:
            steps.append(failure.log)
        return {"ok": False, "log": "\n".join(steps), "failure_class": failure.failure_class}
    return {"ok": True, "log": "\n".join(steps), "failure_class": None}
