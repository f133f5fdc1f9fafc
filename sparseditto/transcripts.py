"""The LLM transcript of a run in the memory file: one row per model request.

Why a table of its own (``llm_calls``) beside the trajectory steps: a request is the unit an LLM
run is paid and debugged by (its role, its prompt's hash and size, the answer, tokens, latency,
retries, and the fallback reason when the step was answered by the expert). Columns make "which
role spent the tokens" and "which prompts failed" one SQL query; the trajectory keeps a small
``prompt`` step pointing at the row, so the order of prompts among decisions is still there.

`TranscriptStore` is mixed into `sparseditto.memory.Memory`: the same file, connection, lock and
write transactions, so the one-writer-per-run rule holds (during a run only ``agents/kit.py``
writes). `format_transcript` is what ``sparseditto memory show RUN --llm`` prints.
"""
from __future__ import annotations

import json
from typing import Any

from sparseditto.llm import LLMCall, RunTokenUsage

TABLE = "llm_calls"
_JSON_COLUMNS = ("retries", "tool_calls")
_COLUMNS = ("role", "model", "round", "prompt_hash", "prompt_chars", "prompt_tokens", "completion_tokens",
            "total_tokens", "cost_usd", "latency_s", "attempts", "retries", "outcome", "error_type",
            "fallback_reason", "tool_calls", "prompt", "reply", "started_at")


def create_table(db) -> None:
    """The ``llm_calls`` table (created on open when missing: older files gain it)."""
    db[TABLE].create({
        "id": int, "run_id": str, "idx": int, "node": str, "role": str, "model": str, "round": int,
        "prompt_hash": str, "prompt_chars": int, "prompt_tokens": int, "completion_tokens": int,
        "total_tokens": int, "cost_usd": float, "latency_s": float, "attempts": int, "retries": str,
        "outcome": str, "error_type": str, "fallback_reason": str, "tool_calls": str, "prompt": str,
        "reply": str, "started_at": float, "created": str,
    }, pk="id", not_null={"run_id", "idx", "role"}, foreign_keys=[("run_id", "runs", "id")], if_not_exists=True)
    db[TABLE].create_index(["run_id", "idx"], unique=True, if_not_exists=True)


def _row_to_call(row: dict) -> dict:
    out = dict(row)
    for col in _JSON_COLUMNS:
        out[col] = json.loads(out[col]) if out.get(col) else []
    return out


class TranscriptStore:
    """The transcript methods of `Memory` (which provides ``db``, ``_lock``, ``_resolve_run_id``,
    ``_now()`` and ``_writing()``)."""

    def record_llm_call(self, run_id: str, node: str, call: LLMCall | dict) -> int:
        """Append one model request to a run's transcript; returns its index within the run."""
        record = call if isinstance(call, LLMCall) else LLMCall.model_validate(call)
        values: dict[str, Any] = record.model_dump(mode="json", include=set(_COLUMNS))   # node/idx: the row's own
        for col in _JSON_COLUMNS:
            values[col] = json.dumps(values[col], default=str)
        with self._writing():
            run_id = self._resolve_run_id(run_id)
            idx = self.db.execute(f"SELECT COALESCE(MAX(idx), -1) + 1 FROM {TABLE} WHERE run_id = ?",
                                  [run_id]).fetchone()[0]
            self.db[TABLE].insert({"run_id": run_id, "idx": idx, "node": node, "created": self._now(), **values})
        return int(idx)

    def llm_calls(self, run_id: str) -> list[dict]:
        """A run's model requests in order (the `LLMCall` fields plus idx, node, created)."""
        with self._lock:
            run_id = self._resolve_run_id(run_id)
            rows = self.db.query(f"SELECT * FROM {TABLE} WHERE run_id = ? ORDER BY idx", [run_id])
            return [_row_to_call(r) for r in rows]

    def format_transcript(self, run_id: str, *, text_chars: int | None = None) -> str:
        """The transcript as text: per request a header line (role, model, tokens, latency,
        outcome, retries, fallback reason), the prompt sent and the answer (``text_chars``
        clips each; None prints them whole), then the per-role totals."""
        calls = self.llm_calls(run_id)
        run = self._resolve_run_id(run_id)
        if not calls:
            return f"Run {run[:8]} made no LLM call (expert policy, or the model was never asked)."

        def text(value: str) -> str:
            value = value or ""
            if text_chars is not None and len(value) > text_chars:
                return value[:text_chars] + f"\n[... {len(value) - text_chars} more characters]"
            return value

        lines = [f"LLM transcript of run {run[:8]}: {len(calls)} request(s)", ""]
        for c in calls:
            head = (f"#{c['idx']} {c['role']}" + (f" round {c['round']}" if c["round"] else "") +
                    f" [{c['node']}] {c['model'] or '?'}: {c['outcome']}, {c['prompt_tokens']}+"
                    f"{c['completion_tokens']} tokens, {c['latency_s']:.2f} s, prompt {c['prompt_chars']} chars "
                    f"sha256 {c['prompt_hash'][:12]}")
            if c["cost_usd"]:
                head += f", ${c['cost_usd']:.5f}"
            lines.append("=" * 8 + " " + head)
            for r in c["retries"]:
                lines.append(f"retry after {r.get('error_type')} ({r.get('status')}): waited {r.get('wait_s')} s - "
                             f"{r.get('reason')}")
            if c["error_type"]:
                lines.append(f"error: {c['error_type']}")
            if c["fallback_reason"]:
                lines.append(f"fallback to the expert: {c['fallback_reason']}")
            lines += ["--- prompt", text(c["prompt"]), "--- answer", text(c["reply"])]
            for t in c["tool_calls"]:
                lines.append(f"--- tool {t.get('name')}({json.dumps(t.get('args'), default=str)}) -> "
                             f"{' '.join(str(t.get('result', '')).split())[:300]}")
            lines.append("")
        usage = RunTokenUsage.of_calls([LLMCall.model_validate({k: c[k] for k in _COLUMNS}) for c in calls])
        lines.append(f"total: {usage.calls} answered request(s), {usage.prompt_tokens} prompt + "
                     f"{usage.completion_tokens} completion tokens" +
                     (f", ${usage.cost_usd:.4f}" if usage.cost_usd else ""))
        for role, u in sorted(usage.by_role.items()):
            lines.append(f"  {role}: {u.calls} request(s), {u.prompt_tokens} + {u.completion_tokens} tokens"
                         + (f", ${u.cost_usd:.4f}" if u.cost_usd else ""))
        return "\n".join(lines)
