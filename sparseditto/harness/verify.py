"""Run a candidate in the sandbox and prove it computes A @ B (`run_and_verify`).

Verification a kernel cannot recognise. Every verification draws a fresh seed from
``os.urandom`` (recorded in the result: pass it back as ``seed=`` to reproduce a failure). The
harness verifies every N the caller asks for plus odd ones (`verification_ns`: 1 and 3 always,
17 and 129 on a GPU), and for each N the worker:

1. draws fresh values for A's nonzeros on the same pattern and calls ``prepare`` on them: once for
   the first N and once more, on a second independent draw, for all the other N values (so a
   prepare that hands back what an earlier one packed, e.g. cached by pattern, is caught; a
   prepare per N cost seconds each on LLM weights: 66 s of a 125 s run_graph on the H200);
2. "base": a fresh B (at a fresh address) from one of several distributions (`numerics.DISTRIBUTIONS`:
   uniform, normal times a large scale, heavy-tailed, all above 1, tiny), an output pre-filled
   with NaN (so unwritten entries show) or with random garbage (so a kernel cannot tell a
   verification from real use by its output buffer), then ``spmm`` under op/launch tracing;
3. "refill": fresh values from another distribution written into B's own storage (defeats
   caches keyed by shape or pointer, and kernels that write zeros for small inputs);
4. on the first N also "repeat" (identical inputs again: a deterministic-enough kernel agrees
   with itself) and "perturb" (random interior entries of B changed in place, corners kept:
   defeats caches keyed by a few sampled values).

Before every call the packed dict's ``scratch*`` entries are reset to what ``prepare`` returned;
after it, B, the packed dict (structure, bytes, tensor attributes) and the candidate module's
globals must be unchanged. The fp64 reference of a call is computed only after the call has
returned, so it never exists while candidate code runs. Static checks run first (in the caller's
process); the rest happens in the sandboxed worker, so crashes, hangs and poisoned CUDA contexts
come back as "crash"/"timeout" instead of killing the caller.
"""
from __future__ import annotations

import os
import time

import numpy as np

from . import gpu_lock
from .candidate_spec import as_spec
from .numerics import DISTRIBUTIONS, Reference, check_dtype, compare, draw_b, draw_matrix_values, \
    round_to_dtype, torch_dtype, with_values
from .results import NCheck, VerifyResult
from .sandbox import WorkerReply, get_pool, resolve_backend
from .static_checks import check_source

#: Odd N values verified besides the requested ones (tails and masks are where kernels break);
#: the larger ones only on a GPU, where they cost microseconds instead of interpreter seconds.
EXTRA_N = {"interpret": (1, 3), "cuda": (1, 3, 17, 129)}
MAX_N = 1 << 20


def fresh_seed() -> int:
    """A verification seed nobody can predict (63 bits from the OS)."""
    return int.from_bytes(os.urandom(8), "little") >> 1


def verification_ns(n_values, backend: str) -> tuple[int, ...]:
    """The requested N values plus the odd ones of `EXTRA_N`, sorted and unique."""
    return tuple(sorted(set(int(n) for n in n_values) | set(EXTRA_N.get(backend, (1, 3)))))


def check_matrix(matrix) -> None:
    for attr in ("indptr", "indices", "data", "shape", "row_lengths"):
        if not hasattr(matrix, attr):
            raise ValueError(f"Expected a sparseditto.matrix.SparseMatrix, got {type(matrix).__name__} "
                             f"(missing '{attr}'); convert with sparseditto.io.load_matrix first.")


def check_n_values(n_values) -> tuple[int, ...]:
    try:
        values = tuple(n for n in n_values)
    except TypeError:
        raise ValueError(f"Expected an iterable of positive ints for n_values, got {n_values!r}.") from None
    if not values or any(n <= 0 for n in values if isinstance(n, (int, np.integer))):
        raise ValueError(f"Expected at least one positive N in n_values, got {n_values!r}.")
    for n in values:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise ValueError(f"Expected integer N values (columns of B), got {n!r} in {n_values!r}.")
        if n > MAX_N:
            raise ValueError(f"N = {n} is larger than the supported maximum of {MAX_N} columns of B.")
    return tuple(int(n) for n in values)


def check_seed(seed) -> int | None:
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"Expected seed to be a non-negative int (or None for a fresh one), got {seed!r}.")
    return int(seed)


