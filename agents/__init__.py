"""The agents of the SparseDitto graph: its nodes, the services they share, the policies (installed as ``sparseditto.agents``)."""
