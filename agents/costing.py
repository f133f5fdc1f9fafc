"""What the roofline cost model says about this matrix: the table the planner plans from.

The planner hands the policy every applicable template with its estimate at the main N (the best
of a small parameter grid); finalize compares verified kernels with dense on the same table when
there are no GPU timings; the profiler states a measured kernel's % of its roofline. All three read
the estimates here, so they can never disagree about a number.
"""
from __future__ import annotations

import json
import threading
from typing import Any

from sparseditto.agents.kit import emit, measured_target, plan_target, report_model
from sparseditto.agents.records import params_key
from sparseditto.agents.state import Context, main_n, resolved_backend

GRID_LIMIT = 6

_TABLE_CACHE: dict[tuple, tuple[list[dict], float | None]] = {}
_TABLE_LOCK = threading.Lock()


def template_table(report: dict, n: int, dtype: str, target, measure_target=None,
                   exec_backend: str = "cuda") -> tuple[list[dict], float | None]:
    """Applicable templates with roofline estimates at N on `target`, best grid point first.

    Returns (table, roofline_ms): roofline_ms is the best estimate of any applicable format,
    including dense, on the GPU that measures (the plan target when nothing measures). The dense
    entry carries ``builtin: True``. On the interpreter (``exec_backend='interpret'``) CUDA C++
    templates are left out: they cannot run there (`runnable_templates` also leaves them out where
    CuPy cannot be imported), and so is a template that cannot run on `target` or `measure_target`
    (`arch_exclusions`: the tensor-core tier needs a Hopper GPU). Cached per (signature, N, dtype, targets).
    """
    key = (report.get("signature"), report.get("shape") and tuple(report["shape"]), n, dtype, target.name,
           measure_target.name if measure_target is not None else None, exec_backend)
    with _TABLE_LOCK:
        hit = _TABLE_CACHE.get(key)
    if hit is not None:
        return json.loads(json.dumps(hit[0])), hit[1]
    from sparseditto.kernel_templates.registry import list_templates

    rep = report_model(report)
    table: list[dict] = []
    roof_ms: float | None = None
    left_out = arch_exclusions(target, measure_target)
    for t in list_templates():
        if t.backend == "cuda" and exec_backend != "cuda":
            continue
        if t.name in left_out:
            continue   # cannot compile for the GPU planned for or the one that runs it
        if t.meta.get("dtypes") and dtype not in t.meta["dtypes"]:
            continue   # e.g. the tensor-core decode tier runs fp16/bf16 only
        ok, reason = t.applicable(rep)
        if not ok:
            continue
        builtin = t.backend == "builtin"
        entry: dict[str, Any] = {
            "name": t.name, "backend": t.backend, "format": t.format, "description": t.description,
            "applicable_reason": reason, "patterns": list(t.patterns),
            "params": {k: list(v) for k, v in t.params.items()}, "default_params": dict(t.defaults),
            "builtin": builtin,
        }
        points = []
        for params in t.param_grid(rep, n, target, limit=GRID_LIMIT) if not builtin else [{}]:
            est = t.cost(rep, n, dtype, target, params)
            points.append({"params": dict(params), "estimate_ms": est.seconds * 1e3, "bound": est.bound,
                           "bytes": float(est.bytes), "unit": est.unit})
        points = ranked_points(points)
        best = points[0]
        entry.update(estimate_ms=best["estimate_ms"], bound=best["bound"], bytes=best["bytes"], unit=best["unit"],
                     grid=[{k: v for k, v in p.items() if k != "unit"} for p in points])
        if measure_target is not None:
            on_gpu = t.cost(rep, n, dtype, measure_target, best["params"]).seconds * 1e3
        else:
            on_gpu = best["estimate_ms"]
        roof_ms = on_gpu if roof_ms is None else min(roof_ms, on_gpu)
        table.append(entry)
    with _TABLE_LOCK:
        _TABLE_CACHE[key] = (json.loads(json.dumps(table)), roof_ms)
    return table, roof_ms


