"""Run a candidate in the sandbox and prove it computes A @ B (`run_and_verify`).

For every N in ``n_values`` (odd sizes included, to catch tail masking) the worker:

1. draws fresh values for A's nonzeros on the same pattern and calls ``prepare`` on them;
2. draws a fresh B, runs ``spmm`` into an output pre-filled with NaN, and compares with the fp64
   reference using the tolerance in `numerics` (NaN left over -> "unwritten_output", confirmed by a
   second run with a different sentinel so a kernel that *writes* NaN is "wrong_result");
3. checks that B and every array in the packed dict are byte-identical afterwards ("input_modified");
4. runs again on the same inputs and compares with the first run ("unstable");
5. overwrites B *in place* with fresh values scaled by 2^-6 and runs again: an output cached by
   shape or by pointer, or zeros written for small inputs, fail here ("wrong_result").

Static checks run first (in the caller's process); the rest happens in the worker, so crashes,
hangs and poisoned CUDA contexts come back as "crash"/"timeout" instead of killing the caller.
"""
from __future__ import annotations

import time

import numpy as np

from .candidate_spec import as_spec
from .numerics import SCALED_CHECK_FACTOR, Reference, check_dtype, compare, draw_dense, \
    draw_matrix_values, torch_dtype, with_values
from .results import NCheck, VerifyResult
from .sandbox import WorkerReply, get_pool, resolve_backend
from .static_checks import check_source


def check_matrix(matrix) -> None:
    for attr in ("indptr", "indices", "data", "shape", "row_lengths"):
        if not hasattr(matrix, attr):
            raise ValueError(f"Expected a sparseditto.matrix.SparseMatrix, got {type(matrix).__name__} "
                             f"(missing '{attr}'); convert with sparseditto.io.load_matrix first.")


def check_n_values(n_values) -> tuple[int, ...]:
    try:
        values = tuple(int(n) for n in n_values)
    except TypeError:
        raise ValueError(f"Expected an iterable of positive ints for n_values, got {n_values!r}.") from None
    if not values or any(n <= 0 for n in values):
        raise ValueError(f"Expected at least one positive N in n_values, got {n_values!r}.")
    return values


def run_and_verify(candidate, matrix, *, n_values=(1, 7, 16), dtype: str = "float16",
                   backend: str = "auto", seed: int = 0, timeout: float = 120.0, pool=None,
                   check_static: bool = True) -> VerifyResult:
    """Verify ``candidate`` (a Candidate or source text) on ``matrix``'s pattern.

    ``check_static=False`` skips the AST checks; it exists for trusted code and for testing the
    sandbox itself, never for generated kernels.
    """
    check_matrix(matrix)
    n_values = check_n_values(n_values)
    check_dtype(dtype)
    spec = as_spec(candidate)
    exec_backend = resolve_backend(backend)
    start = time.perf_counter()
    common = dict(backend=exec_backend, gpu_timings=exec_backend == "cuda")
    if check_static and not spec.is_builtin_dense:
        static = check_source(spec.source)
        if not static.ok:
            return VerifyResult(
                ok=False, status="compile_error" if static.syntax_error else "static_rejected",
                failure_class="syntax_error" if static.syntax_error else "static_violation",
                message="; ".join(static.violations[:6]), violations=static.violations,
                seconds=time.perf_counter() - start, **common)
    if spec.backend == "cuda" and exec_backend != "cuda":
        return VerifyResult(ok=False, status="compile_error", failure_class="backend_unavailable",
                            message="CUDA C++ (CuPy) candidates need a GPU; the interpret backend "
                                    "runs Triton and torch code only",
                            seconds=time.perf_counter() - start, **common)
    payload = {"spec": spec, "matrix": matrix, "n_values": n_values, "dtype": dtype, "seed": int(seed),
               "backend": exec_backend}
    reply = get_pool(pool).call("verify", payload, backend=exec_backend, timeout=timeout)
    result = result_from_reply(reply, **common)
    result.seconds = time.perf_counter() - start
    return result


