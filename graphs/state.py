"""The graph's shared state, its run-time settings (`Context`) and the per-run resources.

State is plain data (dicts, lists, strings, numbers) so that every update can be checkpointed to
SQLite, streamed to Studio and replayed on resume. Big objects never enter it: the matrix lives in
the artifact store (`sparseditto.artifacts`) and the state holds its key; the chat model, the
policy and the memory connection live in `Context` / the resource cache below, never in state.

Lists that only grow (candidates, decisions, events) use an ``operator.add`` reducer, so a node
returns just its new items and a resumed run appends instead of overwriting.
"""
from __future__ import annotations

import dataclasses
import operator
import threading
import time
from dataclasses import dataclass, field
from typing import Annotated, Any, Optional

from typing_extensions import TypedDict

DTYPES = ("float16", "bfloat16", "float32")
BACKENDS = ("auto", "cuda", "interpret")


def add_usage(left: Optional[dict], right: Optional[dict]) -> dict:
    """Reducer for token usage: sum numeric fields, so each node reports only its delta."""
    out = dict(left or {})
    for key, value in (right or {}).items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = out.get(key, 0) + value
        else:
            out[key] = value
    return out


class State(TypedDict, total=False):
    """Everything the five agents share. See the module docstring for what may live here."""

    # --- what is being optimized ---------------------------------------------------------------
    matrix_key: str                 # artifact-store key of the SparseMatrix
    matrix_name: str
    run_id: str                     # this graph run's id (keys the per-run resource cache)
    memory_run_id: str              # the run's id in the trajectory memory (set by the analyzer)
    started_at: float               # wall-clock start (time budget)
    settings: dict                  # per-run overrides of Context fields (Studio input form)
    # --- analysis ------------------------------------------------------------------------------
    report: dict                    # PatternReport.model_dump()
    memory_hits: list[dict]         # exact hit and/or neighbours found in memory
    # --- planning ------------------------------------------------------------------------------
    queue: list[dict]               # CandidateSpec dicts still to try (pinned first, then the last plan)
    iteration: int                  # candidates started so far (the budget counts these)
    current: Optional[dict]         # {spec, source, source_hash, attempt, last_failure, fixed_source, verify}
    # --- outcomes ------------------------------------------------------------------------------
    candidates: Annotated[list[dict], operator.add]   # one record per attempt (failed or verified)
    best: Optional[dict]            # the best verified candidate record so far
    dense: Optional[dict]           # dense (cuBLAS / CPU torch.matmul) timing record at the main N
    decisions: Annotated[list[dict], operator.add]    # {node, action, rationale, iteration}
    events: Annotated[list[dict], operator.add]       # fallbacks, skipped tools, notes
    token_usage: Annotated[dict, add_usage]
    done: bool
    stop_reason: str
    final: dict                     # finalize's verdict: chosen kernel, selection basis, reason


class InputState(TypedDict, total=False):
    """What a person fills in in LangGraph Studio: a matrix file and the run's settings."""

    matrix_path: str                # .mtx, .smtx, .npz, .pt, .safetensors (optionally .gz)
    tensor: Optional[str]           # tensor name inside a .pt/.safetensors checkpoint
    target: str                     # GPU to plan for (A100, H100, H200, ... or auto)
    n: Any                          # N (int) or list of N values
    dtype: str                      # float16 | bfloat16 | float32
    backend: str                    # auto | cuda | interpret
    budget: Optional[int]           # max candidates


@dataclass
class Context:
    """Run-time settings (LangGraph ``context_schema``): not checkpointed, supplied per invocation.

    ``policy`` and ``memory`` may carry ready objects (run_graph builds them); when absent
    (Studio) they are built from ``llm`` / ``memory_path`` once per run and cached.
    """

    target: str = "A100"
    n_values: list[int] = field(default_factory=lambda: [16])
    dtype: str = "float16"
    backend: str = "auto"            # resolved to 'cuda' or 'interpret' by `resolved_backend`
    budget: Optional[int] = None     # max candidates; None -> 8 on GPU, 4 on the interpreter
    max_debug_attempts: int = 2
    time_budget_s: Optional[float] = None
    llm: Any = None                  # LangChain chat model, a model name, or None (expert policy)
    memory_path: Optional[str] = None
    use_memory: bool = True
    approve: bool = False            # interrupt() for human approval before finalizing
    seed: int = 0
    near_roofline: float = 0.8       # stop once the best reaches this fraction of the roofline
    plateau: int = 2                 # stop after this many candidates without ...
    plateau_gain: float = 0.03       # ... more than this relative improvement
    verify_timeout_s: float = 300.0
    bench_repeats: Optional[int] = None     # None -> 20 on a GPU, 1 on the interpreter (CPU timings)
    bench_warmup: Optional[int] = None      # None -> 5 on a GPU, 0 on the interpreter
    baselines: Optional[list[str]] = None   # None -> the harness default set
    ncu: str = "best"                # Nsight Compute per candidate: "all", "best" (new best only), "off"
    policy: Any = None               # a ready Policy object (overrides llm)
    memory: Any = None               # a ready Memory object (overrides memory_path)
    hooks: Any = None                # test hooks: {"before_node": callable(node, state)}