GRID_TIE = 0.03   # estimates this close are a tie the planning module's own order breaks


def ranked_points(points: list[dict]) -> list[dict]:
    """A template's grid points, lowest estimate first, except that the planning module's earliest
    proposal within GRID_TIE of the lowest estimate goes first: its order is a measured best guess,
    and the cost model cannot tell points apart that closely. delta_spmv's 16 lanes are estimated
    1-2% under its default (less padding), so the expert planned them first at N = 1; on the H200
    (session 39's llm suite) the default won all four unstructured N = 1 cases where delta_spmv won,
    at rank 2-3 (`chosen.winner_rank`)."""
    if not points:
        return points
    low = min(p["estimate_ms"] for p in points)
    first = next(p for p in points if p["estimate_ms"] <= low * (1.0 + GRID_TIE))
    rest = sorted((p for p in points if p is not first), key=lambda p: p["estimate_ms"])
    return [first] + rest


def runnable_templates(table: list[dict], exec_backend: str, *, announce: bool = False) -> list[dict]:
    """The table without the templates this environment cannot run: the CUDA C++ ones launch through
    CuPy, an optional extra, and would all fail to compile without it. ``announce`` says so as a
    progress line (the planner's first visit). The table itself stays what the cost model says, so
    planning for a GPU can be studied on any machine."""
    from sparseditto.kernel_templates.registry import backend_unavailable

    missing = backend_unavailable("cuda") if exec_backend == "cuda" else None
    if not missing or not any(t["backend"] == "cuda" for t in table):
        return table
    if announce:
        emit("planner", f"CUDA C++ templates left out: {missing}")
    return [t for t in table if t["backend"] != "cuda"]


def arch_exclusions(target, measure_target=None) -> dict[str, str]:
    """{template: why} for the templates `template_table` leaves out because they cannot run on the GPU
    planned for (``target``) or on the one that measures (``measure_target``): a kernel chosen for an
    A100 must compile for an A100. The planner names them on its first visit."""
    from sparseditto.kernel_templates.registry import list_templates

    gpus = [g for g in (target, measure_target) if g is not None]
    out = {}
    for t in list_templates():
        reasons = [r for r in (t.arch_reason(g) for g in gpus) if r]
        if reasons:
            out[t.name] = reasons[0]
    return out


def exact_hit_usable(exact: dict, ctx: Context) -> bool:
    """Whether a stored run's answer (same pattern, N range, dtype and measuring GPU) may settle this run
    as an exact hit: its kernel can run on this run's target, and its target allowed every template this
    one allows. The memory is keyed by the GPU that measured, not the target: a run for an A100 on an H200
    never tried the Hopper-only tier (`costing.arch_exclusions`), so its answer must not end a later search
    for the H200 on that GPU (its kernel still comes back as the nearest neighbour, tried first), and an
    H200 run's tc_words is no answer for an A100. On the interpreter no CUDA template runs either way."""
    from sparseditto.targets import get_target

    if resolved_backend(ctx) != "cuda":
        return True
    target, _ = plan_target(ctx)
    measuring = measured_target(ctx)
    left_out = set(arch_exclusions(target, measuring))
    if exact.get("template") in left_out:
        return False
    stored = exact.get("target")
    if not stored or stored == target.name:
        return True
    try:
        before = get_target(stored)
    except ValueError:     # a detected GPU outside the table: only the same target is known to match
        return False
    return set(arch_exclusions(before, measuring)) <= left_out


def arch_note(target, local) -> str | None:
    """The Result's note when planning for an older GPU than the one that runs the search (the Python
    API plans for an A100 unless told): the templates left out for ``target`` alone, and how to plan
    for ``local`` instead. None when nothing is left out for that reason."""
    if local is None or local.name == target.name:
        return None
    only = sorted(set(arch_exclusions(target)) - set(arch_exclusions(local)))
    if not only:
        return None
    cc = ".".join(str(x) for x in target.compute_capability)
    return (f"planned for {target.name} (compute capability {cc}), so {', '.join(only)} were left out, though "
            f"this {local.name} runs them: target='auto' plans for this GPU")


