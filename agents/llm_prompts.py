"""The user messages the LLM planner, coder and debugger receive, built from what the graph knows.

Why bounded, and how: a prompt that grows with the run (every candidate tried, whole logs, whole
sources) eventually overflows a local model's context window and costs tokens for nothing. Every
section here has a limit (`PromptLimits`): the pattern report is compacted (lists and long strings
shortened before anything is cut), only the last candidates tried appear, sources, logs and
feedback are clipped (logs keep their tail, where the error is). When a server still answers
"context length exceeded", the policy rebuilds the prompt once with the limits scaled down
(`PromptLimits.scaled`).

What the prompts show beyond the candidate itself: the current best kernel (its source, measured
or estimated time, bytes of A as it packs them and the byte roofline they imply, % of that roofline
reached on a GPU, the profiler's bottleneck line and Nsight Compute metrics) and the memory's
lessons for similar patterns, so that the next candidate is written against what limits the best.
"""
from __future__ import annotations

import functools
import importlib.resources
import json
from dataclasses import dataclass, fields, replace
from typing import Any

from .policy import CandidateSpec, CodingBrief, FailureReport, KernelProfile, PlanningInput, TriedCandidate
from .tools import ToolContext, clip

CUDA_EXAMPLE_TEMPLATE = "csr_vector"   # the CUDA C++ template the coder is pointed to as the example


@functools.lru_cache(maxsize=None)
def load_prompt(name: str) -> str:
    """A system prompt shipped in ``sparseditto.agents/prompts`` (planner, coder, debugger)."""
    return (importlib.resources.files(__package__) / "prompts" / f"{name}.md").read_text(encoding="utf-8")


