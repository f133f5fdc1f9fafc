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
from typing import Annotated, Any, Literal, Optional, Union, get_args

from pydantic import Field
from typing_extensions import TypedDict  # pydantic reads TypedDict schemas from typing_extensions on 3.10/3.11

# The settings with a fixed set of values: Literal types give Studio its dropdowns.
Dtype = Literal["float16", "bfloat16", "float32"]
Backend = Literal["auto", "cuda", "interpret"]
NcuMode = Literal["all", "best", "off"]
DTYPES: tuple[str, ...] = get_args(Dtype)
BACKENDS: tuple[str, ...] = get_args(Backend)


def add_usage(left: Optional[dict], right: Optional[dict]) -> dict:
    """Reducer for token usage: sum numeric fields (nested ones too: the per-role totals), so each
    node reports only its delta."""
    out = dict(left or {})
    for key, value in (right or {}).items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = out.get(key, 0) + value
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = add_usage(out[key], value)
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
    llm_calls: Annotated[list[dict], operator.add]    # LLMCall.summary() of every model request (the text is in memory)
    token_usage: Annotated[dict, add_usage]           # RunTokenUsage dump: totals + by_role
    done: bool
    stop_reason: str
    final: dict                     # finalize's verdict: chosen kernel, selection basis, reason, speedups


class InputState(TypedDict, total=False):
    """What a person fills in in LangGraph Studio: a matrix file and the run's settings."""

    matrix_path: Annotated[str, Field(description="the matrix file: .mtx, .smtx, .npz, .pt/.pth or .safetensors, "
                                                  "optionally gzipped (a path on the server's machine)")]
    tensor: Annotated[Optional[str], Field(description="the tensor's name inside a .pt/.safetensors/.npz file "
                                                       "holding several")]
    target: Annotated[str, Field(description="GPU to plan for: A100, H100, H200, ... or auto")]
    n: Annotated[Union[int, list[int]], Field(description="N, the columns of B: a number or a list (the first is "
                                                          "benchmarked, all are verified)")]
    dtype: Annotated[Dtype, Field(description="value dtype of A, B and C")]
    backend: Annotated[Backend, Field(description="cuda (a GPU), interpret (Triton interpreter on the CPU) "
                                                  "or auto")]
    budget: Annotated[Optional[int], Field(description="maximum number of candidate kernels (empty: 8 on a GPU, "
                                                       "4 on the interpreter)")]


def _setting(default: Any = dataclasses.MISSING, *, description: str, default_factory: Any = dataclasses.MISSING):
    """A Context field with the description LangGraph Studio shows beside it (pydantic reads
    ``metadata["description"]`` when it builds the context's JSON schema)."""
    return field(default=default, default_factory=default_factory, metadata={"description": description})


