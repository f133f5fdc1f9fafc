"""Baselines a batch times once per shape (dense cuBLAS), and which vendor libraries a layer times.

Why: a 7B checkpoint has 224 weights in a handful of shapes. Dense cuBLAS depends only on the
shape, dtype and N (never on where the nonzeros are), so the batch times it once per
(shape, dtype, N, backend) and every reused layer of that shape is compared with that one time:
the first searched layer of a shape seeds it with the dense timing its search measured, and a
shape nobody searched yet is timed once through the harness. Vendor sparse libraries (cuSPARSE,
cuSPARSELt, Triton BSR) depend on the sparsity structure, so they are never shared: a reused
layer times one itself, the fastest that ran on its group's first layer (a library that refused
that layer's pattern, such as cuSPARSELt on a non-2:4 weight, refuses its group-mates too).

The cache travels in `BatchSettings` (so worker processes start from what the driver knew; a
worker hands back what it timed or seeded with its layers, and the driver merges it, so with
several workers a shape's dense is still timed about once) and holds timings only on a GPU; on the
interpreter nothing is timed (times are cost-model estimates).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DenseTiming:
    """Dense cuBLAS for one shape: the graph-launched time (None when capture failed) and eager."""

    graph_ms: float | None
    eager_ms: float
    source: str                   # what measured it: "search of <layer>" or "timed for <layer>"

    def for_basis(self, graph: bool) -> float:
        """The time to compare a kernel with: graph vs graph when the kernel was graph-timed."""
        return self.graph_ms if graph and self.graph_ms is not None else self.eager_ms


@dataclass
class ShapeBaselines:
    """Dense timings by (shape, dtype, N, backend), filled once per shape within a batch process."""

    dense: dict[tuple, DenseTiming] = field(default_factory=dict)
    timed: int = 0                # how many dense timings this cache ran itself (the rest were seeded)

    @staticmethod
    def key(shape, dtype: str, n: int, backend: str) -> tuple:
        return (tuple(int(s) for s in shape), dtype, int(n), backend)

    def seed(self, shape, dtype: str, n: int, backend: str, dense: dict | None, source: str) -> None:
        """Keep a search's dense timing (``Result.dense``: {"median_ms", "graph", "eager"}) for the shape."""
        if not dense or not dense.get("timings_are_gpu"):
            return
        eager = (dense.get("eager") or {}).get("median_ms") or dense.get("median_ms")
        graph = (dense.get("graph") or {}).get("median_ms")
        if eager:
            self.dense.setdefault(self.key(shape, dtype, n, backend), DenseTiming(graph, eager, source))

    def merge(self, other: dict[tuple, DenseTiming]) -> None:
        """Take in another process's dense timings (a batch worker's, returned with its layers), so
        the driver's later jobs carry them and no worker times a shape's dense again."""
        for key, timing in (other or {}).items():
            self.dense.setdefault(tuple(key), timing)

    def dense_for(self, A, dtype: str, n: int, backend: str, *, repeats: int = 50, warmup: int = 5) -> DenseTiming:
        """The shape's dense timing, measured now (once) when no layer of this shape has one."""
        key = self.key(A.shape, dtype, n, backend)
        if key not in self.dense:
            from sparseditto import harness
            from sparseditto.kernel_templates.registry import get_template

            res = harness.bench(get_template("dense").instantiate({}), A, n, dtype=dtype, backend=backend,
                                repeats=repeats, warmup=warmup, baselines=False, time_dense=False)
            graph = res.candidate_graph.median_ms if res.candidate_graph is not None else None
            self.dense[key] = DenseTiming(graph, res.candidate.median_ms, f"timed for {A.name}")
            self.timed += 1
        return self.dense[key]


def vendor_names(lead_vendors: dict[str, float] | None) -> list[str]:
    """The vendor baseline a reused layer times: the fastest of those that ran on its group's
    first layer. Its group-mates share shape, pattern class and sparsity, so the library that won
    there is the one to beat here; timing the others again (each converts the weight to its own
    format and verifies it) took most of a reused layer's timing phase on the H200 (an 11008 x 4096
    layer: 4.7 s of 15.5 s with three libraries)."""
    timed = {name: ms for name, ms in (lead_vendors or {}).items() if ms is not None and name != "cublas_dense"}
    return [min(timed, key=timed.get)] if timed else []
