"""The graph's shared state, Studio's input form, the run-time settings (`Context`) and their rules.

State is plain data (dicts, lists, strings, numbers) so that every update can be checkpointed to
SQLite, streamed to Studio and replayed on resume. Big objects never enter it: the matrix lives in
the artifact store (`sparseditto.artifacts`) and the state holds its key; the chat model, the
policy and the memory connection live in `Context` / the per-run resource cache
(`sparseditto.agents.kit`), never in state.

Lists that only grow (candidates, decisions, events) use an ``operator.add`` reducer, so a node
returns just its new items and a resumed run appends instead of overwriting.

The settings a person or a caller gives (dtype, backend, N values, budget) are validated here, once,
for both entry points: `run_graph` and the Studio form.
"""
from __future__ import annotations

import dataclasses
import operator
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
    """Everything the agents share. See the module docstring for what may live here."""

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
    candidates: Annotated[list[dict], operator.add]   # CandidateRecord dumps, one per attempt
    best: Optional[dict]            # the best verified CandidateRecord dump so far
    dense: Optional[dict]           # dense (cuBLAS / CPU torch.matmul) timing record at the main N
    decisions: Annotated[list[dict], operator.add]    # {node, action, rationale, iteration}
    events: Annotated[list[dict], operator.add]       # fallbacks, skipped tools, notes
    token_usage: Annotated[dict, add_usage]
    done: bool
    stop_reason: str
    final: dict                     # finalize's verdict: chosen kernel, selection basis, reason, speedups


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


# ---- validation of the settings (both entry points) --------------------------------------------

def check_dtype(dtype: str) -> str:
    if dtype not in DTYPES:
        raise ValueError(f"Unsupported dtype {dtype!r}; expected one of {', '.join(DTYPES)}.")
    return dtype


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"Unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}.")
    return backend


MAX_N = 1 << 20          # columns of B; the harness verifies up to this many
MAX_BUDGET = 1000


def parse_n_values(n, *, text: bool = False) -> list[int]:
    """N values (columns of B) from an int or a list of ints, duplicates dropped in order.
    ``text=True`` also accepts decimal strings ("16"): what a form field delivers."""
    values = list(n) if isinstance(n, (list, tuple)) else [n]
    if not values:
        raise ValueError("Expected at least one N value (columns of B), got an empty list.")
    out = []
    for v in values:
        if text and isinstance(v, str) and v.strip().isdigit() and str(int(v)) == v.strip():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) and not hasattr(v, "__index__"):
            raise ValueError(f"Expected integer N values (columns of B), got {v!r} in n={n!r}.")
        v = int(v)
        if v <= 0:
            raise ValueError(f"Expected N >= 1 (columns of B), got {v} in n={n!r}.")
        if v > MAX_N:
            raise ValueError(f"N = {v} is larger than the supported maximum of {MAX_N} columns of B (n={n!r}).")
        out.append(v)
    return list(dict.fromkeys(out))


def check_budget(budget, *, text: bool = False) -> int:
    """A positive number of candidates (``text=True``: a decimal string too)."""
    if text and isinstance(budget, str) and budget.strip().isdigit():
        budget = int(budget)
    if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
        raise ValueError(f"Expected budget to be a positive number of candidates, got {budget!r}.")
    if budget > MAX_BUDGET:
        raise ValueError(f"budget = {budget} candidates is more than the supported maximum of {MAX_BUDGET}.")
    return budget


def check_seed(seed) -> int:
    """The user's seed (values of pattern-only files): a non-negative int below 2**63."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"Expected seed to be a non-negative int, got {seed!r}.")
    if seed >= 2 ** 63:
        raise ValueError(f"Expected seed below 2**63, got {seed}.")
    return seed


# ---- settings resolved against the machine ----------------------------------------------------

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