def result_from_reply(reply: WorkerReply, **common) -> VerifyResult:
    """Turn a worker reply into a VerifyResult; timeouts and crashes are outcomes, not errors."""
    if reply.status == "ok":
        result = VerifyResult(**reply.value)
        if reply.log.strip():
            result.log = (result.log + "\n--- worker output ---\n" + reply.log).strip()
        return result
    if reply.status == "timeout":
        return VerifyResult(ok=False, status="timeout", failure_class="timeout", message=reply.error,
                            log=reply.log, **common)
    if reply.status == "crash":
        failure = f"worker_crash_{reply.signal_name}" if reply.signal_name else "worker_crash"
        summary = summarize_crash_log(reply.log)
        return VerifyResult(ok=False, status="crash", failure_class=failure,
                            message=reply.error + (f"; {summary}" if summary else ""),
                            log=reply.log, **common)
    # status "error": the harness task itself raised (a harness bug or a poisoned context)
    last = reply.error.strip().splitlines()[-1] if reply.error.strip() else "unknown error"
    return VerifyResult(ok=False, status="crash" if reply.restarted else "runtime_error",
                        failure_class="harness_error", message=last,
                        log=(reply.error + "\n" + reply.log).strip(), **common)


def summarize_crash_log(log: str) -> str:
    """The useful part of a dead worker's output: faulthandler's fatal error line, the innermost
    frames, and the candidate's own frame (files under the kernel cache are named <sha256>.py)."""
    lines = [line.rstrip() for line in log.splitlines()]
    fatal = next((i for i, line in enumerate(lines) if line.startswith("Fatal Python error")), None)
    if fatal is None:
        tail = [line.strip() for line in lines if line.strip()][-4:]
        return ("last output: " + " | ".join(tail)) if tail else ""
    frames = [line.strip() for line in lines[fatal + 1:] if line.strip().startswith("File ")]
    parts = [lines[fatal].strip()]
    if frames:
        parts.append("innermost frames: " + " | ".join(frames[:3]))
    own = [f for f in frames if "/kernels/" in f and "sparseditto_candidate" not in f]
    if own:
        parts.append("candidate frame: " + own[0])
    return "; ".join(parts)


# ---- worker side ---------------------------------------------------------------------------------

def verify_task(payload: dict) -> dict:
    """Worker entry: the full verification protocol; returns VerifyResult as a dict."""
    from .execution import CandidateFailure, failure_from_exception, load_candidate
    from .worker import is_sticky_cuda_error

    spec, matrix, dtype = payload["spec"], payload["matrix"], payload["dtype"]
    backend = payload["backend"]
    start = time.perf_counter()
    checks: list[NCheck] = []
    common = dict(backend=backend, gpu_timings=backend == "cuda")
    try:
        module = load_candidate(spec)
        for i, n in enumerate(payload["n_values"]):
            rng = np.random.default_rng([payload["seed"], i, n])
            _verify_one_n(module, matrix, n, dtype, backend, rng, checks)
    except CandidateFailure as failure:
        return VerifyResult(ok=False, status=failure.status, failure_class=failure.failure_class,
                            message=failure.message, checks=checks, log=failure.log,
                            seconds=time.perf_counter() - start, **common).model_dump()
    except Exception as exc:
        # An asynchronous CUDA fault (illegal address) can surface in a harness op after spmm
        # returned; that is the candidate's crash. Anything else is a harness bug: re-raise.
        if not is_sticky_cuda_error(f"{type(exc).__name__}: {exc}"):
            raise
        failure = failure_from_exception(exc, "verify")
        return VerifyResult(ok=False, status=failure.status, failure_class=failure.failure_class,
                            message=failure.message, checks=checks, log=failure.log,
                            seconds=time.perf_counter() - start, **common).model_dump()
    return VerifyResult(ok=True, status="verified",
                        message=f"verified N={list(payload['n_values'])} in {dtype}",
                        checks=checks, seconds=time.perf_counter() - start, **common).model_dump()


