"""Which weights a batch works on, and which of them can share a search.

Layers of one model are usually the same shape and pruned the same way, so the batch groups them
by a *pattern signature*: shape, value dtype, pattern class and the class's defining parameter
(the N:M ratio and axis, the block shape, else the sparsity to the nearest 5%). The first layer
of a group gets the full search; the others start from its winner. Layers whose exact structure
signature (the hash of the sparsity structure itself) is equal share one kernel outright.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from sparseditto.batch.weights import WeightRef

SPARSITY_BUCKET = 0.05


@dataclass
class Selection:
    """The weights to work on, and every other tensor with the reason it is left out."""

    chosen: list[WeightRef] = field(default_factory=list)
    skipped: list[tuple[WeightRef, str]] = field(default_factory=list)


def compile_select(select: str | None) -> re.Pattern | None:
    if select is None:
        return None
    try:
        return re.compile(select)
    except re.error as exc:
        raise ValueError(f"select={select!r} is not a valid regular expression: {exc}.") from None


def select_weights(refs: list[WeightRef], select: str | None) -> Selection:
    """2-D weights (and 4-D conv weights, im2col'd) whose name matches ``select`` (re.search)."""
    pattern = compile_select(select)
    out = Selection()
    for ref in refs:
        if pattern is not None and not pattern.search(ref.name):
            out.skipped.append((ref, f"name does not match select={select!r}"))
        elif ref.matrix_shape is None:
            out.skipped.append((ref, f"{len(ref.shape)}-D tensor: not a 2-D weight or a 4-D conv weight"))
        elif ref.dtype not in ("float16", "bfloat16", "float32", "float64"):
            out.skipped.append((ref, f"dtype {ref.dtype}: not a floating-point weight"))
        elif min(ref.matrix_shape) < 1:
            out.skipped.append((ref, f"empty weight of shape {ref.shape}"))
        else:
            out.chosen.append(ref)
    return out


def group_key(report: dict, dtype: str) -> str:
    """The pattern signature layers are grouped by (readable, stable across runs)."""
    m, k = report["shape"]
    pattern = report["pattern"]
    params = report.get("params") or {}
    if pattern == "nm" and params.get("nm"):
        detail = f"{params['nm']}/{params.get('axis', 'row')}"
    elif pattern == "block" and params.get("block_shape"):
        bm, bk = params["block_shape"]
        detail = f"block{bm}x{bk}"
    else:
        bucket = round(float(report["sparsity"]) / SPARSITY_BUCKET) * SPARSITY_BUCKET
        detail = f"s{bucket:.2f}"
    return f"{m}x{k}|{dtype}|{pattern}|{detail}"
