"""Optional per-case sweep over the kernel templates (``sparseditto bench --templates all``).

`run_graph` answers with one kernel; someone writing a new template wants to see how *every*
applicable template does on the same case, measured the same way, even the ones the planner did
not try. Each template's first ``grid`` parameter sets are verified in the sandbox and benched
beside dense cuBLAS (the harness times dense again in the same worker call, so each ratio is like
for like). Results go into the row's ``templates`` list; they never change the row's answer.
"""
from __future__ import annotations

from .ratios import format_roofline, ratio
from .rows import PathTiming, TemplateTiming


def selected_templates(names) -> list:
    """Registry templates by name (``["all"]``: every non-builtin one)."""
    from sparseditto.kernel_templates.registry import get_template, list_templates

    if list(names) == ["all"]:
        return [t for t in list_templates() if t.backend != "builtin"]
    return [get_template(n) for n in names]  # an unknown name is a ValueError that lists the known ones


def sweep_templates(templates, matrix, report, target, *, n: int, dtype: str, settings, grid: int,
                    copy_gbs: float | None) -> list[TemplateTiming]:
    from sparseditto.harness import BenchError, bench, run_and_verify

    out = []
    for template in templates:
        ok, why = template.applicable(report)
        if not ok:
            out.append(TemplateTiming(template=template.name, status="not_applicable", message=why))
            continue
        if template.backend == "cuda" and settings.backend != "cuda":
            out.append(TemplateTiming(template=template.name, status="not_applicable",
                                      message="CUDA C++ templates need a GPU"))
            continue
        for params in template.param_grid(report, n, target, limit=grid):
            cand = template.instantiate(params)
            entry = TemplateTiming(template=template.name, params=cand.params, status="verified")
            common = dict(dtype=dtype, backend=settings.backend, timeout=settings.timeout_s)
            ver = run_and_verify(cand, matrix, n_values=(7, n) if n > 1 else (1, 7), seed=settings.seed, **common)
            if not ver.ok:
                entry.status, entry.message = ver.status, ver.message[:500]
                out.append(entry)
                continue
            try:
                res = bench(cand, matrix, n, repeats=settings.repeats, warmup=settings.warmup, baselines=False,
                            seed=settings.seed + 1, **common)
            except BenchError as exc:
                entry.status, entry.message = exc.result.status, str(exc)[:500]
                out.append(entry)
                continue
            mine = PathTiming(name=template.name, ok=True, eager_us=res.candidate.median_ms * 1e3,
                              graph_us=res.candidate_graph.median_ms * 1e3 if res.candidate_graph else None)
            dense = PathTiming(name="cublas_dense", ok=True, eager_us=res.dense.median_ms * 1e3,
                               graph_us=res.dense_graph.median_ms * 1e3 if res.dense_graph else None)
            nbytes = float(template.cost(report, n, dtype, target, cand.params).bytes)
            entry.eager_us, entry.graph_us = mine.eager_us, mine.graph_us
            entry.speedup_vs_dense = ratio(mine, dense)
            entry.format_bytes = nbytes
            entry.pct_roofline = format_roofline(nbytes, mine, copy_gbs).get("pct_roofline")
            entry.reverified = res.reverified
            out.append(entry)
    return out