@dataclass
class Context:
    """Run-time settings (LangGraph ``context_schema``): not checkpointed, supplied per invocation.

    This is exactly what LangGraph Studio shows under "Manage Assistants" -> context, so every field
    is plain data with a description, and choices are ``Literal`` (Studio draws a dropdown). Ready
    Python objects (a policy, an open memory, test hooks) never belong here: `RunContext` adds them
    for `run_graph`.
    """

    target: str = _setting("A100", description="GPU to plan for: A100, H100, H200, L40S, RTX4090, ... "
                                                 "(`sparseditto targets`), or auto (the local GPU; A100 without one)")
    n_values: list[int] = _setting(default_factory=lambda: [16], description="N values (columns of B in C = A @ B); "
                                   "the first is benchmarked and costed, all are verified")
    dtype: Dtype = _setting("float16", description="value dtype of A, B and C (accumulation is float32)")
    backend: Backend = _setting("auto", description="where kernels run: cuda (a GPU), interpret (the Triton "
                                "interpreter on the CPU: correctness only, the cost model ranks) or auto")
    budget: Optional[int] = _setting(None, description="maximum number of candidate kernels to try "
                                     "(empty: 8 on a GPU, 4 on the interpreter)")
    max_debug_attempts: int = _setting(2, description="fix-and-retry attempts per candidate after a failed "
                                       "verification, before switching template")
    time_budget_s: Optional[float] = _setting(None, description="stop starting new candidates after this many "
                                              "seconds of wall-clock time (empty: no limit)")
    llm: Optional[str] = _setting(None, description="chat model name for the LLM policy, e.g. gpt-4o-mini "
                                  "(OPENAI_BASE_URL / OPENAI_API_KEY from the server's .env); empty: "
                                  "$SPARSEDITTO_LLM_MODEL, else the deterministic expert policy")
    max_llm_tokens: Optional[int] = _setting(None, description="LLM token budget of the run (prompt + completion "
                                             "tokens of every request); once the next request would pass it, the "
                                             "expert policy answers the remaining steps (empty: no limit)")
    max_llm_cost: Optional[float] = _setting(None, description="LLM cost budget of the run in US dollars, priced "
                                             "with llm_price; once the next request would pass it, the expert "
                                             "policy answers the remaining steps (empty: no limit)")
    llm_price: Optional[tuple[float, float]] = _setting(None, description="price of the model: [US dollars per "
                                                        "million prompt tokens, per million completion tokens]; "
                                                        "needed by max_llm_cost, and shown as cost_usd in the "
                                                        "token usage")
    memory_path: Optional[str] = _setting(None, description="SQLite file of the optimization memory (empty: "
                                          "$SPARSEDITTO_MEMORY, else memory.sqlite in the cache directory)")
    use_memory: bool = _setting(True, description="reuse kernels of identical patterns and start from similar "
                                "ones; record this run")
    approve: bool = _setting(False, description="pause before accepting a kernel (an interrupt); resume with "
                             "true to accept it or false to keep dense")
    seed: int = _setting(0, description="seed of the values drawn for pattern-only files (.smtx, Matrix Market "
                         "pattern)")
    near_roofline: float = _setting(0.8, description="stop once the best kernel reaches this fraction of its "
                                    "roofline (GPU timings only)")
    plateau: int = _setting(2, description="stop after this many candidates in a row without more than "
                            "plateau_gain relative improvement")
    plateau_gain: float = _setting(0.03, description="the relative improvement that counts as progress for "
                                   "plateau")
    verify_timeout_s: float = _setting(300.0, description="seconds one candidate's verification may take before "
                                       "it counts as a hang")
    bench_repeats: Optional[int] = _setting(None, description="timed repeats per benchmark (empty: 20 on a GPU, "
                                            "1 on the interpreter)")
    bench_warmup: Optional[int] = _setting(None, description="untimed warm-up launches (empty: 5 on a GPU, "
                                           "0 on the interpreter)")
    baselines: Optional[list[str]] = _setting(None, description="vendor libraries timed beside each candidate "
                                              "(empty: the harness's default set)")
    ncu: NcuMode = _setting("best", description="Nsight Compute profile per candidate: all, best (each new best) "
                            "or off")


@dataclass
class RunContext(Context):
    """`Context` plus the ready Python objects `run_graph` hands over. Kept out of `Context` so they
    never appear in Studio's schema (they are not data a person could type)."""

    chat_model: Any = None           # a LangChain chat model object (overrides ``llm``)
    policy: Any = None               # a ready Policy object (overrides llm / chat_model)
    memory: Any = None               # a ready Memory object (overrides memory_path)
    hooks: Any = None                # test hooks: {"before_node": callable(node, state)}


def ready_object(ctx: Context, name: str) -> Any:
    """``ctx.<name>`` for the objects only a `RunContext` carries (None on a plain Context)."""
    return getattr(ctx, name, None)


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


def check_llm_budget(max_llm_tokens, max_llm_cost, llm_price) -> tuple[Optional[int], Optional[float], Optional[tuple]]:
    """The run's LLM budget settings, checked: a positive token count, a non-negative dollar
    amount that comes with a price."""
    from sparseditto.llm import check_price

    if max_llm_tokens is not None and (isinstance(max_llm_tokens, bool) or not isinstance(max_llm_tokens, int)
                                       or max_llm_tokens <= 0):
        raise ValueError(f"Expected max_llm_tokens to be a positive number of tokens, got {max_llm_tokens!r}.")
    price = check_price(llm_price)
    if max_llm_cost is not None:
        if isinstance(max_llm_cost, bool) or not isinstance(max_llm_cost, (int, float)) or not max_llm_cost >= 0:
            raise ValueError(f"Expected max_llm_cost to be a non-negative number of US dollars, got {max_llm_cost!r}.")
        if price is None:
            raise ValueError("max_llm_cost needs llm_price=(USD per million prompt tokens, USD per million "
                             "completion tokens) to turn tokens into dollars.")
        max_llm_cost = float(max_llm_cost)
    return max_llm_tokens, max_llm_cost, price


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


def verify_n_values(ctx: Context) -> list[int]:
    """The requested N values plus an odd one (exercises masks and tails), sorted and unique."""
    values = sorted({int(n) for n in ctx.n_values})
    if not any(v % 2 for v in values):
        values.append(5 if max(values) > 5 else max(values) + 1)
    return sorted(set(values))
