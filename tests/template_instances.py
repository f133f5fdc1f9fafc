"""Load template instances in-process for the kernel tests (shared by the CSR and tensor-core tests).

Triton's JIT needs real source files, so an instance's source is written to a temporary file and
imported under a name derived from its hash; modules are cached per source hash so a parameter set
compiles once per session.
"""
from __future__ import annotations

import importlib.util
import sys

from sparseditto.kernel_templates.registry import get_template

_LOADED: dict[str, object] = {}


def load_candidate(name: str, params: dict, tmp_path_factory):
    """Instantiate (the registry rewrites PARAMS), write and import a template instance, cached."""
    cand = get_template(name).instantiate(params)
    if cand.source_hash not in _LOADED:
        path = tmp_path_factory.mktemp("cand") / f"cand_{cand.source_hash[:16]}.py"
        path.write_text(cand.source)
        modname = f"sparseditto_test_cand_{cand.source_hash[:16]}"
        spec = importlib.util.spec_from_file_location(modname, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[modname] = module
        spec.loader.exec_module(module)
        _LOADED[cand.source_hash] = module
    return _LOADED[cand.source_hash]
