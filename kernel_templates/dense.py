"""The built-in dense entry: torch.matmul (cuBLAS) on the densified matrix, run by the harness itself.

It is the floor every sparse kernel must beat, listed beside the templates so the planner costs it
the same way. It has no kernel file (its Candidate's source is empty: generated code may never call
a vendor GEMM); this module holds its META and its planning hooks, like a template's planning
module.
"""
from __future__ import annotations

from sparseditto.kernel_templates.cost import VALUE_BYTES, CostTerms, dense_bytes

META = {
    "name": "dense", "backend": "builtin", "format": "dense",
    "description": "Dense cuBLAS GEMM (torch.matmul) run by the harness itself: the floor every sparse kernel must beat",
    "params": {}, "defaults": {}, "patterns": ["dense"],
}
APPLICABILITY = "always (the baseline)"
COST_MODEL = "bytes = (M*K + K*N + M*N)*vb; flops 2*M*K*N on tensor cores (fp32: CUDA cores)"


def applicable(stats, template) -> tuple[bool, str]:
    return True, "dense cuBLAS is always a candidate (the floor to beat)"


def grid(stats, n: int, target, template) -> list[dict]:
    return []   # no parameters: the defaults are the only point


def cost(stats, n: int, dtype: str, target, params: dict) -> CostTerms:
    # fp32 runs on CUDA cores: torch keeps TF32 off for matmul by default
    return CostTerms(a_bytes=dense_bytes(stats.m, stats.k, VALUE_BYTES[dtype]), flops=2.0 * stats.m * stats.k * n,
                     unit="cuda_core" if dtype == "float32" else "tensor")
