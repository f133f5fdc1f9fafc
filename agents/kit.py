"""The services every node uses, in one place, so that no node needs another node.

* per-run resources: the policy deciding this run and the trajectory memory, built once per run
  (Studio hands over no ready objects) and cached here, never in state;
* progress lines (``emit``), one-line decisions, the test hook, steps done once per run (``once``);
* asking the policy (``ask_policy``: its tool context and LLM budget set, its events, transcript
  and token usage kept), the memory's lessons for the prompts;
* the target a plan is for and the GPU that measures;
* the trajectory memory, written only from here during a run: the run's start and end, its steps,
  and each candidate record;
* timings: the record fields of a benchmark (`timing_fields`, one basis for generated kernels and
  vendor paths), dense's record, and the winner's independent re-timing (`retime_speedup`).
"""
from __future__ import annotations

import json
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


def once(name: str, fn, *args):
    """``fn(*args)``, run once per node execution however often LangGraph executes the node.

    Why: a node that calls ``interrupt()`` (finalize's approval prompt) runs again from its start
    when the run resumes, so whatever it measured and wrote to the memory before the prompt would
    be measured and written twice. Inside a graph ``fn`` runs as a LangGraph task, whose result the
    checkpointer keeps with the node's pending writes: on resume (in this process or a new one)
    the same call returns that result without running ``fn``. Outside a graph (a node called
    directly) it is a plain call. ``fn`` must return plain data and should not raise (fold a
    failure into the value): the result is what a resumed run sees."""
    try:
        from langgraph.config import get_config

        get_config()
    except RuntimeError:   # not inside a graph run
        return fn(*args)
    from langgraph.func import task

    return task(name=name)(fn)(*args).result()


# ---- asking the policy ---------------------------------------------------------------------------

def _event_dict(event) -> dict:
    if hasattr(event, "model_dump"):
        return event.model_dump(mode="json")
    if isinstance(event, dict):
        return dict(event)
    return {"event": str(event)}


def llm_budget(ctx: Context, state: dict):
    """The run's LLM budget (`Context.max_llm_tokens` / `max_llm_cost` / `llm_price`) with what
    the run spent so far (the state's token usage: it survives checkpoints and resumes)."""
    from sparseditto.agents.llm_transport import LLMBudget
    from sparseditto.llm import check_price

    spent = state.get("token_usage") or {}
    return LLMBudget(max_tokens=ctx.max_llm_tokens, max_cost=ctx.max_llm_cost, price=check_price(ctx.llm_price),
                     spent_tokens=int(spent.get("total_tokens") or 0), spent_cost=float(spent.get("cost_usd") or 0.0))


def policy_for_step(ctx: Context, state: dict):
    """The run's policy, with its tool context (matrix, dtype, backend, ...) and its LLM budget
    set for this step. The expert has neither ``set_context`` nor ``set_budget``."""
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
    budget_setter = getattr(policy, "set_budget", None)
    if budget_setter is not None:
        budget_setter(llm_budget(ctx, state))
    return policy


def ask_policy(ctx: Context, state: dict, method: str, *args, node: str):
    """Ask the run's policy ``method(*args)`` and keep what it logged while deciding.

    Returns ``(answer, update)``: ``update`` holds the state keys this step adds (``events``:
    fallbacks and notes; ``llm_calls``: a summary of every model request; ``token_usage``: their
    tokens, in total and per role). The full transcript goes to the memory (``llm_calls`` table,
    with a ``prompt`` step pointing at each row), events to the trajectory. Only what this call
    added is reported, so the totals stay right across checkpoints and resumes.
    """
    from sparseditto.llm import RunTokenUsage

    policy = policy_for_step(ctx, state)
    events, calls = getattr(policy, "events", None), getattr(policy, "calls", None)
    n_events = len(events) if events is not None else 0
    n_calls = len(calls) if calls is not None else 0
    answer = getattr(policy, method)(*args)
    new_events = [dict(_event_dict(e), node=node) for e in (policy.events[n_events:] if events is not None else [])]
    new_calls = list(policy.calls[n_calls:]) if calls is not None else []
    summaries = []
    for call in new_calls:
        idx = record_llm_call(ctx, state, node, call)
        record_step(ctx, state, node, "prompt", {"role": call.role, "call_idx": idx, "prompt_hash": call.prompt_hash,
                                                 "outcome": call.outcome, "total_tokens": call.total_tokens})
        summaries.append({**call.summary(), "node": node, "call_idx": idx})   # an LLMCall without the text
    for event in new_events:
        record_step(ctx, state, node, "event", event)
    usage = RunTokenUsage.of_calls(new_calls).as_update() if new_calls else {}
    return answer, {"events": new_events, "llm_calls": summaries, "token_usage": usage}