def run_and_verify(candidate, matrix, *, n_values=(1, 7, 16), dtype: str = "float16",
                   backend: str = "auto", seed: int | None = None, timeout: float = 120.0, pool=None,
                   check_static: bool = True, extra_ns: bool = True) -> VerifyResult:
    """Verify ``candidate`` (a Candidate or source text) on ``matrix``'s pattern.

    ``seed=None`` (the default) draws a fresh seed; an int reproduces a recorded verification.
    ``extra_ns=False`` verifies exactly ``n_values`` (used when an N is verified on first use).
    ``check_static=False`` skips the AST checks; it exists for trusted code and for testing the
    sandbox itself, never for generated kernels.
    """
    check_matrix(matrix)
    n_values = check_n_values(n_values)
    check_dtype(dtype)
    seed = check_seed(seed)
    seed = fresh_seed() if seed is None else seed
    spec = as_spec(candidate)
    exec_backend = resolve_backend(backend)
    start = time.perf_counter()
    common = dict(backend=exec_backend, gpu_timings=exec_backend == "cuda", seed=seed)
    ns = verification_ns(n_values, exec_backend) if extra_ns else n_values
    if check_static and not spec.is_builtin:
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
    payload = {"spec": spec, "matrix": matrix, "n_values": ns, "dtype": dtype, "seed": int(seed),
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

def verify_task(payload: dict, wctx) -> dict:
    """Worker entry: the full verification protocol; returns VerifyResult as a dict."""
    from .execution import CandidateFailure, failure_from_exception, load_candidate
    from .worker import is_sticky_cuda_error

    spec, matrix, dtype = payload["spec"], payload["matrix"], payload["dtype"]
    backend = payload["backend"]
    if backend == "cuda":
        gpu_lock.for_current_device()   # opened now, before any candidate scope (gpu_lock's docstring)
    start = time.perf_counter()
    checks: list[NCheck] = []
    common = dict(backend=backend, gpu_timings=backend == "cuda", seed=payload["seed"],
                  sandbox=wctx.info.get("sandbox", {}))
    rng = np.random.default_rng(payload["seed"])
    try:
        module = load_candidate(spec, wctx)
        order = rng.permutation(len(DISTRIBUTIONS))
        for i, n in enumerate(payload["n_values"]):
            if i <= 1:   # two prepares per verification (the module doc): the first N's, then the others'
                run = _Run(module, matrix, n, dtype, backend, wctx, seed=payload["seed"])
                run.prepare(draw_matrix_values(matrix, rng, dtype))
            run.n = n
            _verify_one_n(run, matrix, dtype, rng, checks, first=i == 0,
                          dists=(DISTRIBUTIONS[order[(2 * i) % len(order)]], DISTRIBUTIONS[order[(2 * i + 1) % len(order)]]),
                          garbage_prefill=bool(i % 2))
    except CandidateFailure as failure:
        return VerifyResult(ok=False, status=failure.status, failure_class=failure.failure_class,
                            message=f"{failure.message} [verification seed {payload['seed']}]", checks=checks,
                            log=failure.log, seconds=time.perf_counter() - start, **common).model_dump()
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
                        message=f"verified N={list(payload['n_values'])} in {dtype} (seed {payload['seed']})",
                        checks=checks, seconds=time.perf_counter() - start, **common).model_dump()


