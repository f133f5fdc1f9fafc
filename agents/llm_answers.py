"""Reading the model's answers: the JSON or Python in a reply, and whether a plan or a diagnosis
is usable.

Why apart from the policy: a reply is untrusted text. Everything that turns it into data the graph
acts on (a `PlanDecision` naming real templates with legal parameters, a complete candidate module,
a `Diagnosis` that can be carried out) is here, pure and testable without a model.
"""
from __future__ import annotations

import json
import re
from typing import Any

from .policy import Diagnosis, PlanDecision, PlanningInput
from .tools import clip


class InvalidAnswer(ValueError):
    """The model answered, but not with something the graph can use."""



# ---- parsing helpers ---------------------------------------------------------------------------
def message_text(message: Any) -> str:
    """The text of a chat reply (string content, or the text blocks of a list content)."""
    content = getattr(message, "content", message)
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict) and block.get("type") in ("text", "output_text"):
                parts.append(str(block.get("text", "")))
        return "".join(parts)
    return "" if content is None else str(content)


_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)


def extract_json(text: str) -> dict:
    """The first JSON object in a reply: a ```json block, a bare object, or one inside prose."""
    candidates = [body for lang, body in _FENCE.findall(text) if lang.lower() in ("json", "")]
    candidates.append(text)
    decoder = json.JSONDecoder()
    for chunk in candidates:
        for match in re.finditer(r"\{", chunk):
            try:
                obj, _ = decoder.raw_decode(chunk, match.start())
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                return obj
    raise InvalidAnswer(f"no JSON object in the reply: {clip(text.strip(), 200)!r}")


_DEF_PREPARE = re.compile(r"^def\s+prepare\s*\(", re.MULTILINE)
_DEF_SPMM = re.compile(r"^def\s+spmm\s*\(", re.MULTILINE)


def is_complete_source(source: str) -> bool:
    """Defines both contract functions at module level (syntax is the harness's job)."""
    return bool(_DEF_PREPARE.search(source) and _DEF_SPMM.search(source))


def extract_python(text: str) -> str | None:
    """The one complete candidate module in a reply: the ```python block defining prepare() and
    spmm() (the longest such block if the model wrote several), or the whole reply when it is bare
    code. None when no complete module is there."""
    blocks = [body for lang, body in _FENCE.findall(text) if lang.lower() in ("python", "py", "python3", "")]
    complete = [b for b in blocks if is_complete_source(b)]
    if complete:
        return max(complete, key=len).strip("\n") + "\n"
    if "```" not in text and is_complete_source(text):
        return text.strip("\n") + "\n"
    return None


def first_prose_line(text: str) -> str:
    """The first line of a reply outside its code blocks (the coder's one-line explanation)."""
    for line in _FENCE.sub("", text).splitlines():
        if line.strip():
            return line.strip()
    return ""


# ---- validation --------------------------------------------------------------------------------
def _legal_params(entry: dict | None, name: str) -> dict | None:
    """Legal values per parameter for a template: from its planning entry, else the registry."""
    if entry and isinstance(entry.get("params"), dict) and all(isinstance(v, (list, tuple)) for v in entry["params"].values()):
        return entry["params"]
    from sparseditto.kernel_templates.registry import get_template

    try:
        return dict(get_template(name).params)
    except ValueError:   # not a registry template
        return None


def validate_plan(decision: PlanDecision, inp: PlanningInput) -> list[str]:
    """Problems that make a plan unusable (empty list = valid). Parameter values that spell a
    legal value ("32" for 32) are normalized in place."""
    problems: list[str] = []
    if decision.action == "stop":
        return problems
    if not decision.candidates:
        return ["action 'try' with no candidates"]
    entries = {t.get("name"): t for t in inp.templates if t.get("name")}
    names = set(entries) | {"dense"}
    if not entries:
        from sparseditto.kernel_templates.registry import list_templates

        names |= {t.name for t in list_templates()}
    for i, spec in enumerate(decision.candidates):
        if names and spec.template not in names:
            problems.append(f"candidate {i + 1}: unknown template '{spec.template}' "
                            f"(applicable: {', '.join(sorted(names))})")
            continue
        if spec.template == "dense":
            continue
        if spec.origin == "llm" and spec.source is not None and not is_complete_source(spec.source):
            problems.append(f"candidate {i + 1}: 'source' does not define prepare() and spmm()")
        legal = _legal_params(entries.get(spec.template), spec.template)
        if legal is None:
            continue
        for key, value in list(spec.params.items()):
            if key not in legal:
                problems.append(f"candidate {i + 1}: {spec.template} has no parameter '{key}' "
                                f"(parameters: {', '.join(legal)})")
                continue
            choices = list(legal[key])
            fixed = _coerce_choice(value, choices)
            if fixed is _ILLEGAL:
                problems.append(f"candidate {i + 1}: {spec.template}.{key}={value!r} is not legal "
                                f"(legal: {choices})")
            else:
                spec.params[key] = fixed
    return problems


_ILLEGAL = object()


def _coerce_choice(value: Any, choices: list) -> Any:
    """``value`` if legal, else the legal choice it spells ("32" or 32.0 for 32, "True" for True);
    models often quote numbers in JSON. ``_ILLEGAL`` when nothing matches."""
    for choice in choices:  # the legal value itself (so 4.0 comes back as the legal 4)
        if choice == value and isinstance(choice, bool) == isinstance(value, bool):
            return choice
    text = str(value).strip()
    for choice in choices:
        if str(choice) == text or (isinstance(choice, (int, float)) and not isinstance(choice, bool)
                                   and _as_number(text) == choice):
            return choice
    return _ILLEGAL


def _as_number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def validate_diagnosis(diag: Diagnosis, known_templates: list[str]) -> list[str]:
    if diag.action == "retry_params" and not diag.params:
        return ["action 'retry_params' without params"]
    if diag.action == "retry_source":
        if not diag.source:
            return ["action 'retry_source' without a source"]
        if not is_complete_source(diag.source):
            return ["'source' does not define prepare() and spmm()"]
    if diag.action == "switch_template":
        if not diag.template:
            return ["action 'switch_template' without a template"]
        if known_templates and diag.template not in known_templates:
            return [f"unknown template '{diag.template}' (known: {', '.join(known_templates)})"]
    return []
