"""How one request to the chat model is made: budget first, then the call with bounded retries,
and a transcript record (`sparseditto.llm.LLMCall`) whatever happened.

Why a module of its own: a real server (OpenAI, vLLM, Ollama, a proxy) fails in a handful of
distinct ways, and each has one right answer. The LLM policy must never hang the graph, never
retry something that cannot succeed, and say afterwards what each call cost and why a step was
answered by the expert:

=================  =====================================================================
failure (kind)     what happens
=================  =====================================================================
rate_limit (429)   retried after the server's Retry-After (``retry-after-ms`` /
                   ``retry-after``) when that is at most ``RetryPolicy.max_wait_s``, else
                   after the back-off; at most ``attempts`` requests. A Retry-After
                   longer than the bound is not waited for: the step falls back at once
server_error (5xx) retried after ``backoff_s``, then twice that, at most ``attempts`` requests
timeout            not retried (the timeout already spent the time): the step falls back
connection         not retried (a server that refuses connections stays down for now)
context_length     not retried as is: `ContextTooLong` lets the policy rebuild a smaller
                   prompt once (`agents/llm_prompts.py` limits, scaled down)
bad_request (4xx)  not retried (the same request fails the same way); the policy may switch
                   structured output to JSON in the text
other              not retried
=================  =====================================================================

The budget (`LLMBudget`: ``max_llm_tokens`` / ``max_llm_cost`` of the run, what the run already
spent) is checked before every request with the request's estimated prompt tokens (4 characters
a token), so a run never starts a call it cannot afford; `BudgetReached` makes the policy hand the
step to the expert.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from sparseditto.llm import LLMCall, call_cost

from .tools import clip

CHARS_PER_TOKEN = 4
MAX_TEXT = 16000          # characters of prompt / reply a transcript record keeps
_CONTEXT_WORDS = re.compile(r"context[ _]length|context window|maximum context|prompt is too long|"
                            r"too many tokens|context_length_exceeded", re.IGNORECASE)
_CONTEXT_NUMBERS = re.compile(r"maximum context length is (\d+) tokens.*?(?:resulted in|requested) (\d+) tokens",
                              re.IGNORECASE | re.DOTALL)


def estimate_tokens(chars: int) -> int:
    """Tokens of a request of ``chars`` characters, before the server counts them."""
    return max(1, math.ceil(chars / CHARS_PER_TOKEN))


# ---- failures ------------------------------------------------------------------------------------
@dataclass
class Failure:
    """One failed request, classified (see the module docstring)."""

    kind: str
    error_type: str
    message: str
    status: int | None = None
    retry_after_s: float | None = None


def _status(exc: BaseException) -> int | None:
    for obj in (exc, getattr(exc, "response", None)):
        value = getattr(obj, "status_code", None)
        if isinstance(value, int):
            return value
    return None


def _retry_after(exc: BaseException) -> float | None:
    headers = getattr(getattr(exc, "response", None), "headers", None)
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) * scale
        except ValueError:
            continue
        if math.isfinite(seconds) and seconds >= 0:
            return seconds
    return None


def classify(exc: BaseException) -> Failure:
    """The kind of a model failure, from the exception's class, HTTP status and message (works
    for the openai client's errors and for any LangChain chat model's)."""
    from langchain_core.exceptions import ContextOverflowError

    name = type(exc).__name__
    text = f"{exc}"
    status = _status(exc)
    base = dict(error_type=name, message=clip(text, 600), status=status)
    if isinstance(exc, ContextOverflowError) or (status in (400, 413, None) and _CONTEXT_WORDS.search(text)
                                                 and "Timeout" not in name):
        return Failure("context_length", **base)
    if status == 429 or "RateLimit" in name:
        return Failure("rate_limit", retry_after_s=_retry_after(exc), **base)
    if status is not None and status >= 500 or "InternalServer" in name:
        return Failure("server_error", retry_after_s=_retry_after(exc), **base)
    if "Timeout" in name or isinstance(exc, TimeoutError):
        return Failure("timeout", **base)
    if "Connection" in name or isinstance(exc, ConnectionError):
        return Failure("connection", **base)
    if status is not None and 400 <= status < 500 or "BadRequest" in name:
        return Failure("bad_request", **base)
    return Failure("other", **base)


class LLMCallFailed(RuntimeError):
    """A request that failed for good (after any retries); ``record`` is its transcript entry."""

    def __init__(self, failure: Failure, record: LLMCall):
        super().__init__(f"{failure.error_type}: {failure.message}")
        self.failure = failure
        self.record = record


class ContextTooLong(LLMCallFailed):
    """The prompt is over the model's context window; ``limit`` / ``requested`` when the server said."""

    def __init__(self, failure: Failure, record: LLMCall):
        super().__init__(failure, record)
        found = _CONTEXT_NUMBERS.search(failure.message)
        self.limit = int(found.group(1)) if found else None
        self.requested = int(found.group(2)) if found else None

    def shrink_factor(self, floor: float = 0.2) -> float:
        """How much smaller the next prompt should be: to 80% of the window when the server gave
        both numbers, else a quarter."""
        if self.limit and self.requested and self.requested > self.limit:
            return max(floor, 0.8 * self.limit / self.requested)
        return 0.25


class BudgetReached(RuntimeError):
    """The run's LLM token or cost budget does not allow this request: the expert answers."""