OVERRIDABLE = ("target", "n_values", "dtype", "backend", "budget", "max_debug_attempts",
               "time_budget_s", "seed", "approve", "near_roofline", "plateau", "plateau_gain")


def effective_context(ctx: Optional[Context], state: dict) -> Context:
    """The context with the state's ``settings`` (Studio's input form) applied on top.

    Returns the same object when there is nothing to override, so cached resources stay shared.
    """
    if ctx is None:
        ctx = Context()
    elif isinstance(ctx, dict):  # a server may hand the context over as a plain mapping
        ctx = Context(**{k: v for k, v in ctx.items() if k in {f.name for f in dataclasses.fields(Context)}})
    overrides = {k: v for k, v in (state.get("settings") or {}).items() if k in OVERRIDABLE and v is not None}
    if not overrides:
        return ctx
    return dataclasses.replace(ctx, **overrides)


def resolved_backend(ctx: Context) -> str:
    """'cuda' when asked for or when auto finds a GPU; else the Triton interpreter on the CPU."""
    if ctx.backend in ("cuda", "interpret"):
        return ctx.backend
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "interpret"
    except Exception:  # pragma: no cover - torch is a hard dependency
        return "interpret"


def resolved_budget(ctx: Context) -> int:
    if ctx.budget is not None:
        return int(ctx.budget)
    return 8 if resolved_backend(ctx) == "cuda" else 4


def resolved_repeats(ctx: Context) -> int:
    if ctx.bench_repeats is not None:
        return int(ctx.bench_repeats)
    return 20 if resolved_backend(ctx) == "cuda" else 1


def resolved_warmup(ctx: Context) -> int:
    if ctx.bench_warmup is not None:
        return int(ctx.bench_warmup)
    return 5 if resolved_backend(ctx) == "cuda" else 0


def main_n(ctx: Context) -> int:
    """The N that benchmarks and cost estimates use: the first of the requested N values."""
    return int(ctx.n_values[0])


# ---- per-run resources (policy, memory) --------------------------------------------------------

_RESOURCES: dict[tuple, Any] = {}
_LOCK = threading.Lock()


def run_policy(ctx: Context, run_id: str):
    """The policy deciding this run: ``ctx.policy``, else LLM (when ``ctx.llm``) or expert."""
    if ctx.policy is not None:
        return ctx.policy
    key = ("policy", run_id, id(ctx.llm) if ctx.llm is not None and not isinstance(ctx.llm, str) else ctx.llm)
    with _LOCK:
        pol = _RESOURCES.get(key)
        if pol is None:
            pol = _RESOURCES[key] = build_policy(ctx)
        return pol


def build_policy(ctx: Context):
    from sparseditto.agents.expert import ExpertPolicy

    expert = ExpertPolicy(near_roofline=ctx.near_roofline, plateau=ctx.plateau, plateau_gain=ctx.plateau_gain)
    from sparseditto.llm import resolve_llm

    model = resolve_llm(ctx.llm)  # None -> $SPARSEDITTO_LLM_MODEL when set, else no LLM
    if model is None:
        return expert
    from sparseditto.agents.llm_policy import LLMPolicy

    return LLMPolicy(model, fallback=expert)


def run_memory(ctx: Context):
    """The trajectory memory for this run, or None when disabled or unavailable."""
    if not ctx.use_memory:
        return None
    if ctx.memory is not None:
        return ctx.memory
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


# ---- small helpers every node uses -------------------------------------------------------------

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
    hooks = ctx.hooks or {}
    fn = hooks.get("before_node") if isinstance(hooks, dict) else None
    if fn is not None:
        fn(node, state)


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

    Returns ``(answer, new_events, usage_delta)``: the LLM policy appends fallback events and
    accumulates token usage on itself; the graph state records only what this call added, so
    the totals stay right across checkpoints and resumes.
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