def _verify_one_n(module, matrix, n: int, dtype: str, backend: str, rng: np.random.Generator,
                  checks: list[NCheck]) -> None:
    import torch

    from .execution import Snapshot, call_prepare, device_for

    device = device_for(backend)
    tdtype = torch_dtype(dtype)
    values = draw_matrix_values(matrix, rng, dtype)
    a_test = with_values(matrix, values, dtype)
    packed = call_prepare(module, a_test, dtype, device)
    snapshot = Snapshot.take(packed)
    k, m = matrix.shape[1], matrix.shape[0]

    b64 = draw_dense(rng, (k, n), dtype)
    B = torch.from_numpy(b64).to(device=device, dtype=tdtype)
    ref = Reference.compute(matrix, values, b64, dtype)

    first = _run_checked(module, packed, B, b64, (m, n), tdtype, device, snapshot, ref, n, "base", checks)
    # Same inputs again: a deterministic-enough kernel agrees with itself within the tolerance.
    _run_checked(module, packed, B, b64, (m, n), tdtype, device, snapshot, ref, n, "repeat", checks,
                 expected=first)
    # Fresh, smaller values written into B's own storage: defeats caches keyed by shape or pointer
    # and kernels that write zeros when the inputs (and so the outputs) look small.
    b64_scaled = draw_dense(rng, (k, n), dtype, scale=SCALED_CHECK_FACTOR)
    with torch.no_grad():
        B.copy_(torch.from_numpy(b64_scaled).to(dtype=tdtype))
    ref_scaled = Reference.compute(matrix, values, b64_scaled, dtype)
    _run_checked(module, packed, B, b64_scaled, (m, n), tdtype, device, snapshot, ref_scaled, n,
                 "scaled", checks)


def _run_checked(module, packed, B, b64, out_shape, tdtype, device, snapshot, ref, n, kind, checks,
                 expected=None):
    import torch

    from .execution import CandidateFailure, call_spmm

    b_before = B.detach().clone()
    out = torch.full(out_shape, float("nan"), dtype=tdtype, device=device)
    call_spmm(module, packed, B, out, device)
    _check_inputs(B, b_before, packed, snapshot, n, kind)
    if tuple(out.shape) != tuple(out_shape) or out.dtype != tdtype:
        raise CandidateFailure("wrong_result", "bad_output_shape",
                               f"N={n} ({kind}): out was resized/retyped to {tuple(out.shape)} "
                               f"{out.dtype}; expected {tuple(out_shape)} {tdtype}")
    got = out.detach().to(torch.float64).cpu().numpy()
    nan_mask = np.isnan(got)
    if nan_mask.any():
        _explain_nan(module, packed, B, out_shape, tdtype, device, nan_mask, n, kind)
    target = ref.value if expected is None else expected
    cmp = compare(got, target, ref, what="output" if expected is None else "rerun output")
    checks.append(NCheck(n=n, rel_err=_finite(cmp.rel_err), max_abs_err=_finite(cmp.max_abs_err),
                         tol=ref.rtol, ok=cmp.ok, kind=kind, tol_ratio=_finite(cmp.tol_ratio)))
    if not cmp.ok:
        if expected is not None:
            raise CandidateFailure("unstable", "nondeterministic",
                                   f"N={n}: two runs on identical inputs disagree beyond the "
                                   f"tolerance: {cmp.message}")
        failure_class = "nan_or_inf" if cmp.nonfinite else "wrong_values"
        raise CandidateFailure("wrong_result", failure_class, f"N={n} ({kind}): {cmp.message}")
    return got


def _check_inputs(B, b_before, packed, snapshot, n, kind) -> None:
    import torch

    from .execution import CandidateFailure

    problems = []
    if B.shape != b_before.shape or not torch.equal(B, b_before):
        problems.append("B")
    problems += snapshot.changed(packed)
    if problems:
        raise CandidateFailure("input_modified", "input_modified",
                               f"N={n} ({kind}): spmm modified its inputs: {', '.join(problems)}")


def _explain_nan(module, packed, B, out_shape, tdtype, device, nan_mask, n, kind) -> None:
    """NaN survived the pre-fill, or the kernel wrote NaN? Re-run with a finite sentinel to tell."""
    import torch

    from .execution import CandidateFailure, call_spmm
    from .numerics import describe_locations

    sentinel = 1234.0
    out = torch.full(out_shape, sentinel, dtype=tdtype, device=device)
    call_spmm(module, packed, B, out, device)
    got = out.detach().to(torch.float64).cpu().numpy()
    unwritten = (got == sentinel) & nan_mask
    if unwritten.any():
        raise CandidateFailure(
            "unwritten_output", "unwritten_output",
            f"N={n} ({kind}): {int(unwritten.sum())} of {unwritten.size} output entries were never "
            f"written (the pre-filled NaN survived); {describe_locations(unwritten)}")
    raise CandidateFailure("wrong_result", "nan_or_inf",
                           f"N={n} ({kind}): the kernel wrote NaN into {int(nan_mask.sum())} of "
                           f"{nan_mask.size} entries; {describe_locations(nan_mask)}")


def _finite(x: float) -> float:
    return float(x) if np.isfinite(x) else 1e300
