"""The demo's story: what SparseDitto found and did, in about ten lines a newcomer can follow.

`story(result)` reads a `Result` (and the cost model's table for its matrix, the same numbers the
planner planned from) and says: the pattern and why; the kernels the cost model ranks on the
target; each kernel tried, with its verification verdict or why it was rejected; the ones not
tried and why; what was chosen and the speedup (measured on a GPU; on the CPU an estimate from
the roofline model, labelled so); and what the memory did. `check_kernel` runs
``result.kernel(B)`` on a random B and compares it with the fp64 product (the harness's own
tolerance rule), so the demo also shows that the answer is a working kernel.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class KernelCheck:
    n: int
    max_abs_err: float
    tol_ratio: float          # worst |error| / tolerance over the output (<= 1 passes)
    ok: bool
    seconds: float


def check_kernel(result, n: int = 16, seed: int = 0) -> KernelCheck:
    """``result.kernel(B)`` for a seeded B [K, n] in the run's dtype, against the fp64 product."""
    import time

    import numpy as np
    import torch

    from sparseditto.artifacts import get_matrix
    from sparseditto.harness.numerics import Reference, compare

    A = get_matrix(result.matrix_key)
    dtype = getattr(torch, result.dtype)
    device = "cuda" if result.backend == "cuda" else "cpu"
    B = torch.randn((A.shape[1], n), generator=torch.Generator().manual_seed(seed)).to(dtype)
    started = time.perf_counter()
    C = result.kernel(B.to(device))
    seconds = time.perf_counter() - started
    values = A.data.astype(np.float64)
    ref = Reference.compute(A, values, B.double().numpy(), result.dtype)
    cmp = compare(C.double().cpu().numpy(), ref.value, ref)
    return KernelCheck(n=n, max_abs_err=cmp.max_abs_err, tol_ratio=cmp.tol_ratio, ok=cmp.ok, seconds=seconds)


def _us(ms: float | None) -> str:
    return "?" if ms is None else f"{ms * 1e3:.1f} us"


def _plan_table(result) -> tuple[list[dict], list[str]]:
    """(the cost model's table at the main N on the plan target, templates left out with why)."""
    from sparseditto.agents.costing import template_table
    from sparseditto.agents.kit import report_model
    from sparseditto.kernel_templates.registry import backend_unavailable, list_templates
    from sparseditto.targets import Target

    target = Target.model_validate(result.target["spec"])
    table, _ = template_table(result.report, result.n_values[0], result.dtype, target, exec_backend=result.backend)
    listed = {t["name"] for t in table}
    report = report_model(result.report)
    reasons: dict[str, list[str]] = {}
    for t in list_templates():
        if t.name in listed:
            continue
        dtypes, arch = t.meta.get("dtypes"), t.arch_reason(target)
        if t.backend == "cuda" and result.backend != "cuda":
            why = "CUDA C++: they need a GPU"
        elif arch:
            why = arch
        elif dtypes and result.dtype not in dtypes:
            why = f"{result.dtype} values: they take {', '.join(dtypes)}"
        elif t.backend == "cuda" and backend_unavailable("cuda"):
            why = backend_unavailable("cuda")
        else:
            why = t.applicable(report)[1]
        reasons.setdefault(why, []).append(t.name)
    left_out = [f"{', '.join(names)} ({why})" for why, names in reasons.items()]
    return sorted(table, key=lambda t: t["estimate_ms"]), left_out


def _verdict(c, gpu: bool) -> str:
    if c.status == "verified":
        v = c.verify or {}
        checks = f"{v['checks']} checks" if v.get("checks") else "checks"
        worst = f", worst error {v['worst_tol_ratio']:.2f} of the tolerance" if v.get("worst_tol_ratio") is not None else ""
        timing = (f"; {_us(c.median_ms)} vs dense {_us(c.dense_ms)} measured" if gpu and c.median_ms
                  else f"; estimated {_us(c.expected_ms)} on the target" if c.expected_ms else "")
        return f"verified ({checks} against an fp64 reference{worst}){timing}"
    what = c.failure_class or c.status
    return f"rejected, {what}: {' '.join((c.message or '').split())[:110]}"