@dataclass(frozen=True)
class PromptLimits:
    """Characters (or items) each prompt section may take."""

    report_chars: int = 6000
    target_chars: int = 1500
    templates: int = 24
    template_chars: int = 700
    memory_hits: int = 5
    history: int = 8
    source_chars: int = 20000        # the source to adapt / the failed source
    best_source_chars: int = 6000    # the current best kernel's source (planner and coder)
    feedback_chars: int = 4000
    log_chars: int = 4000
    lessons: int = 5
    lesson_chars: int = 240

    def scaled(self, factor: float) -> "PromptLimits":
        """Every limit times ``factor`` (at least 1 item, 200 characters): the retry after a
        context-length error."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            floor = 200 if f.name.endswith("_chars") else 1
            out[f.name] = max(floor, int(value * factor))
        return replace(self, **out)


DEFAULT_LIMITS = PromptLimits()


# ---- formatting helpers ----------------------------------------------------------------------
def compact_json(obj: Any, limit: int) -> str:
    """Compact JSON of ``obj`` within ``limit`` characters: long lists and strings are shortened
    first (so the scalar facts survive), a hard clip is the last resort."""
    def dumps(o):
        return json.dumps(o, separators=(",", ":"), default=str)

    text = dumps(obj)
    if len(text) <= limit:
        return text

    def shrink(o, n_items, n_chars):
        if isinstance(o, dict):
            return {k: shrink(v, n_items, n_chars) for k, v in o.items()}
        if isinstance(o, list):
            head = [shrink(v, n_items, n_chars) for v in o[:n_items]]
            return head + ([f"... {len(o) - n_items} more"] if len(o) > n_items else [])
        if isinstance(o, str) and len(o) > n_chars:
            return o[:n_chars] + "..."
        return o

    for n_items, n_chars in ((16, 400), (8, 200), (4, 80), (2, 40)):
        text = dumps(shrink(obj, n_items, n_chars))
        if len(text) <= limit:
            return text
    return text[:limit] + "...(cut)"


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "?"
    if isinstance(value, float):
        return f"{value:.4g}{unit}"
    return f"{value}{unit}"


def _us(ms: float | None) -> str:
    return "?" if ms is None else f"{ms * 1e3:.2f} us"


def tried_line(t: TriedCandidate) -> str:
    """One line per tried candidate: what, outcome, time, speedup, roofline %, bottleneck."""
    parts = [f"{t.template} {json.dumps(t.params, separators=(',', ':'), default=str)} -> {t.status}"]
    if t.failure_class:
        parts.append(f"({t.failure_class})")
    if t.median_ms is not None:
        parts.append(f"{_fmt(t.median_ms)} ms")
    if t.speedup_vs_dense is not None:
        parts.append(f"{_fmt(t.speedup_vs_dense)}x dense")
    if t.pct_of_roofline is not None:
        parts.append(f"{_fmt(t.pct_of_roofline)}% roofline")
    if t.bottleneck:
        parts.append(f"bottleneck: {t.bottleneck}")
    return clip(" ".join(parts), 300)


def template_line(t: dict, limit: int = 700) -> str:
    keys = ("estimate_ms", "bound", "format", "backend", "default_params", "params", "description")
    info = {k: t[k] for k in keys if t.get(k) not in (None, "", {}, [])}
    grid = t.get("grid") or []
    if grid:
        info["grid_best"] = [{"params": g.get("params"), "estimate_ms": g.get("estimate_ms")} for g in grid[:3]]
    return clip(f"- {t.get('name')}: {compact_json(info, max(100, limit - 100))}", limit)


def memory_line(hit: dict) -> str:
    keys = ("kind", "matrix_name", "pattern", "distance", "template", "params", "speedup_vs_dense",
            "best_speedup_vs_dense", "median_ms", "gpu", "dtype", "n_bucket", "n_values", "tried")
    return clip("- " + compact_json({k: hit[k] for k in keys if k in hit and hit[k] is not None}, 400), 420)


def profile_lines(best: KernelProfile | None, limits: PromptLimits, *, with_source: bool = True) -> list[str]:
    """The current best kernel: what it is, its time, its bytes and byte roofline, its bottleneck,
    its Nsight Compute metrics, and (clipped) its source."""
    if best is None:
        return ["## Current best kernel", "(none verified yet)"]
    lines = ["## Current best kernel",
             f"{best.template} {json.dumps(best.params, separators=(',', ':'), default=str)} "
             f"(origin {best.origin or 'template'})"]
    if best.timings_are_gpu:
        lines.append(f"Measured: {_us(best.median_ms)} on the GPU; cost-model estimate {_us(best.expected_ms)}.")
    else:
        lines.append(f"Cost-model estimate on the target: {_us(best.expected_ms)} (the interpreter's CPU time "
                     f"{_fmt(best.median_ms, ' ms')} is not a GPU timing and ranks nothing).")
    if best.a_bytes is not None:
        how = "counted from the tensors its prepare() returns" if best.a_bytes_measured else "by the format formula"
        per = f" = {best.bytes_per_nnz:.2f} bytes per nonzero" if best.bytes_per_nnz is not None else ""
        lines.append(f"Bytes of A as it packs them: {best.a_bytes:.0f}{per} ({how}); byte roofline "
                     f"(A + B + C over the bandwidth) {_us(best.roofline_ms)}"
                     + (f"; reached {best.pct_of_roofline:.0f}% of it." if best.pct_of_roofline is not None else "."))
    if best.bottleneck:
        lines.append(f"Bottleneck (profiler): {clip(best.bottleneck, 400)}")
    if best.ncu:
        lines.append("Nsight Compute: " + compact_json(best.ncu, 600))
    if with_source and best.source:
        lines += ["Its source:", "```python", clip(best.source, limits.best_source_chars), "```"]
    return lines


def lesson_lines(lessons: list[str], limits: PromptLimits) -> list[str]:
    lines = ["## Lessons from the memory (past runs on similar patterns)"]
    picked = [clip(" ".join(str(text).split()), limits.lesson_chars) for text in lessons[: limits.lessons]]
    return lines + ([f"- {text}" for text in picked] or ["(none yet)"])


# ---- the three prompts -------------------------------------------------------------------------
def plan_prompt(inp: PlanningInput, limits: PromptLimits = DEFAULT_LIMITS) -> str:
    """The planner's user message. Bounded: the report is compacted, and of the candidates tried
    only the last ``limits.history`` (plus the best) appear, so long runs do not grow the prompt."""
    n_main = inp.n_values[0] if inp.n_values else None
    lines = [
        "## Matrix pattern report (JSON)",
        compact_json(inp.report, limits.report_chars),
        "",
        "## Target GPU",
        compact_json(inp.target, limits.target_chars),
        "",
        f"## Workload: N values {inp.n_values} (main N = {n_main}), dtype {inp.dtype}",
        f"Dense cuBLAS: {_fmt(inp.dense_ms, ' ms')}; best roofline over templates: {_fmt(inp.roofline_ms, ' ms')}.",
        f"Budget left: {inp.budget_left} candidate(s).",
        "",
        "## Applicable templates (name: cost estimate at the main N, legal params, ...)",
    ]
    lines += [template_line(t, limits.template_chars) for t in inp.templates[: limits.templates]] or ["(none reported)"]
    lines += ["", "## Memory hits (past runs on this or similar patterns)"]
    lines += [memory_line(h) for h in inp.memory_hits[: limits.memory_hits]] or ["(none)"]
    lines += ["", f"## Candidates tried so far: {len(inp.tried)}"]
    recent = inp.tried[-limits.history:] if limits.history > 0 else []
    if len(inp.tried) > len(recent):
        lines.append(f"({len(inp.tried) - len(recent)} earlier candidate(s) omitted)")
    lines += [f"{len(inp.tried) - len(recent) + i + 1}. {tried_line(t)}" for i, t in enumerate(recent)] or ["(none yet)"]
    if inp.best is not None:
        lines.append(f"Best so far: {tried_line(inp.best)}")
    if inp.best_kernel is not None:
        lines += [""] + profile_lines(inp.best_kernel, limits)
    if inp.lessons:
        lines += [""] + lesson_lines(inp.lessons, limits)
    lines += ["", "Decide the next candidates (or stop). Answer with the JSON object only."]
    return "\n".join(lines)


def _language_note(spec_backend: str | None, exec_backend: str) -> str:
    if spec_backend == "cuda":
        return ("The source to adapt is a CUDA C++ candidate (CuPy RawModule): keep its contract (CUDA_SRC "
                "compiled in prepare(), one launch on torch's current stream in spmm()).")
    if exec_backend == "cuda":
        return ("Write Triton, or a CUDA C++ candidate through CuPy RawModule under the same contract as the "
                f"CUDA templates (call instantiate_template('{CUDA_EXAMPLE_TEMPLATE}') for the example).")
    return ("Execution backend 'interpret' (Triton interpreter on a CPU): write Triton. A CUDA C++ (CuPy) "
            "candidate cannot run here and would be wasted budget.")


def code_prompt(spec: CandidateSpec, template_source: str, feedback: str | None, ctx: ToolContext,
                brief: CodingBrief | None = None, limits: PromptLimits = DEFAULT_LIMITS, *,
                spec_backend: str | None = None) -> str:
    """The coder's user message: the candidate to write, the matrix, the source to adapt, the
    feedback on the previous attempt, and (``brief``) the current best kernel and the lessons."""
    lines = [f"## Candidate to write: template '{spec.template}' with params "
             f"{json.dumps(spec.params, default=str)}"]
    if spec.rationale:
        lines.append(f"Planner's reason: {spec.rationale}")
    if ctx.matrix is not None:
        m = ctx.matrix
        lines.append(f"Matrix: {getattr(m, 'name', '?')} shape {tuple(m.shape)}, nnz {m.nnz}, "
                     f"pattern {ctx.pattern or '?'}; dtype {ctx.dtype}; N values {ctx.n_values}; "
                     f"backend {ctx.backend}.")
    else:
        lines.append(f"dtype {ctx.dtype}; N values {ctx.n_values}; backend {ctx.backend}.")
    if brief is not None and brief.target:
        lines.append(f"Target GPU: {brief.target}.")
    lines.append(_language_note(spec_backend, ctx.backend))
    best = brief.best if brief is not None else None
    # Improving the LLM's own best kernel for the same template: that kernel is the source to
    # adapt (the template instance stays one instantiate_template call away), so the prompt
    # carries one source, not two.
    own_best = best is not None and best.origin == "llm" and best.template == spec.template and bool(best.source)
    if own_best:
        lines += ["", "## Source to adapt (the current best kernel, verified; the template instance is "
                      f"instantiate_template('{spec.template}'))", "```python", clip(best.source, limits.source_chars),
                  "```"]
    else:
        lines += ["", "## Source to adapt (a working, verified template instance)", "```python",
                  clip(template_source or "# (no template source given: write the module from scratch)",
                       limits.source_chars), "```"]
    if best is not None:
        same = own_best or (best.source is not None and best.source.strip() == (template_source or "").strip())
        lines += [""] + profile_lines(best, limits, with_source=not same)
    if brief is not None and brief.lessons:
        lines += [""] + lesson_lines(brief.lessons, limits)
    if feedback:
        lines += ["", "## Feedback on the previous attempt (errors, verification, profile)",
                  clip(feedback, limits.feedback_chars, keep="tail")]
    lines += ["", "Write the complete module now: one line of explanation, then one ```python block."]
    return "\n".join(lines)


def diagnose_prompt(failure: FailureReport, source: str, known_templates: list[str],
                    limits: PromptLimits = DEFAULT_LIMITS) -> str:
    report = failure.model_dump()
    report["log"] = clip(failure.log or "", limits.log_chars, keep="tail")
    report["message"] = clip(failure.message or "", 1500)
    lines = ["## Failure report", json.dumps(report, default=str), "",
             "## Source of the failed candidate", "```python", clip(source or "", limits.source_chars), "```"]
    if known_templates:
        lines += ["", f"Templates you may switch to: {', '.join(known_templates)}"]
    lines += ["", "Diagnose it. Answer with the JSON object only."]
    return "\n".join(lines)
