"""Which chat model (if any) drives the agents, and what it cost.

SparseDitto runs without any LLM (the expert policy). An LLM is opted into by passing a LangChain
chat model, or a model name, to ``run_graph(..., llm=...)``, or by setting ``SPARSEDITTO_LLM_MODEL``.
A name builds ``ChatOpenAI``, which talks to OpenAI or to any OpenAI-compatible server (vLLM,
Ollama, LM Studio, llama.cpp server) through ``OPENAI_BASE_URL``; local servers ignore the API key,
so a placeholder is used when ``OPENAI_API_KEY`` is unset. Settings are chosen for reproducible,
bounded steps: temperature 0 and a timeout, because an unreachable or slow server must turn into a
quick fallback to the expert policy, not a hung graph. The client itself does not retry: the LLM
policy does (a rate limit honouring Retry-After, a server error), within bounds it records.

Also here, because memory, api and cli read them as well as the agents: the transcript record of
one call (`LLMCall`) and the token/cost accounting (`TokenUsage`, `RunTokenUsage`, `call_cost`).
"""
from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel, Field

#: Names that mean "no LLM" when given as a model name (e.g. ``sparseditto run --llm expert``).
NO_LLM_NAMES = ("", "expert", "none", "off")
DEFAULT_TIMEOUT_S = 120.0


def seconds_from_env(name: str, default: float, *, allow_zero: bool = False) -> float:
    """A number of seconds from the environment variable ``name`` (``default`` when unset);
    ValueError naming the variable when it is not a positive (or, ``allow_zero``, >= 0) number."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {raw!r}.") from None
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else 'positive'}, got {value}.")
    return value


def _timeout_from_env() -> float:
    return seconds_from_env("SPARSEDITTO_LLM_TIMEOUT", DEFAULT_TIMEOUT_S)


def resolve_llm(llm: Any = None, *, timeout: float | None = None):
    """The chat model to use, or None for the expert policy.

    ``llm`` is a LangChain chat model (returned as is), a model name (builds ``ChatOpenAI`` against
    ``OPENAI_BASE_URL``), or None (``SPARSEDITTO_LLM_MODEL`` when set, else no LLM). The names in
    ``NO_LLM_NAMES`` ("expert", "none", ...) also mean no LLM.
    """
    from langchain_core.language_models import BaseChatModel

    if isinstance(llm, BaseChatModel):
        return llm
    if llm is None:
        llm = os.environ.get("SPARSEDITTO_LLM_MODEL")
        if llm is None:
            return None
    if not isinstance(llm, str):
        raise ValueError(f"Expected a LangChain chat model, a model name or None for llm, got {type(llm).__name__}: {llm!r}.")
    name = llm.strip()
    if name.lower() in NO_LLM_NAMES:
        return None
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model=name,
        base_url=os.environ.get("OPENAI_BASE_URL") or None,
        api_key=os.environ.get("OPENAI_API_KEY") or "not-needed",
        timeout=timeout if timeout is not None else _timeout_from_env(),
        max_retries=0,        # the LLM policy retries itself, within its own bounds, and records it
        temperature=0,
        stream_usage=True,    # token usage also when LangChain streams the call (Studio)
    )


def describe_llm(model: Any) -> dict[str, Any]:
    """What memory records about a chat model: class, model name, base URL, sampling settings.
    Never the API key."""
    if model is None:
        return {"model": None}
    name = None
    for attr in ("model_name", "model", "model_id"):
        value = getattr(model, attr, None)
        if isinstance(value, str) and value:
            name = value
            break
    info: dict[str, Any] = {"class": type(model).__name__, "model": name or type(model).__name__}
    base_url = getattr(model, "openai_api_base", None) or getattr(model, "base_url", None)
    info["base_url"] = str(base_url) if base_url else None
    for attr in ("temperature", "max_retries", "request_timeout", "max_tokens"):
        value = getattr(model, attr, None)
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            info["timeout" if attr == "request_timeout" else attr] = value
    return info


class TokenUsage(BaseModel):
    """Tokens (and, with a price, US dollars) spent by LLM calls: one call, one role, or a run."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    calls: int = 0
    cost_usd: float = 0.0

    def add(self, message: Any) -> "TokenUsage":
        """Count one model reply. Accepts an AIMessage or a usage dict (LangChain's
        ``input_tokens``/``output_tokens`` or OpenAI's ``prompt_tokens``/``completion_tokens``);
        a reply without usage still counts as a call."""
        usage = message if isinstance(message, dict) else getattr(message, "usage_metadata", None)
        self.calls += 1
        if not usage:
            return self
        prompt = int(usage.get("input_tokens", usage.get("prompt_tokens", 0)) or 0)
        completion = int(usage.get("output_tokens", usage.get("completion_tokens", 0)) or 0)
        total = int(usage.get("total_tokens", 0) or 0) or prompt + completion
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        self.total_tokens += total
        return self


