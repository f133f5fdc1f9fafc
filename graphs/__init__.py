"""LangGraph wiring of the SparseDitto agents (installed as ``sparseditto.graphs``)."""