class _Run:
    """What the checks of the N values it serves share: the prepared candidate, its snapshot, the
    fresh inputs (``n``: the N being checked)."""

    def __init__(self, module, matrix, n, dtype, backend, wctx, seed: int = 0):
        import torch

        from .execution import Snapshot, call_prepare, device_for, run_candidate

        self.module, self.matrix, self.n, self.dtype, self.wctx = module, matrix, n, dtype, wctx
        self.device = device_for(backend)
        self.tdtype = torch_dtype(dtype)
        self.torch = torch
        self.keep: list = []   # every B stays alive: the next fresh B gets a fresh address
        self.m, self.k = matrix.shape
        self.packed = None
        self.snapshot = None
        self._prepare = call_prepare
        self._run_candidate = run_candidate
        self._snapshot_cls = Snapshot
        # The garbage prefill draws from a generator of its own, never torch's default one: a CUDA
        # graph capture that fails inside a library (cupyx's cuSPARSE did, timing a vendor path)
        # leaves the default generator registered with the dead capture, and every later draw from
        # it raises "Offset increment outside graph capture encountered unexpectedly" (H200, session
        # 28: cuSPARSELt 2:4 and torch's Triton BSR were recorded as runtime errors that way).
        self._gen = torch.Generator(device=self.device)
        self._gen.manual_seed(int(seed) ^ 0x5EED)

    def prepare(self, values):
        a_test = with_values(self.matrix, values, self.dtype)
        self.values = values
        self.packed = self._prepare(self.module, a_test, self.dtype, self.device, self.wctx)
        # Looking at candidate-made objects can run candidate code (properties, __repr__): gated.
        self.snapshot = self._run_candidate(self.wctx, "state snapshot", self._snapshot_cls.take, self.packed,
                                            getattr(self.module, "module", None))

    def _reference(self, b64):
        """The fp64 reference for B = ``b64``: the "repeat" call runs the B of the call before it
        (same values), so that one product serves both."""
        last = getattr(self, "_last_ref", None)
        if last is not None and last[0] is b64 and last[1] is self.values:
            return last[2]
        ref = Reference.compute(self.matrix, self.values, b64, self.dtype)
        self._last_ref = (b64, self.values, ref)
        return ref

    def fresh_b(self, b64):
        B = self.torch.from_numpy(b64).to(device=self.device, dtype=self.tdtype)
        self.keep.append(B)
        return B

    def call(self, B, b64, kind: str, checks: list, *, garbage_prefill: bool, dist: str, expected=None):
        from .execution import CandidateFailure, call_spmm

        torch = self.torch
        with gpu_lock.shared_section():   # beside other processes' verifications, never during a timing
            b_before = B.detach().clone()
            out = self._prefilled(garbage_prefill)
            self.snapshot.reset_scratch(self.packed)
            call_spmm(self.module, self.packed, B, out, self.device, self.wctx,
                      source=getattr(self.module, "source", ""))
            self._check_state(B, b_before, out, kind)
            if tuple(out.shape) != (self.m, self.n) or out.dtype != self.tdtype:
                raise CandidateFailure("wrong_result", "bad_output_shape",
                                       f"N={self.n} ({kind}): out was resized/retyped to {tuple(out.shape)} "
                                       f"{out.dtype}; expected {(self.m, self.n)} {self.tdtype}")
            got = out.detach().to(torch.float64).cpu().numpy()
        ref = self._reference(b64)   # only now: after the call
        if not garbage_prefill:
            nan_mask = np.isnan(got)
            if nan_mask.any():
                self._explain_nan(B, nan_mask, kind)
        target = ref.value if expected is None else expected
        cmp = compare(got, target, ref, what="output" if expected is None else "rerun output")
        checks.append(NCheck(n=self.n, rel_err=_finite(cmp.rel_err), max_abs_err=_finite(cmp.max_abs_err),
                             tol=ref.rtol, ok=cmp.ok, kind=kind, tol_ratio=_finite(cmp.tol_ratio), dist=dist,
                             prefill="garbage" if garbage_prefill else "nan"))
        if not cmp.ok:
            if expected is not None:
                raise CandidateFailure("unstable", "nondeterministic",
                                       f"N={self.n}: two runs on identical inputs disagree beyond the "
                                       f"tolerance: {cmp.message}")
            failure_class = "nan_or_inf" if cmp.nonfinite else "wrong_values"
            raise CandidateFailure("wrong_result", failure_class,
                                   f"N={self.n} ({kind}, B {dist}, out pre-filled with "
                                   f"{'garbage' if garbage_prefill else 'NaN'}): {cmp.message}")
        return got

    def _prefilled(self, garbage: bool):
        torch = self.torch
        if not garbage:
            return torch.full((self.m, self.n), float("nan"), dtype=self.tdtype, device=self.device)
        return (torch.rand((self.m, self.n), dtype=torch.float32, device=self.device, generator=self._gen) * 200
                - 100).to(self.tdtype)

    def _check_state(self, B, b_before, out, kind: str) -> None:
        from .execution import CandidateFailure

        torch = self.torch
        if type(B) is not torch.Tensor or type(out) is not torch.Tensor:
            raise CandidateFailure("refused", "state_carried", f"N={self.n} ({kind}): spmm changed the class of "
                                                             f"B or out")
        if vars(B) or vars(out):
            raise CandidateFailure("refused", "state_carried", f"N={self.n} ({kind}): spmm set attributes on B or "
                                                             f"out ({sorted(vars(B)) + sorted(vars(out))})")
        problems = []
        if B.shape != b_before.shape or not torch.equal(B, b_before):
            problems.append("B")
        problems += self._run_candidate(self.wctx, "state check", self.snapshot.changed, self.packed,
                                        getattr(self.module, "module", None))
        if problems:
            carried = [p for p in problems if p != "B" and "contents changed" not in p]
            if carried:
                raise CandidateFailure("refused", "state_carried",
                                       f"N={self.n} ({kind}): spmm kept state between calls: {', '.join(carried[:5])} "
                                       f"(only packed['scratch'] may change, and it is reset before every "
                                       f"verification call)")
            raise CandidateFailure("input_modified", "input_modified",
                                   f"N={self.n} ({kind}): spmm modified its inputs: {', '.join(problems[:5])}")

    def _explain_nan(self, B, nan_mask, kind) -> None:
        """NaN survived the pre-fill, or the kernel wrote NaN? Re-run with a finite sentinel to tell."""
        from .execution import CandidateFailure, call_spmm
        from .numerics import describe_locations

        torch = self.torch
        sentinel = 1234.0
        out = torch.full((self.m, self.n), sentinel, dtype=self.tdtype, device=self.device)
        self.snapshot.reset_scratch(self.packed)
        call_spmm(self.module, self.packed, B, out, self.device, self.wctx, source=getattr(self.module, "source", ""))
        got = out.detach().to(torch.float64).cpu().numpy()
        unwritten = (got == sentinel) & nan_mask
        if unwritten.any():
            raise CandidateFailure(
                "unwritten_output", "unwritten_output",
                f"N={self.n} ({kind}): {int(unwritten.sum())} of {unwritten.size} output entries were never "
                f"written (the pre-filled NaN survived); {describe_locations(unwritten)}")
        raise CandidateFailure("wrong_result", "nan_or_inf",
                               f"N={self.n} ({kind}): the kernel wrote NaN into {int(nan_mask.sum())} of "
                               f"{nan_mask.size} entries; {describe_locations(nan_mask)}")