def policy_name(ctx: Context, state: dict) -> str:
    return run_policy(ctx, state.get("run_id", "")).name


def run_lessons(ctx: Context, state: dict, limit: int = 5) -> list[str]:
    """The memory's lessons for this matrix's pattern class (most recent first); [] without memory."""
    mem = run_memory(ctx)
    pattern = (state.get("report") or {}).get("pattern")
    if mem is None or not pattern:
        return []
    try:
        return [row["text"] for row in mem.lessons(pattern, limit=limit)]
    except Exception:  # pragma: no cover - a locked or corrupt memory file
        return []


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


def record_llm_call(ctx: Context, state: dict, node: str, call) -> int | None:
    """Store one model request in the run's transcript; its index (None when memory is off)."""
    mem = run_memory(ctx)
    run_id = state.get("memory_run_id")
    if mem is None or not run_id:
        return None
    try:
        return mem.record_llm_call(run_id, node, call)
    except Exception as exc:  # pragma: no cover - a locked or corrupt memory file
        emit(node, f"memory: could not record an LLM call ({exc})")
        return None


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


def run_lesson(ctx: Context, state: dict, final: dict) -> str:
    """One line a later run on a similar pattern should read: what won here, by how much, what
    failed (the prompts show the latest few of the pattern)."""
    report = state.get("report") or {}
    shape = "x".join(str(v) for v in report.get("shape") or []) or "?"
    rec = final.get("candidate") or {}
    answer = final["template"] if not rec else (
        f"{rec['template']} {json.dumps(rec.get('params') or {}, separators=(',', ':'), default=str)} "
        f"({rec.get('origin') or 'template'})")
    gains = final.get("speedups") or {}
    gain = f"{gains['dense']:.2f}x dense{' (estimated)' if final.get('speedups_are_estimates') else ''}" \
        if gains.get("dense") else final.get("selection", "")
    failed: dict[str, int] = {}
    for c in state.get("candidates") or []:
        if c.get("status") != "verified":
            key = f"{c.get('failure_class') or c.get('status')} ({c.get('origin') or 'template'})"
            failed[key] = failed.get(key, 0) + 1
    fails = ", ".join(f"{v} {k}" for k, v in sorted(failed.items())) or "none"
    return (f"{shape} {report.get('pattern', '?')} (density {float(report.get('density') or 0):.3f}), "
            f"N={list(ctx.n_values)} {ctx.dtype} on {memory_gpu_key(ctx)}: {answer}, {gain}; failures: {fails}")


def finish_memory_run(ctx: Context, state: dict, final: dict) -> None:
    """Close the run in memory with the chosen kernel and its lesson (a memory failure never
    stops the run)."""
    mem = run_memory(ctx)
    run_id = state.get("memory_run_id")
    if mem is None or not run_id:
        return
    rec = final.get("candidate") or {}
    report = state.get("report") or {}
    try:
        mem.add_lesson(report.get("pattern"), run_lesson(ctx, state, final), signature=report.get("signature"))
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


# ---- timings ------------------------------------------------------------------------------------

def kernel_timings(res, gpu: bool) -> tuple[float, float, str]:
    """(candidate ms, dense ms, basis) used to rank candidates and to state speedups.

    On a GPU both sides are the cold-L2 time of one launch replayed from a CUDA graph: the kernel's
    own time, what a model served with CUDA graphs pays, and free of the Python launch overhead
    that would otherwise decide small-N cases (DESIGN.md, "Timing small kernels"). Eager times are
    kept in the record beside them. Without graph timings both sides are eager.
    """
    if gpu and res.candidate_graph is not None and res.dense_graph is not None:
        return res.candidate_graph.median_ms, res.dense_graph.median_ms, "cuda_graph"
    return res.candidate.median_ms, res.dense.median_ms, "eager"


