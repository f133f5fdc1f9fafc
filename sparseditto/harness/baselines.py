"""Vendor and library baselines a generated kernel must beat, measured in the candidate's process.

* ``cublas_dense``        torch.matmul on the densified A (cuBLAS; the floor every candidate faces)
* ``cusparse_csr_torch``  torch CSR tensor @ B (cuSPARSE SpMM)
* ``cusparse_csr_cupy``   cupyx.scipy.sparse.csr_matrix @ cupy array (cuSPARSE through CuPy, DLPack)
* ``cusparselt_2to4``     torch.sparse.to_sparse_semi_structured (cuSPARSELt/CUTLASS 2:4), only for
                          matrices that are exactly 2:4 along rows, fp16/bf16, sm80+
* ``triton_bsr_torch``    torch.sparse._triton_ops.bsr_dense_mm on a BSR tensor (block 16/32/64)

A baseline that cannot run (unsupported dtype, no GPU, wrong pattern, library missing) is kept with
``ok=False`` and the reason, never dropped, so a report always says why a number is missing. Each
baseline's output is checked against the fp64 reference once before timing: a fast wrong baseline
would make every candidate look slow. On the interpreter backend only the CPU-capable ones run
(torch dense and torch CSR) and their timings are wall clock, not GPU.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np

from .results import BaselineTiming
from .vendor_kernels import BY_BASELINE, VendorUnavailable, choose_bsr_block, is_2to4_rows  # noqa: F401

BASELINE_NAMES = tuple(BY_BASELINE)   # cublas_dense, cusparse_csr_torch, cusparse_csr_cupy, cusparselt_2to4, triton_bsr_torch
CPU_BASELINES = tuple(name for name, k in BY_BASELINE.items() if k.runs_on_cpu)


# The conversions live in vendor_kernels (one copy: a vendor path is also a candidate kernel).
BaselineUnavailable = VendorUnavailable


def _builder(name: str):
    """(run() -> output tensor, note) for baseline ``name``: the vendor kernel's prepare once, then
    its ``apply`` (the call a user would write); raises BaselineUnavailable when it cannot run."""
    kernel = BY_BASELINE[name]

    def build(ctx) -> tuple[Callable, str | None]:
        why = kernel.unavailable(ctx["matrix"], ctx["dtype"], "cuda" if ctx["device"] == "cuda" else "interpret")
        if why:
            raise BaselineUnavailable(why)
        packed = kernel.prepare(ctx["matrix"], ctx["tdtype"], ctx["device"])
        B = ctx["B"]
        return (lambda: kernel.apply(packed, B)), packed.get("note")

    return build


BUILDERS = {name: _builder(name) for name in BASELINE_NAMES}


def check_names(include) -> tuple[str, ...]:
    names = tuple(include) if include is not None else BASELINE_NAMES
    unknown = [n for n in names if n not in BUILDERS]
    if unknown:
        raise ValueError(f"Unknown baseline(s) {unknown}; expected names from {BASELINE_NAMES}.")
    return names


def measure_baselines(matrix, B, dtype: str, backend: str, *, ref=None, repeats: int = 50,
                      warmup: int = 5, include=None, graph: bool = False,
                      fresh: "FreshInputs | None" = None) -> list[BaselineTiming]:
    """Time each baseline on (matrix, B) in this process. Runs in the worker.

    ``matrix`` carries the values to use (already rounded to ``dtype``); ``ref`` (a
    numerics.Reference for the same A and B) enables the correctness check of each baseline.
    ``graph`` also times each call replayed from a CUDA graph (GPU only; a capture failure is a
    note, the eager timing stays). ``fresh`` (a `FreshInputs`) re-checks each timed baseline after
    timing, rebuilt on a fresh B, against a new fp64 reference: the same check the chosen kernel
    gets, so that every number a report compares comes from a kernel verified after timing.
    """
    import torch

    from .numerics import compare, torch_dtype
    from .timing import time_cuda_graph, time_fn

    names = check_names(include)
    device = "cuda" if backend == "cuda" else "cpu"
    ctx = {"matrix": matrix, "B": B, "dtype": dtype, "tdtype": torch_dtype(dtype), "device": device}
    results = []
    for name in names:
        if device != "cuda" and name not in CPU_BASELINES:
            results.append(BaselineTiming(name=name, ok=False, error="needs a CUDA GPU (interpreter backend)"))
            continue
        try:
            run, note = BUILDERS[name](ctx)
            first = run()
            if device == "cuda":
                torch.cuda.synchronize()
            if ref is not None:
                got = _as_dense_tensor(first)
                cmp = compare(got.to(torch.float64).cpu().numpy(), ref.value, ref, what=name)
                if not cmp.ok:
                    results.append(BaselineTiming(name=name, ok=False, note=note,
                                                  error=f"output disagrees with the fp64 reference: {cmp.message}"))
                    continue
            timing = time_fn(run, backend, repeats=repeats, warmup=warmup)
            graph_timing = None
            if graph and device == "cuda":
                try:
                    graph_timing = time_cuda_graph(run, repeats=repeats, warmup=warmup)
                except Exception as exc:
                    torch.cuda.synchronize()
                    note = "; ".join(x for x in (note, f"CUDA graph capture failed, eager timing only: "
                                                       f"{type(exc).__name__}: {str(exc)[:200]}") if x)
            entry = BaselineTiming(name=name, ok=True, timing=timing, graph_timing=graph_timing, note=note)
            if fresh is not None:
                entry.rechecked, entry.recheck_message = fresh.check(name)
            results.append(entry)
        except BaselineUnavailable as exc:
            results.append(BaselineTiming(name=name, ok=False, error=str(exc)))
        except Exception as exc:  # a library refusing this shape/dtype is a result, not a crash
            results.append(BaselineTiming(name=name, ok=False, error=f"{type(exc).__name__}: {str(exc)[:400]}"))
        finally:
            if device == "cuda":
                torch.cuda.empty_cache()
    return results


class FreshInputs:
    """A fresh B (and its fp64 reference, computed once, on first use) for re-checking baselines
    after timing. ``matrix`` carries the dtype-rounded values the baselines were timed with."""

    def __init__(self, matrix, B, dtype: str, seed: int) -> None:
        from .numerics import torch_dtype

        device = "cuda" if B.is_cuda else "cpu"
        self.ctx = {"matrix": matrix, "B": B, "dtype": dtype, "tdtype": torch_dtype(dtype), "device": device}
        self.seed = seed
        self._fresh = None

    def _inputs(self):
        if self._fresh is None:
            import torch

            from .numerics import Reference, draw_dense

            matrix, B = self.ctx["matrix"], self.ctx["B"]
            b64 = draw_dense(np.random.default_rng([self.seed, 1]), tuple(B.shape), self.ctx["dtype"])
            fresh_b = torch.from_numpy(b64).to(device=B.device, dtype=B.dtype)
            ref = Reference.compute(matrix, matrix.data.astype(np.float64), b64, self.ctx["dtype"])
            self._fresh = (fresh_b, ref)
        return self._fresh

    def check(self, name: str) -> tuple[bool, str]:
        import torch

        from .numerics import compare

        try:
            fresh_b, ref = self._inputs()
            run, _ = BUILDERS[name](dict(self.ctx, B=fresh_b))
            if self.ctx["device"] == "cuda":
                torch.cuda.synchronize()
            got = _as_dense_tensor(run())
            cmp = compare(got.to(torch.float64).cpu().numpy(), ref.value, ref, what=f"{name} (fresh B)")
        except Exception as exc:
            return False, f"re-check on a fresh B failed to run: {type(exc).__name__}: {str(exc)[:300]}"
        if not cmp.ok:
            return False, cmp.message
        return True, f"rebuilt on a fresh B after timing: within tolerance (worst {cmp.tol_ratio:.2f} of it)"


def _as_dense_tensor(x):
    import torch

    if not isinstance(x, torch.Tensor):  # a CuPy array
        x = torch.from_dlpack(x)
    return x.to_dense() if x.layout != torch.strided else x


def baselines_task(payload: dict, wctx=None) -> list[dict]:
    """Worker entry for `run_baselines`: the matrix's own values, a seeded B."""
    import torch

    from .numerics import Reference, draw_dense, round_to_dtype, torch_dtype, with_values

    matrix, n, dtype, backend = payload["matrix"], payload["n"], payload["dtype"], payload["backend"]
    device = "cuda" if backend == "cuda" else "cpu"
    rng = np.random.default_rng(payload["seed"])
    values = round_to_dtype(matrix.data, dtype)
    a = with_values(matrix, values, dtype)
    b64 = draw_dense(rng, (matrix.shape[1], n), dtype)
    B = torch.from_numpy(b64).to(device=device, dtype=torch_dtype(dtype))
    ref = Reference.compute(matrix, values, b64, dtype)
    out = measure_baselines(a, B, dtype, backend, ref=ref, repeats=payload["repeats"],
                            warmup=payload["warmup"], include=payload["include"])
    return [r.model_dump() for r in out]


