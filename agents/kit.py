"""The services every node uses, in one place, so that no node needs another node.

* per-run resources: the policy deciding this run and the trajectory memory, built once per run
  (Studio hands over no ready objects) and cached here, never in state;
* progress lines (``emit``), one-line decisions, the test hook;
* asking the policy (``call_policy``, ``policy_for_step``) and keeping what it logged;
* the target a plan is for and the GPU that measures;
* the trajectory memory, written only from here during a run: the run's start and end, its steps,
  and each candidate record;
* dense's timing (the profiler's benchmarks measure it beside every candidate; finalize times it
  alone when nothing did).
"""
from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

from sparseditto.agents.records import TIMING_FIELDS, CandidateRecord
from sparseditto.agents.state import (Context, main_n, ready_object, resolved_backend, resolved_repeats,
                                      resolved_warmup)

# ---- per-run resources (policy, memory) --------------------------------------------------------

_RESOURCES: dict[tuple, Any] = {}
_LOCK = threading.Lock()


def run_policy(ctx: Context, run_id: str):
    """The policy deciding this run: a ready ``policy``, else LLM (a chat model or ``ctx.llm``) or expert."""
    ready = ready_object(ctx, "policy")
    if ready is not None:
        return ready
    model = ready_object(ctx, "chat_model")
    key = ("policy", run_id, id(model) if model is not None else ctx.llm)
    with _LOCK:
        pol = _RESOURCES.get(key)
        if pol is None:
            pol = _RESOURCES[key] = build_policy(ctx)
        return pol


def build_policy(ctx: Context):
    """The expert policy, or the LLM policy (with the expert as its fallback) when a model resolves."""
    from sparseditto.agents.expert import ExpertPolicy
    from sparseditto.llm import resolve_llm

    expert = ExpertPolicy(near_roofline=ctx.near_roofline, plateau=ctx.plateau, plateau_gain=ctx.plateau_gain)
    # a chat model object, else the name in ctx.llm; None -> $SPARSEDITTO_LLM_MODEL when set, else no LLM
    model = resolve_llm(ready_object(ctx, "chat_model") or ctx.llm)
    if model is None:
        return expert
    from sparseditto.agents.llm_policy import LLMPolicy

    return LLMPolicy(model, fallback=expert)


def run_memory(ctx: Context):
    """The trajectory memory for this run, or None when disabled or unavailable."""
    if not ctx.use_memory:
        return None
    ready = ready_object(ctx, "memory")
    if ready is not None:
        return ready
    key = ("memory", ctx.memory_path, threading.get_ident())  # one SQLite connection per thread
    with _LOCK:
        mem = _RESOURCES.get(key)
        if mem is None:
            from sparseditto.memory import Memory

            mem = _RESOURCES[key] = Memory(ctx.memory_path)
        return mem


def forget_run(run_id: str) -> None:
    """Drop cached per-run resources (called when a run finishes)."""
    with _LOCK:
        for key in [k for k in _RESOURCES if k[0] == "policy" and k[1] == run_id]:
            del _RESOURCES[key]


# ---- progress, decisions, hooks ----------------------------------------------------------------

def emit(node: str, msg: str, **extra) -> None:
    """Stream a progress line (stream_mode='custom'); a no-op outside a streaming run."""
    try:
        from langgraph.config import get_stream_writer

        writer = get_stream_writer()
    except Exception:
        return
    try:
        writer({"node": node, "msg": msg, **extra})
    except Exception:
        pass


def decision(node: str, action: str, rationale: str, **extra) -> dict:
    """One trajectory entry: which node decided what, and why (one line)."""
    line = " ".join(str(rationale).split())
    return {"node": node, "action": action, "rationale": line, "t": round(time.time(), 3), **extra}


def run_hook(ctx: Context, node: str, state: dict) -> None:
    """Call a test hook before a node body runs (used to simulate a crash mid-run)."""
    hooks = ready_object(ctx, "hooks") or {}
    fn = hooks.get("before_node") if isinstance(hooks, dict) else None
    if fn is not None:
        fn(node, state)


# ---- asking the policy ---------------------------------------------------------------------------

