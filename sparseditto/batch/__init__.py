"""Batch jobs over a model's layers: `run_batch` (a kernel per weight, a report, a bundle),
`load_bundle` (the kernels without the agents) and `patch_model` (the kernels back into an
nn.Module). Names load lazily, like the package root."""
from __future__ import annotations

import importlib

_LAZY = {
    "run_batch": "sparseditto.batch.runner",
    "BatchReport": "sparseditto.batch.models",
    "LayerResult": "sparseditto.batch.models",
    "load_bundle": "sparseditto.batch.bundle",
    "Bundle": "sparseditto.batch.bundle",
    "patch_model": "sparseditto.batch.patch",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sparseditto.batch' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
