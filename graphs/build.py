"""Wire the agents into one LangGraph StateGraph: which nodes, which entry, nothing else.

Nodes route themselves by returning ``Command(goto=...)`` with ``Command[Literal[...]]`` return
annotations, so the only static edge is the entry; LangGraph (and Studio) read the annotations and
draw the real edges:

    START -> planner -> analyzer -> planner -> coder -> debugger <-> coder
                                                      debugger -> profiler -> planner ... -> finalize -> END
                                                      debugger -> planner (gave up / switch template)

`build_graph(loader=load_input)` puts a loader in front for LangGraph Studio, where a person
types a matrix path and settings instead of handing over an in-memory matrix.
"""
from __future__ import annotations

from typing import Callable

from langgraph.graph import START, StateGraph

from sparseditto.agents.analyzer import analyzer
from sparseditto.agents.coder import coder
from sparseditto.agents.debugger import debugger
from sparseditto.agents.finalize import finalize
from sparseditto.agents.planner import planner
from sparseditto.agents.profiler import profiler
from sparseditto.agents.state import Context, InputState, State

NODES = {"planner": planner, "analyzer": analyzer, "coder": coder, "debugger": debugger, "profiler": profiler,
         "finalize": finalize}


def build_graph(loader: Callable | None = None) -> StateGraph:
    """The uncompiled graph. Compile it with a checkpointer (run_graph) or without (Studio).

    ``loader``: an optional first node named ``load_input`` taking `InputState` (Studio's form);
    without it the graph starts at the planner with ``matrix_key`` already in the input.
    """
    if loader is not None:
        builder = StateGraph(State, context_schema=Context, input_schema=InputState)
        builder.add_node("load_input", loader)
        entry = "load_input"
    else:
        builder = StateGraph(State, context_schema=Context)
        entry = "planner"
    for name, node in NODES.items():
        builder.add_node(name, node)
    builder.add_edge(START, entry)
    return builder


def compile_graph(checkpointer=None, loader: Callable | None = None, **kwargs):
    """Compiled graph; ``checkpointer`` makes runs resumable by thread id."""
    return build_graph(loader).compile(checkpointer=checkpointer, name="sparseditto", **kwargs)
