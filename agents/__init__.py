"""The five agents of the SparseDitto graph (installed as ``sparseditto.agents``)."""