# ---- the budget -----------------------------------------------------------------------------------
@dataclass
class LLMBudget:
    """The run's LLM budget and what it has spent (the graph state's totals, plus this step's)."""

    max_tokens: int | None = None
    max_cost: float | None = None
    price: tuple[float, float] | None = None    # USD per million prompt / completion tokens
    spent_tokens: int = 0
    spent_cost: float = 0.0

    @property
    def limited(self) -> bool:
        return self.max_tokens is not None or self.max_cost is not None

    def check(self, prompt_tokens: int) -> None:
        """BudgetReached unless a request of ``prompt_tokens`` (estimated) still fits."""
        if self.max_tokens is not None and self.spent_tokens + prompt_tokens > self.max_tokens:
            raise BudgetReached(f"LLM token budget reached: {self.spent_tokens} of max_llm_tokens="
                                f"{self.max_tokens} used, the next request needs about {prompt_tokens}")
        if self.max_cost is not None:
            next_cost = call_cost(prompt_tokens, 0, self.price)
            if self.spent_cost + next_cost > self.max_cost:
                raise BudgetReached(f"LLM cost budget reached: ${self.spent_cost:.4f} of max_llm_cost="
                                    f"${self.max_cost:.4f} spent, the next request costs about ${next_cost:.4f}")

    def charge(self, record: LLMCall) -> None:
        self.spent_tokens += record.total_tokens
        self.spent_cost += record.cost_usd


# ---- retries -------------------------------------------------------------------------------------
@dataclass
class RetryPolicy:
    """Bounds of the retries (see the module docstring's table)."""

    attempts: int = 3            # requests per call at most, the first included
    backoff_s: float = 0.5       # first wait after a server error (doubles)
    max_wait_s: float = 20.0     # longest Retry-After honoured; longer ones are not waited for
    retry_kinds: tuple[str, ...] = ("rate_limit", "server_error")

    def wait_for(self, failure: Failure, attempt: int) -> float | None:
        """Seconds to wait before the next request, or None when this failure is final."""
        if failure.kind not in self.retry_kinds or attempt >= self.attempts:
            return None
        if failure.retry_after_s is not None:
            return failure.retry_after_s if failure.retry_after_s <= self.max_wait_s else None
        return min(self.max_wait_s, self.backoff_s * 2 ** (attempt - 1))


# ---- the caller ----------------------------------------------------------------------------------
def messages_digest(messages: list) -> tuple[str, int]:
    """(sha256 of the request's messages, their total characters): a transcript's identity and size."""
    parts = []
    for m in messages:
        content = m.content if isinstance(m.content, str) else json.dumps(m.content, default=str)
        calls = getattr(m, "tool_calls", None) or []
        parts.append(f"{m.type}\x1f{content}\x1f{json.dumps(calls, default=str, sort_keys=True)}")
    blob = "\x1e".join(parts)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest(), len(blob)


def reply_message(result: Any) -> Any:
    """The AIMessage of a result: itself, or ``raw`` of a structured-output result."""
    if isinstance(result, dict) and "raw" in result:
        return result["raw"]
    return result


def _usage(message: Any) -> tuple[int, int, int]:
    usage = getattr(message, "usage_metadata", None) or {}
    prompt = int(usage.get("input_tokens", usage.get("prompt_tokens", 0)) or 0)
    completion = int(usage.get("output_tokens", usage.get("completion_tokens", 0)) or 0)
    total = int(usage.get("total_tokens", 0) or 0) or prompt + completion
    return prompt, completion, total


@dataclass
class ModelCaller:
    """Makes the requests of one policy: ``invoke(...)`` -> (result, transcript record)."""

    model_name: str | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    budget: LLMBudget = field(default_factory=LLMBudget)
    sleep: Callable[[float], None] = time.sleep

    def invoke(self, role: str, runnable: Any, messages: list, prompt_text: str, *, round_no: int = 0) -> tuple[Any, LLMCall]:
        """One call: budget check, request(s), record. Raises BudgetReached (no request made),
        ContextTooLong or LLMCallFailed (the record is on the exception)."""
        digest, chars = messages_digest(messages)
        self.budget.check(estimate_tokens(chars))
        record = LLMCall(role=role, model=self.model_name, round=round_no, prompt_hash=digest, prompt_chars=chars,
                         prompt=clip(prompt_text, MAX_TEXT), started_at=round(time.time(), 3))
        start = time.perf_counter()
        attempt = 0
        while True:
            attempt += 1
            try:
                result = runnable.invoke(messages)
            except Exception as exc:
                failure = classify(exc)
                wait = self.retry.wait_for(failure, attempt)
                if failure.retry_after_s is not None and failure.retry_after_s > self.retry.max_wait_s:
                    failure.message += (f" (Retry-After {failure.retry_after_s:g} s is beyond the "
                                        f"{self.retry.max_wait_s:g} s bound: not waited for)")
                if wait is None:
                    record.attempts, record.outcome, record.error_type = attempt, "error", failure.error_type
                    record.reply = f"{failure.error_type}: {failure.message}"
                    record.latency_s = round(time.perf_counter() - start, 4)
                    raise (ContextTooLong if failure.kind == "context_length" else LLMCallFailed)(failure, record) from exc
                record.retries.append({"error_type": failure.error_type, "status": failure.status,
                                       "reason": clip(failure.message, 300), "wait_s": round(wait, 3)})
                self.sleep(wait)
                continue
            break
        message = reply_message(result)
        prompt, completion, total = _usage(message)
        record.attempts = attempt
        record.prompt_tokens, record.completion_tokens, record.total_tokens = prompt, completion, total
        record.cost_usd = call_cost(prompt, completion, self.budget.price)
        record.latency_s = round(time.perf_counter() - start, 4)
        self.budget.charge(record)
        return result, record