def _usage_dict(usage) -> dict:
    if usage is None:
        return {}
    if hasattr(usage, "model_dump"):
        usage = usage.model_dump()
    elif dataclasses.is_dataclass(usage):
        usage = dataclasses.asdict(usage)
    return {k: v for k, v in dict(usage).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _event_dict(event) -> dict:
    if hasattr(event, "model_dump"):
        return event.model_dump(mode="json")
    if isinstance(event, dict):
        return dict(event)
    return {"event": str(event)}


def call_policy(policy, method: str, *args, node: str = ""):
    """Call ``policy.<method>(*args)`` and collect what it logged while deciding.

    Returns ``(answer, new_events, usage_delta)``: an LLM policy appends fallback events and
    accumulates token usage on itself (the expert has neither); the graph state records only what
    this call added, so the totals stay right across checkpoints and resumes.
    """
    events = getattr(policy, "events", None)
    n_before = len(events) if events is not None else 0
    usage_before = _usage_dict(getattr(policy, "usage", None))
    answer = getattr(policy, method)(*args)
    events = getattr(policy, "events", None)
    new_events = [dict(_event_dict(e), node=node) for e in (events[n_before:] if events is not None else [])]
    usage_after = _usage_dict(getattr(policy, "usage", None))
    delta = {k: v - usage_before.get(k, 0) for k, v in usage_after.items() if v != usage_before.get(k, 0)}
    return answer, new_events, delta


def policy_for_step(ctx: Context, state: dict):
    """The run's policy, with its tool context (matrix, dtype, backend, ...) set for this step.

    The LLM policy's coder tools compile and verify drafts on the run's matrix; the expert has no
    tools and no ``set_context``."""
    policy = run_policy(ctx, state.get("run_id", ""))
    setter = getattr(policy, "set_context", None)
    if setter is not None:
        report = state.get("report") or {}
        fields = {"dtype": ctx.dtype, "backend": resolved_backend(ctx), "n_values": list(ctx.n_values),
                  "memory": run_memory(ctx), "signature": report.get("signature"),
                  "pattern": report.get("pattern"), "timeout_s": ctx.verify_timeout_s}
        if state.get("matrix_key"):
            from sparseditto.artifacts import get_matrix

            fields["matrix"] = get_matrix(state["matrix_key"])
        context = getattr(policy, "context", None)
        fields = {k: v for k, v in fields.items() if context is None or hasattr(context, k)}
        setter(**fields)
    return policy


def policy_events(ctx: Context, state: dict, node: str, events: list[dict]) -> list[dict]:
    """Record a policy's new events in memory (prompts as 'prompt' steps, the rest as 'event')
    and return the ones the graph state keeps: fallbacks and notes, not full prompts."""
    kept = []
    for event in events:
        kind = "prompt" if event.get("kind") == "prompt" or event.get("event") == "llm_call" else "event"
        record_step(ctx, state, node, kind, event)
        if kind == "event":
            kept.append(event)
    return kept


# ---- targets and the report ----------------------------------------------------------------------

def plan_target(ctx: Context):
    """(Target the plan is for, note). 'auto' without a GPU falls back to A100 with a note."""
    from sparseditto.targets import resolve_target

    return resolve_target(ctx.target, fallback="A100")


def measured_target(ctx: Context):
    """The Target of the GPU that actually runs the benchmarks (None on the interpreter)."""
    if resolved_backend(ctx) != "cuda":
        return None
    from sparseditto.targets import detect_local_target

    try:
        return detect_local_target()
    except Exception:
        return None


def report_model(report: dict):
    """The state's report dict as the `PatternReport` the cost models read."""
    from sparseditto.analysis import PatternReport

    return PatternReport.model_validate(report)


# ---- the trajectory memory (the only writer during a run) ---------------------------------------

def memory_gpu_key(ctx: Context) -> str:
    """What a remembered kernel choice is valid for: the GPU that measured it, or, on the Triton
    interpreter (choice by cost model), the target it was planned for."""
    if resolved_backend(ctx) == "cuda":
        try:
            import torch

            return torch.cuda.get_device_name(0)
        except Exception:
            return "cuda"
    target, _ = plan_target(ctx)
    return f"interpret:{target.name}"


def start_memory_run(mem, ctx: Context, state: dict, report, matrix) -> str:
    """Open this run in the memory (its settings, pattern report and features); returns its id."""
    target, _ = plan_target(ctx)
    policy = run_policy(ctx, state.get("run_id", ""))
    llm_model = None
    if policy.name != "expert":
        model = getattr(policy, "model", None)   # the LLM policy's chat model
        llm_model = getattr(model, "model_name", None) or getattr(model, "model", None) or type(model).__name__
        llm_model = str(llm_model)
    return mem.start_run(
        signature=report.signature, matrix_name=matrix.name, shape=matrix.shape, nnz=matrix.nnz,
        pattern=report.pattern, n_values=list(ctx.n_values), dtype=ctx.dtype, gpu=memory_gpu_key(ctx),
        target=target.name, backend=resolved_backend(ctx), policy=policy.name,
        llm_model=llm_model, features=report.feature_vector(), report=report.model_dump(mode="json"))


def record_step(ctx: Context, state: dict, node: str, kind: str, payload: Any) -> None:
    """Append a trajectory step to the run in memory (a memory failure never stops the run)."""
    mem = run_memory(ctx)
    run_id = state.get("memory_run_id")
    if mem is None or not run_id:
        return
    try:
        mem.record_step(run_id, node, kind, payload)
    except Exception as exc:  # pragma: no cover - a locked or corrupt memory file
        emit(node, f"memory: could not record {kind} step ({exc})")


def remember_candidate(ctx: Context, state: dict, record: CandidateRecord, node: str) -> str | None:
    """Store a candidate record (source once per content hash, timings, metrics); its memory id."""
    mem = run_memory(ctx)
    if mem is None or not state.get("memory_run_id"):
        return None
    timings = {k: getattr(record, k) for k in TIMING_FIELDS if getattr(record, k) is not None}
    if record.timings_are_gpu is not None:
        timings["timings_are_gpu"] = record.timings_are_gpu
    metrics = dict(record.metrics)
    if record.pct_of_roofline is not None:
        metrics["pct_of_roofline"] = record.pct_of_roofline
    try:
        return mem.record_candidate(
            state["memory_run_id"], step=record.index, template=record.template, params=record.params,
            source=record.source, origin=record.origin, status=record.status, failure_class=record.failure_class,
            message=(record.message or "")[:2000], timings=timings or None, metrics=metrics or None,
            rationale=record.rationale, backend=record.backend)
    except Exception as exc:  # pragma: no cover - a locked or corrupt memory file
        emit(node, f"memory: could not record candidate ({exc})")
        return None


def finish_memory_run(ctx: Context, state: dict, final: dict) -> None:
    """Close the run in memory with the chosen kernel (a memory failure never stops the run)."""
    mem = run_memory(ctx)
    run_id = state.get("memory_run_id")
    if mem is None or not run_id:
        return
    rec = final.get("candidate") or {}
    try:
        mem.finish_run(
            run_id, "ok", rec.get("memory_candidate_id") or None,
            best_template=final["template"],
            best_speedup_vs_dense=rec.get("speedup_vs_dense") if rec else None,
            best_speedup_estimate=(final.get("speedups") or {}).get("dense") if final.get("speedups_are_estimates")
            else None,
            wall_seconds=time.time() - float(state.get("started_at") or time.time()),
            token_usage=state.get("token_usage") or None)
    except Exception as exc:  # pragma: no cover
        emit("finalize", f"memory: could not finish run ({exc})")


# ---- dense's timing -----------------------------------------------------------------------------

def dense_record(res) -> dict:
    """Dense cuBLAS timing from a `BenchResult`; ``median_ms`` is the graph-launched time when there
    is one (see the profiler's ``kernel_timings``), the eager timing stays under ``eager``."""
    graph = res.dense_graph.model_dump(mode="json") if res.dense_graph is not None else None
    eager = res.dense.model_dump(mode="json")
    main = graph if (graph and res.timings_are_gpu and res.candidate_graph is not None) else eager
    return {**main, "n": res.n, "gpu_name": res.gpu_name, "timings_are_gpu": res.timings_are_gpu,
            "graph": graph, "eager": eager}


def bench_dense(state: dict, ctx: Context) -> dict:
    """Time dense alone through the harness's builtin dense entry (when no candidate ran)."""
    from sparseditto import harness
    from sparseditto.artifacts import get_matrix
    from sparseditto.kernel_templates.registry import get_template

    matrix = get_matrix(state["matrix_key"])
    cand = get_template("dense").instantiate({})
    res = harness.bench(cand, matrix, n=main_n(ctx), dtype=ctx.dtype, backend=resolved_backend(ctx),
                        repeats=resolved_repeats(ctx), warmup=resolved_warmup(ctx), baselines=False)
    return dense_record(res)