def arch_exclusion_line(left_out: dict[str, str]) -> str:
    """`arch_exclusions` as one line: the templates grouped by reason."""
    groups: dict[str, list[str]] = {}
    for name, reason in left_out.items():
        groups.setdefault(reason, []).append(name)
    return "; ".join(f"{', '.join(sorted(names))} ({reason})" for reason, names in groups.items())


def template_estimate(table: list[dict], template: str, params: dict) -> float | None:
    """The table's estimate for this exact parameter set, else the template's best estimate."""
    for t in table:
        if t["name"] != template:
            continue
        for p in t.get("grid") or []:
            if params_key(template, p["params"]) == params_key(template, params):
                return p["estimate_ms"]
        return t.get("estimate_ms")
    return None


def dense_estimate_ms(state: dict, ctx: Context) -> float | None:
    """Dense's roofline estimate at the main N on the plan target (the bar a kernel must clear
    when there are no GPU timings)."""
    target, _ = plan_target(ctx)
    table, _ = template_table(state["report"], main_n(ctx), ctx.dtype, target, exec_backend=resolved_backend(ctx))
    return next((t["estimate_ms"] for t in table if t["name"] == "dense"), None)


def roofline_for(state: dict, ctx: Context, template: str, params: dict, a_bytes: float | None = None) -> dict | None:
    """Estimate of this candidate: on the plan target (ranking) and on the measuring GPU.

    A template instance is costed by its template's model. A kernel an LLM wrote passes
    ``a_bytes`` (the bytes its prepare() returned): the model of the template it adapts with A's
    bytes replaced, or, for a name the registry does not know, a plain CSR-like memory model of
    those bytes. None for dense, and without ``a_bytes`` for an unknown template or parameters the
    template does not allow."""
    from sparseditto.kernel_templates.registry import get_template

    target, _ = plan_target(ctx)
    rep = report_model(state["report"])
    n = main_n(ctx)
    try:
        t = get_template(template)
    except ValueError:
        t = None
    if t is not None and t.backend == "builtin":
        return None

    def cost_on(tgt):
        if t is not None:
            try:
                return t.cost(rep, n, ctx.dtype, tgt, params, a_bytes=a_bytes)
            except ValueError:   # parameters of an LLM's edit that the template does not allow
                pass
        return None if a_bytes is None else _measured_bytes_model(rep, n, ctx.dtype, tgt, a_bytes)

    est = cost_on(target)
    if est is None:
        return None
    gpu_target = measured_target(ctx)
    est_gpu = cost_on(gpu_target) if gpu_target is not None else est
    return {"estimate_ms": est.seconds * 1e3, "measured_ms": est_gpu.seconds * 1e3, "bound": est_gpu.bound,
            "bytes": float(est_gpu.bytes), "flops": float(est_gpu.flops), "a_bytes": est_gpu.a_bytes,
            "a_bytes_measured": a_bytes is not None,
            # the byte/flop roofline alone: a decode- or imbalance-bound estimate sits above it
            "roofline_only_ms": max(est_gpu.memory_s, est_gpu.compute_s) * 1e3}


def _measured_bytes_model(report, n: int, dtype: str, target, a_bytes: float):
    """The roofline of a kernel known only by the bytes it keeps of A: one launch, CUDA cores."""
    from sparseditto.kernel_templates.cost import CostTerms, estimate

    return estimate(lambda s, n_, dt, tgt, p: CostTerms(a_bytes=float(a_bytes), flops=2.0 * s.nnz * n_, unit="cuda_core"),
                    report, n, dtype, target, {})
