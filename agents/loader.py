"""Loader node (LangGraph Studio's entry): a matrix path and settings typed into the input form.

Studio cannot hand over an in-memory matrix, so its graph starts here: the loader validates the
form (the same rules `run_graph` applies), loads the matrix (``.mtx``, ``.smtx``, ``.npz``, ``.pt``,
``.safetensors``, optionally gzipped) into the artifact store and keeps the settings in
``state.settings``, which the other nodes apply on top of the run context.
"""
from __future__ import annotations

import time
import uuid
from typing import Literal

from langgraph.runtime import Runtime
from langgraph.types import Command

from sparseditto.agents.kit import decision, emit
from sparseditto.agents.state import (Context, InputState, check_backend, check_budget, check_dtype,
                                      effective_context, parse_n_values)


def settings_from_input(inp: dict) -> dict:
    """Validate the Studio form and turn it into Context overrides (ValueError on bad values)."""
    settings: dict = {}
    target = inp.get("target")
    if target:
        from sparseditto.targets import resolve_target

        resolve_target(target, fallback="A100")  # raises ValueError for an unknown GPU
        settings["target"] = target
    n = inp.get("n")
    if n not in (None, "", []):
        settings["n_values"] = parse_n_values(n, text=True)
    if inp.get("dtype"):
        settings["dtype"] = check_dtype(inp["dtype"])
    if inp.get("backend"):
        settings["backend"] = check_backend(inp["backend"])
    if inp.get("budget") not in (None, ""):
        settings["budget"] = check_budget(inp["budget"], text=True)
    return settings


def load_input(state: InputState, runtime: Runtime[Context]) -> Command[Literal["planner"]]:
    """Load the matrix named in the form into the artifact store; keep the settings."""
    from sparseditto.artifacts import put_matrix
    from sparseditto.io import load_matrix

    path = state.get("matrix_path")
    if not path:
        raise ValueError("Studio input needs 'matrix_path': a .mtx/.smtx/.npz/.pt/.safetensors file.")
    settings = settings_from_input(state)
    seed = effective_context(runtime.context, {}).seed
    matrix = load_matrix(path, tensor=state.get("tensor"), seed=seed)
    key = put_matrix(matrix)
    emit("load_input", f"loaded {matrix.name}: {matrix.shape[0]}x{matrix.shape[1]}, nnz={matrix.nnz}")
    d = decision("load_input", "load", f"matrix {matrix.name} from {path}; settings {settings or 'from context'}")
    return Command(goto="planner", update={
        "matrix_key": key, "matrix_name": matrix.name, "run_id": uuid.uuid4().hex, "started_at": time.time(),
        "settings": settings, "iteration": 0, "decisions": [d]})
