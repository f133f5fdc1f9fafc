"""The graph LangGraph Studio serves (``langgraph.json`` points here: ``./graphs/studio.py:graph``).

Studio cannot hand over an in-memory matrix, so this variant starts with ``load_input``: a person
types a matrix path (``.mtx``, ``.smtx``, ``.npz``, ``.pt``, ``.safetensors``, optionally gzipped)
and the run's settings (target, n, dtype, backend, budget) into the input form; the loader puts the
matrix into the artifact store and the settings into ``state.settings``, which the nodes apply on
top of the run context. Everything after that is the same graph `run_graph` runs.

Compiled without a checkpointer: ``langgraph dev`` and LangGraph Platform supply their own.
"""
from __future__ import annotations

import time
import uuid
from typing import Literal

from langgraph.runtime import Runtime
from langgraph.types import Command

from sparseditto.graphs.state import BACKENDS, DTYPES, Context, InputState, decision, emit


def _use_interpreter_without_gpu() -> None:
    """On a CPU-only server, Triton must be told to interpret before it is first imported."""
    import os
    import sys

    if "triton" in sys.modules or os.environ.get("TRITON_INTERPRET"):
        return
    try:
        import torch

        if torch.cuda.is_available():
            return
    except Exception:
        pass
    os.environ["TRITON_INTERPRET"] = "1"


_use_interpreter_without_gpu()


def _n_values(n) -> list[int] | None:
    if n is None or n == "" or n == []:
        return None
    values = [n] if isinstance(n, (int, str)) else list(n)
    out = []
    for v in values:
        try:
            iv = int(v)
        except (TypeError, ValueError):
            raise ValueError(f"n must be a positive integer or a list of them, got {n!r}.") from None
        if iv <= 0 or str(iv) != str(v).strip():
            raise ValueError(f"n must be a positive integer or a list of them, got {n!r}.")
        out.append(iv)
    return out


def settings_from_input(inp: dict) -> dict:
    """Validate the Studio form and turn it into Context overrides (ValueError on bad values)."""
    settings: dict = {}
    target = inp.get("target")
    if target:
        from sparseditto.targets import resolve_target

        resolve_target(target, fallback="A100")  # raises ValueError for an unknown GPU
        settings["target"] = target
    n_values = _n_values(inp.get("n"))
    if n_values:
        settings["n_values"] = n_values
    dtype = inp.get("dtype")
    if dtype:
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}.")
        settings["dtype"] = dtype
    backend = inp.get("backend")
    if backend:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}.")
        settings["backend"] = backend
    budget = inp.get("budget")
    if budget not in (None, ""):
        if int(budget) <= 0:
            raise ValueError(f"budget must be a positive number of candidates, got {budget!r}.")
        settings["budget"] = int(budget)
    return settings


def load_input(state: InputState, runtime: Runtime[Context]) -> Command[Literal["planner"]]:
    """Load the matrix named in the form into the artifact store; keep the settings."""
    from sparseditto.artifacts import put_matrix
    from sparseditto.io import load_matrix

    path = state.get("matrix_path")
    if not path:
        raise ValueError("Studio input needs 'matrix_path': a .mtx/.smtx/.npz/.pt/.safetensors file.")
    settings = settings_from_input(state)
    seed = runtime.context.seed if runtime.context is not None and hasattr(runtime.context, "seed") else 0
    matrix = load_matrix(path, tensor=state.get("tensor"), seed=seed)
    key = put_matrix(matrix)
    emit("load_input", f"loaded {matrix.name}: {matrix.shape[0]}x{matrix.shape[1]}, nnz={matrix.nnz}")
    d = decision("load_input", "load", f"matrix {matrix.name} from {path}; settings {settings or 'from context'}")
    return Command(goto="planner", update={
        "matrix_key": key, "matrix_name": matrix.name, "run_id": uuid.uuid4().hex, "started_at": time.time(),
        "settings": settings, "iteration": 0, "decisions": [d]})


def _compile():
    from sparseditto.graphs.build import compile_graph

    return compile_graph(checkpointer=None, loader=load_input)


graph = _compile()