def story(result, check: KernelCheck | None = None) -> list[tuple[str, str]]:
    """(label, text) lines of the demo's story."""
    from sparseditto.analysis import PatternReport

    report = PatternReport.model_validate(result.report)
    gpu = result.timings_are_gpu
    target = result.target.get("name")
    m, k = result.shape
    lines = [("matrix", f"{result.matrix_name}: {m} x {k} {result.dtype} weight, {report.sparsity:.1%} sparse; "
                        f"C = A @ B with N = {result.n_values[0]}; planned for {target}"
                        + ("" if gpu else " (no GPU here: kernels run in the Triton interpreter)")),
             ("pattern", f"{report.pattern} (confidence {report.confidence:.2f}): {report.explain()}")]

    table, left_out = _plan_table(result)
    dense = next((t for t in table if t["name"] == "dense"), None)
    ranked = ", ".join(f"{t['name']} {_us(t['estimate_ms'])}" for t in table[:6])
    lines.append(("plan", f"roofline model on {target}: {ranked}" + ("" if dense in table[:6] else
                                                                         f", ..., dense {_us(dense['estimate_ms'])}"
                                                                         if dense else "")))
    vendors = [c for c in result.candidates if c.origin == "vendor"]
    for c in (c for c in result.candidates if c.origin != "vendor"):
        lines.append(("tried", f"{c.template}" + (f" (attempt {c.attempt})" if c.attempt > 1 else "")
                               + (" from memory" if c.origin == "memory" else "") + f": {_verdict(c, gpu)}"))
    if vendors:
        lines.append(("vendors", ", ".join(f"{c.template} {c.status}" for c in vendors)
                      + ": the libraries a user could call, verified and timed as candidates too"
                      + ("" if gpu else " (CPU timings here: only dense competes, by its cost-model estimate)")))
    tried = {c.template for c in result.candidates}
    untried = [t["name"] for t in table if t["name"] not in tried and t["name"] != "dense"]
    if untried:
        why = result.stop_reason or "the planner stopped"
        lines.append(("not tried", f"{', '.join(untried)}: {why}"))
    if left_out:
        lines.append(("left out", "; ".join(left_out)))

    b = result.best
    if b.template == "dense":
        lines.append(("chosen", f"dense (cuBLAS): {b.reason}"))
    elif b.origin == "vendor":
        lines.append(("chosen", f"{result.vendor_line()}; {b.reason}"))
    else:
        speed = result.speedups.get("dense")
        if speed is None:
            gain = "no speedup figure"
        elif result.speedups_are_estimates:
            gain = (f"estimated {speed:.2f}x faster than dense cuBLAS on {target} (the roofline model's estimate: "
                    "CPU timings are no GPU timings)")
        else:
            gain = f"{speed:.2f}x faster than dense cuBLAS, measured on {result.target.get('measured_on')}"
        lines.append(("chosen", f"{b.template}: {gain}"))
        vendors = {name: v for name, v in result.speedups.items() if name != "dense"}
        if vendors:
            lines.append(("vs vendors", ", ".join(f"{v:.2f}x vs {name}" for name, v in vendors.items())))
    lines.append(("memory", result.memory_line()))
    if check is not None:
        verdict = "matches" if check.ok else "DOES NOT match"
        lines.append(("check", f"result.kernel(B) with a random B [{k} x {check.n}] {verdict} the fp64 product: "
                               f"max |error| {check.max_abs_err:.2g}, {check.tol_ratio:.2f} of the tolerance "
                               f"({check.seconds:.1f} s)"))
    lines.append(("policy", f"{result.policy_label}; {result.candidate_counts() or 'no candidates'}; "
                            f"{result.wall_seconds:.1f} s"))
    return lines
