"""Tools the agents call: static checks, sandboxed compile/verify, cold-L2 benchmarks, ncu."""
