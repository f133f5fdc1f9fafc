"""SparseDitto: agents that plan, write, verify and profile GPU kernels fitted to a sparse pattern.

The public names are imported lazily so that `import sparseditto` stays cheap and works on a
machine without a GPU, CuPy or Triton: the heavy modules load only when their names are used.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "SparseMatrix": "sparseditto.matrix",
    "load_matrix": "sparseditto.io",
    "analyze": "sparseditto.analysis",
    "PatternReport": "sparseditto.analysis",
    "get_target": "sparseditto.targets",
    "list_targets": "sparseditto.targets",
    "Target": "sparseditto.targets",
    "run_graph": "sparseditto.api",
    "Result": "sparseditto.api",
    "bench": "sparseditto.benchmark",
    "run_batch": "sparseditto.batch.runner",
    "load_bundle": "sparseditto.batch.bundle",
    "patch_model": "sparseditto.batch.patch",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sparseditto' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