def run_baselines(matrix, n: int, dtype: str = "float16", *, backend: str = "auto", repeats: int = 50,
                  warmup: int = 5, include=None, seed: int = 0, timeout: float = 600.0,
                  pool=None) -> list[BaselineTiming]:
    """Measure the baselines for ``matrix`` @ B[K, n] in a sandboxed worker; never raises for a
    failing library: a worker crash or timeout marks every requested baseline as failed."""
    from .numerics import check_dtype
    from .sandbox import get_pool, resolve_backend
    from .timing import check_repeats
    from .verify import check_matrix

    check_matrix(matrix)
    if int(n) <= 0:
        raise ValueError(f"Expected a positive N, got {n!r}.")
    check_dtype(dtype)
    check_repeats(repeats, warmup)
    names = check_names(include)
    exec_backend = resolve_backend(backend)
    payload = {"matrix": matrix, "n": int(n), "dtype": dtype, "backend": exec_backend,
               "repeats": int(repeats), "warmup": int(warmup), "include": names, "seed": int(seed)}
    start = time.perf_counter()
    reply = get_pool(pool).call("baselines", payload, backend=exec_backend, timeout=timeout)
    if reply.status == "ok":
        return [BaselineTiming(**r) for r in reply.value]
    reason = reply.error.strip().splitlines()[-1] if reply.error.strip() else reply.status
    reason = f"baseline worker {reply.status} after {time.perf_counter() - start:.1f} s: {reason}"
    return [BaselineTiming(name=name, ok=False, error=reason) for name in names]