def timing_fields(res) -> dict:
    """The measured fields of a `CandidateRecord` from a `BenchResult`: the same for a generated
    kernel (profiler) and a vendor path (agents/vendors.py), so both are ranked on one basis. GPU
    speedups only from GPU timings; interpreter ratios are kept apart as CPU ratios."""
    gpu = res.timings_are_gpu
    median_ms, dense_ms, basis = kernel_timings(res, gpu)
    return dict(
        median_ms=median_ms, timing_basis=basis, eager_ms=res.candidate.median_ms, p10_ms=res.candidate.p10_ms,
        p90_ms=res.candidate.p90_ms, graph_ms=res.candidate_graph.median_ms if res.candidate_graph else None,
        dense_ms=dense_ms, dense_eager_ms=res.dense.median_ms, conversion_ms=res.conversion_ms,
        speedup_vs_dense=dense_ms / median_ms if gpu and median_ms > 0 else None,
        speedup_vs_dense_eager=res.speedup_vs_dense if gpu else None,
        cpu_speedup_vs_dense=None if gpu else res.speedup_vs_dense,
        timings_are_gpu=gpu, gpu_name=res.gpu_name, n=res.n, notes=list(res.notes))


def _bench_for_retime(state: dict, ctx: Context, spec) -> tuple[float, float, str, float]:
    """(ms, dense ms, basis, eager ms) of one fresh benchmark run of ``spec``, re-verified after it."""
    from sparseditto import harness
    from sparseditto.artifacts import get_matrix

    res = harness.bench(spec, get_matrix(state["matrix_key"]), n=main_n(ctx), dtype=ctx.dtype,
                        backend=resolved_backend(ctx), repeats=resolved_repeats(ctx), warmup=resolved_warmup(ctx),
                        baselines=False)
    if not res.reverified:
        raise RuntimeError(f"re-verification after the re-timing of {spec.template} failed: {res.reverify_message}")
    median_ms, dense_ms, basis = kernel_timings(res, res.timings_are_gpu)
    return median_ms, dense_ms, basis, res.candidate.median_ms


def retime_speedup(state: dict, ctx: Context, record: dict, against: dict | None = None) -> tuple[float, float]:
    """(speedup over ``against``, speedup over dense) of a kernel about to be shipped, from an
    independent re-timing: a fresh benchmark run of it (dense beside it, re-verified after timing)
    and, when the competitor is a vendor path other than dense, a fresh run of that path by the
    same method in the same worker. ``against`` None or dense: both numbers are the dense ratio.

    Why: one benchmark's median is not always the kernel's time. On the H200 (2026-12-01) the same
    csr_rowsplit instance measured 23.3 us in its run and 39-42 us in three re-timings, and tc_dense
    16.9 us in one run and 40.6 us in another, while dense cuBLAS stayed at 18.4-19.7 us; run_graph
    shipped both once, at 0.46x and 0.90x of dense. Raises when either kernel fails while re-timed."""
    from sparseditto.agents.records import make_candidate
    from sparseditto.harness import vendor_spec

    spec = {"template": record["template"], "params": record.get("params") or {}}
    ours, dense_ms, ours_basis, ours_eager = _bench_for_retime(
        state, ctx, make_candidate(spec, record["source"], record.get("origin") or "template"))
    vs_dense = dense_ms / ours
    if against is None or against.get("template") == "dense":
        return vs_dense, vs_dense
    theirs, _, their_basis, theirs_eager = _bench_for_retime(state, ctx, vendor_spec(against["template"]))
    if ours_basis != their_basis:   # one has no graph timing: compare eager with eager
        ours, theirs = ours_eager, theirs_eager
    return theirs / ours, vs_dense


def dense_record(res) -> dict:
    """Dense cuBLAS timing from a `BenchResult`; ``median_ms`` is the graph-launched time when there
    is one (see ``kernel_timings``), the eager timing stays under ``eager``."""
    graph = res.dense_graph.model_dump(mode="json") if res.dense_graph is not None else None
    eager = res.dense.model_dump(mode="json")
    main = graph if (graph and res.timings_are_gpu and res.candidate_graph is not None) else eager
    return {**main, "n": res.n, "gpu_name": res.gpu_name, "timings_are_gpu": res.timings_are_gpu,
            "graph": graph, "eager": eager}