def _verify_one_n(run: "_Run", matrix, dtype: str, rng: np.random.Generator,
                  checks: list[NCheck], *, first: bool, dists, garbage_prefill: bool) -> None:
    """One N's calls on an already prepared ``run`` (N is ``run.n``)."""
    k, n = matrix.shape[1], run.n
    base_dist, refill_dist = dists
    b64 = draw_b(rng, (k, n), dtype, base_dist, matrix)
    B = run.fresh_b(b64)
    run.call(B, b64, "base", checks, garbage_prefill=garbage_prefill, dist=base_dist)
    # Fresh values written into B's own storage: same pointer, same shape, new contents.
    b64 = draw_b(rng, (k, n), dtype, refill_dist, matrix)
    with run.torch.no_grad():
        B.copy_(run.torch.from_numpy(b64).to(dtype=run.tdtype))
    got = run.call(B, b64, "refill", checks, garbage_prefill=not garbage_prefill, dist=refill_dist)
    if not first:
        return
    run.call(B, b64, "repeat", checks, garbage_prefill=garbage_prefill, dist=refill_dist, expected=got)
    # A few interior entries change, the corners and most values stay: a cache keyed on samples
    # of B (corners, a checksum of a stride) returns the stale answer.
    b64 = b64.copy()
    rows = rng.choice(k, size=max(1, min(k, 3)), replace=False)
    cols = rng.integers(0, n, size=rows.size)
    inner = (rows > 0) & (rows < k - 1) if k > 2 else np.ones(rows.size, bool)
    rows, cols = (rows[inner], cols[inner]) if inner.any() else (rows, cols)
    b64[rows, cols] = round_to_dtype(draw_b(rng, (rows.size, 1), dtype, "uniform", matrix)[:, 0] + 1.5, dtype)
    with run.torch.no_grad():
        B.copy_(run.torch.from_numpy(b64).to(dtype=run.tdtype))
    run.call(B, b64, "perturb", checks, garbage_prefill=garbage_prefill, dist="perturbed")


def _finite(x: float) -> float:
    return float(x) if np.isfinite(x) else 1e300
