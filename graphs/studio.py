"""The graph LangGraph Studio serves (``langgraph.json`` points here: ``./graphs/studio.py:graph``).

Studio cannot hand over an in-memory matrix, so this variant starts with the loader node
(`sparseditto.agents.loader.load_input`): a person types a matrix path and the run's settings into
the input form. Everything after that is the same graph `run_graph` runs.

Compiled without a checkpointer: ``langgraph dev`` and LangGraph Platform supply their own.
"""
from __future__ import annotations

import os
import sys


def _use_interpreter_without_gpu() -> None:
    """On a CPU-only server, Triton must be told to interpret before it is first imported."""
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

from sparseditto.agents.loader import load_input  # noqa: E402  (after the interpreter choice)
from sparseditto.graphs.build import compile_graph  # noqa: E402

graph = compile_graph(checkpointer=None, loader=load_input)