class RunTokenUsage(TokenUsage):
    """A run's LLM spend: the totals plus one `TokenUsage` per role (planner, coder, debugger).

    Built from the run's transcript (`LLMCall` records), so the totals and the per-role split can
    never disagree with what was stored."""

    by_role: dict[str, TokenUsage] = Field(default_factory=dict)

    @classmethod
    def of_calls(cls, calls: "list[LLMCall]") -> "RunTokenUsage":
        out = cls()
        for call in calls:
            for target in (out, out.by_role.setdefault(call.role, TokenUsage())):
                target.calls += call.outcome == "ok"   # answered requests (failed ones cost nothing)
                target.prompt_tokens += call.prompt_tokens
                target.completion_tokens += call.completion_tokens
                target.total_tokens += call.total_tokens
                target.cost_usd += call.cost_usd
        return out

    def as_update(self) -> dict:
        """The graph-state form (plain data, summed key by key by the state's reducer)."""
        return self.model_dump(mode="json")


def check_price(price: Any) -> tuple[float, float] | None:
    """``llm_price``: (USD per million prompt tokens, USD per million completion tokens), or None."""
    if price is None:
        return None
    if isinstance(price, str):
        price = [p for p in price.replace("/", ",").split(",") if p.strip()]
    try:
        values = tuple(float(p) for p in price)
    except (TypeError, ValueError):
        raise ValueError(f"llm_price must be two numbers (USD per million prompt tokens, per million "
                         f"completion tokens), got {price!r}.") from None
    if len(values) != 2 or any(not v >= 0 for v in values):
        raise ValueError(f"llm_price must be two non-negative numbers (USD per million prompt tokens, per "
                         f"million completion tokens), got {price!r}.")
    return values[0], values[1]


def call_cost(prompt_tokens: int, completion_tokens: int, price: tuple[float, float] | None) -> float:
    """US dollars of one call at ``price`` (0 without a price)."""
    if price is None:
        return 0.0
    return (prompt_tokens * price[0] + completion_tokens * price[1]) / 1e6


#: How an LLM call ended: "ok" (an answer came back), "error" (the request failed: HTTP error,
#: timeout, connection), "skipped" is never stored (a step the budget stopped makes no call).
CALL_OUTCOMES = ("ok", "error")


class LLMCall(BaseModel):
    """One request to the chat model, as the transcript keeps it.

    Why a record per call: what an LLM-driven run cost, where its time went and why a step was
    answered by the expert must be readable after the fact (``sparseditto memory show RUN --llm``)
    and in Studio's state. ``prompt`` / ``reply`` hold the text (the user message of the request
    and the answer; the system prompts are files of the package, named by ``role``); the state and
    `Result` keep `summary()` only (no text).
    """

    role: str                              # planner | coder | debugger
    model: str | None = None
    round: int = 0                         # tool round within the step (coder), 0 otherwise
    prompt_hash: str                       # sha256 of the request's messages (system + user + tool turns)
    prompt_chars: int
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cost_usd: float = 0.0
    latency_s: float = 0.0                 # wall time of the request, retries and their waits included
    attempts: int = 1                      # HTTP requests made (1 + retries)
    retries: list[dict[str, Any]] = Field(default_factory=list)   # {error_type, reason, wait_s}
    outcome: str = "ok"                    # one of CALL_OUTCOMES
    error_type: str | None = None
    fallback_reason: str | None = None     # set when the step this call served fell back to the expert
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)   # {name, args, result} (clipped)
    prompt: str = ""
    reply: str = ""
    started_at: float = 0.0
    node: str | None = None                # the graph node that asked (set when stored)
    call_idx: int | None = None            # its index in the run's transcript in the memory

    def summary(self, reply_chars: int = 160) -> dict:
        """What the graph state keeps of the call (Studio shows it): no prompt text, the start of
        the reply, the names of the tools called. The full text is in the memory's transcript."""
        out = self.model_dump(mode="json", exclude={"prompt"})
        out["reply"] = " ".join(self.reply.split())[:reply_chars]
        out["tool_calls"] = [{"name": t.get("name")} for t in self.tool_calls]
        return out
