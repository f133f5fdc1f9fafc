"""Which chat model (if any) drives the agents, and what it cost.

SparseDitto runs without any LLM (the expert policy). An LLM is opted into by passing a LangChain
chat model, or a model name, to ``run_graph(..., llm=...)``, or by setting ``SPARSEDITTO_LLM_MODEL``.
A name builds ``ChatOpenAI``, which talks to OpenAI or to any OpenAI-compatible server (vLLM,
Ollama, LM Studio, llama.cpp server) through ``OPENAI_BASE_URL``; local servers ignore the API key,
so a placeholder is used when ``OPENAI_API_KEY`` is unset. Settings are chosen for reproducible,
bounded steps: temperature 0, one retry, a timeout, because an unreachable or slow server must turn
into a quick fallback to the expert policy, not a hung graph.
"""
from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel

#: Names that mean "no LLM" when given as a model name (e.g. ``sparseditto run --llm expert``).
NO_LLM_NAMES = ("", "expert", "none", "off")
DEFAULT_TIMEOUT_S = 120.0


def _timeout_from_env() -> float:
    raw = os.environ.get("SPARSEDITTO_LLM_TIMEOUT")
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"SPARSEDITTO_LLM_TIMEOUT must be a number of seconds, got {raw!r}.") from None
    if value <= 0:
        raise ValueError(f"SPARSEDITTO_LLM_TIMEOUT must be positive, got {value}.")
    return value


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
        max_retries=1,
        temperature=0,
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
    """Tokens spent by the LLM policy over a run (from each reply's ``usage_metadata``)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    calls: int = 0

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
