"""The pattern report: what a sparse matrix looks like, in the terms a kernel choice depends on.

``analyze(matrix)`` is the analyzer agent's tool. It measures (``sparseditto.pattern_features``)
the facts that decide which kernel family wins -- density, row/column nnz balance, empty
rows/columns, N:M conformance (1:2, 2:4, 4:8 along rows and columns), block occupancy for 8..128
blocks, bandwidth, degree tail -- classifies the pattern (``sparseditto.pattern_classes``, whose
docstring lists the rules), and hashes the structure into a ``signature`` so the memory can
recognise a pattern it has optimized before, whatever the values.

The report is a pydantic model: JSON round-trips exactly (``model_dump_json`` /
``model_validate_json``), ``describe()`` is the short JSON an LLM prompt gets, and
``feature_vector()`` is the normalized vector the memory uses for nearest-neighbour lookups.
"""
from __future__ import annotations

import json
import math
import time
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field

from sparseditto.matrix import SparseMatrix
from sparseditto.pattern_classes import PATTERNS, classify
from sparseditto.pattern_features import NM_RATIOS, compute_features, diag_band, gini

__all__ = ["BlockStat", "FEATURE_NAMES", "NnzStats", "PatternReport", "analyze", "check_canonical", "diag_band"]

Pattern = Literal["dense", "unstructured", "block", "nm", "row_pruned", "column_pruned", "banded", "power_law"]

DESCRIBE_MAX_CHARS = 1500

# The fixed order of ``PatternReport.feature_vector()``; every entry is scaled to about [0, 1].
FEATURE_NAMES: tuple[str, ...] = (
    "density",
    "log_aspect",             # 0.5 + log2(rows / cols) / 16, clipped: 0.5 = square
    "log_size",               # log2(rows * cols) / 40
    "row_cv",                 # cv / (1 + cv)
    "col_cv",
    "row_gini",
    "col_gini",
    "empty_row_fraction",
    "empty_col_fraction",
    "nm_best_conformance",    # best over 1:2, 2:4, 4:8 and both axes
    "nm_2_4_row_conformance",
    "nm_2_4_col_conformance",
    "block_best_occupancy",   # occupancy at best_block_shape, 0 without block structure
    "block_16x16_density",    # fraction of 16x16 blocks that hold a nonzero
    "block_16x16_occupancy",
    "diag_fraction",
    "relative_bandwidth",     # 99.5%-quantile |i - j| / min(rows, cols), clipped to 1
    "powerlaw_indicator",     # r2 of the degree-tail fit, 0 when no fit
    "powerlaw_alpha",         # alpha / 4, clipped; 0 when no fit
) + tuple(f"is_{p}" for p in PATTERNS)


class NnzStats(BaseModel):
    """Distribution of nonzeros per row (or per column), empty lines included."""

    mean: float
    std: float
    min: int
    max: int
    cv: float = Field(description="std / mean (0 when mean is 0): load imbalance between lines")
    gini: float = Field(description="Gini coefficient: 0 = perfectly even, towards 1 = a few lines hold everything")


class BlockStat(BaseModel):
    """Block structure at one aligned block shape (rows x cols)."""

    shape: tuple[int, int]
    nonzero_blocks: int
    total_blocks: int
    block_density: float = Field(description="nonzero_blocks / total_blocks")
    occupancy: float = Field(description="nnz / (nonzero_blocks * bm * bk): how full a stored block is")


class PatternReport(BaseModel):
    """Everything the planner, the templates and the memory need to know about a sparsity pattern."""

    name: str
    shape: tuple[int, int]
    nnz: int
    density: float
    sparsity: float
    dtype: str
    row_stats: NnzStats
    col_stats: NnzStats
    empty_rows: int
    empty_cols: int
    nm_conformance: dict[str, dict[str, float]] = Field(
        description="'n:m' -> {'row', 'col'}: fraction of m-entry groups (along a row / down a column, the tail "
                    "zero-padded) holding at most n nonzeros")
    blocks: list[BlockStat]
    best_block_shape: tuple[int, int] | None = Field(
        description="block shape a BSR tensor-core kernel should use; None without block structure")
    bandwidth: int = Field(description="max |i - j| over the nonzeros (0 when there are none)")
    diag_fraction: float = Field(
        description="fraction of nonzeros with |i - j| <= max(1, floor(0.01 * min(rows, cols)))")
    powerlaw_alpha: float | None = None
    powerlaw_r2: float | None = None
    pattern: Pattern
    confidence: float = Field(ge=0.0, le=1.0)
    params: dict[str, Any] = Field(default_factory=dict)
    scores: dict[str, float] = Field(default_factory=dict)
    evidence: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="the numbers each class rule looked at (see sparseditto.pattern_classes)")
    signature: str
    analysis_seconds: float
    explicit_zeros_dropped: int = Field(
        default=0, description="stored entries whose value was 0 (scipy explicit zeros, zeros inside a BSR tensor's "
                               "blocks): dropped before the analysis, so they count as zeros, not nonzeros")

    # ---- views ------------------------------------------------------------------------------
    def block_stat(self, shape) -> BlockStat | None:
        """The measured BlockStat for ``shape`` (bm, bk), or None if that shape was not measured."""
        shape = tuple(int(x) for x in shape)
        return next((b for b in self.blocks if tuple(b.shape) == shape), None)

    def best_nm(self) -> tuple[str, str, float]:
        """(ratio, axis, conformance) with the highest conformance; ties go to the finer group."""
        best = ("2:4", "row", 0.0)
        best_key = None
        for ratio, axes in self.nm_conformance.items():
            group = int(ratio.split(":")[1])
            for axis, value in axes.items():
                key = (round(value, 6), -group)
                if best_key is None or key > best_key:
                    best, best_key = (ratio, axis, value), key
        return best

    def describe(self) -> str:
        """A short JSON string (<= 1500 chars) with the facts an LLM needs to pick a kernel."""
        ratio, axis, conformance = self.best_nm()
        facts: dict[str, Any] = {
            "name": self.name[:80],
            "shape": list(self.shape),
            "nnz": self.nnz,
            "sparsity": round(self.sparsity, 4),
            "dtype": self.dtype,
            "pattern": self.pattern,
            "confidence": round(self.confidence, 3),
            "params": self.params,
            "rows": {"mean": round(self.row_stats.mean, 2), "cv": round(self.row_stats.cv, 3),
                     "min": self.row_stats.min, "max": self.row_stats.max, "empty": self.empty_rows},
            "cols": {"mean": round(self.col_stats.mean, 2), "cv": round(self.col_stats.cv, 3),
                     "min": self.col_stats.min, "max": self.col_stats.max, "empty": self.empty_cols},
            "best_nm": {"ratio": ratio, "axis": axis, "conformance": round(conformance, 4)},
        }
        if self.best_block_shape is not None:
            b = self.block_stat(self.best_block_shape)
            facts["best_block"] = {"shape": list(self.best_block_shape), "occupancy": round(b.occupancy, 4),
                                   "block_density": round(b.block_density, 4)}
        if self.pattern == "banded" or self.diag_fraction >= 0.5:
            facts["bandwidth"] = self.bandwidth
            facts["diag_fraction"] = round(self.diag_fraction, 4)
        if self.powerlaw_alpha is not None and self.pattern == "power_law":
            facts["powerlaw"] = {"alpha": round(self.powerlaw_alpha, 3), "r2": round(self.powerlaw_r2 or 0.0, 3)}
        if self.explicit_zeros_dropped:
            facts["explicit_zeros_dropped"] = self.explicit_zeros_dropped
        facts["signature"] = self.signature
        text = json.dumps(facts, separators=(",", ":"), default=str)
        if len(text) > DESCRIBE_MAX_CHARS:   # params are the only open-ended part: keep them short
            facts["params"] = {k: v for k, v in self.params.items() if isinstance(v, (int, float, str, bool))}
            text = json.dumps(facts, separators=(",", ":"), default=str)[:DESCRIBE_MAX_CHARS]
        return text

    def explain(self) -> str:
        """One sentence: why this pattern class, in the numbers the class rule looked at (for people:
        `sparseditto analyze`, the demo; `describe` is the LLM's compact view)."""
        p, ev = self.params, self.evidence.get(self.pattern) or {}
        if self.pattern == "block":
            bm, bk = p["block_shape"]
            lift = f", {ev['lift']:.0f}x fuller than random placement would make them" if ev.get("lift") else ""
            return (f"{bm}x{bk} blocks: {p['block_density']:.1%} of the block grid holds a nonzero, and those "
                    f"blocks are {p['occupancy']:.0%} full{lift}: a block kernel (tensor cores) skips the empty ones")
        if self.pattern == "nm":
            n, m = p["nm"]
            chance = f" (random placement: {ev['chance_conformance']:.0%})" if "chance_conformance" in ev else ""
            return (f"{n}:{m} along {p['axis']}s: {p['conformance']:.1%} of the {m}-entry groups hold at most {n} "
                    f"nonzeros{chance}: values plus 2-bit positions, as sparse tensor cores read them")
        if self.pattern in ("row_pruned", "column_pruned"):
            rows = self.pattern == "row_pruned"
            axis, kept = ("rows", p.get("kept_rows")) if rows else ("columns", p.get("kept_cols"))
            total = self.shape[0] if axis == "rows" else self.shape[1]
            density = p.get("kept_density")
            inside = f"; the kept part is {density:.0%} dense" if density is not None else ""
            return (f"{total - kept} of {total} {axis} are empty (random placement: "
                    f"{ev.get('expected_empty', 0):.0f}){inside}: a dense GEMM on the kept {axis} does the work")
        if self.pattern == "banded":
            return (f"99.5% of the nonzeros lie within |i - j| <= {p['bandwidth']} ({ev.get('ratio', 0):.1%} of the "
                    f"width; the farthest is {p['bandwidth_max']}): a banded matrix")
        if self.pattern == "power_law":
            axis = "column" if p.get("axis") == "col" else "row"
            alpha = f", power-law exponent {p['alpha']:.2f}" if p.get("alpha") else ""
            return (f"{axis} degrees are heavy-tailed: cv {ev.get('cv', 0):.2f} vs {ev.get('cv_random', 0):.2f} "
                    f"for random placement, the largest {ev.get('max_over_mean', 0):.1f}x the mean{alpha}: "
                    f"nnz-balanced work splitting")
        if self.pattern == "dense":
            return (f"only {self.sparsity:.1%} of the entries are zero: no sparse format reads fewer bytes than "
                    "dense, so cuBLAS dense is the answer")
        rival, score = max(((k, v) for k, v in self.scores.items() if k != "unstructured"), key=lambda kv: kv[1],
                           default=("none", 0.0))
        return (f"no structure beyond its density ({self.sparsity:.1%} sparse): the strongest structured rule "
                f"({rival}) scores {score:.2f} of the 0.5 it needs: row-wise CSR kernels")

    def feature_vector(self) -> list[float]:
        """Normalized features in FEATURE_NAMES order (each about [0, 1]) for nearest-neighbour lookup."""
        m, k = self.shape
        _, _, best_conf = self.best_nm()
        best_block = self.block_stat(self.best_block_shape) if self.best_block_shape else None
        b16 = self.block_stat((16, 16))
        q = self.evidence.get("banded", {}).get("q995", self.bandwidth)

        def squash(x: float) -> float:
            return x / (1.0 + x)

        def clip(x: float) -> float:
            return float(min(1.0, max(0.0, x)))

        values = [
            clip(self.density),
            clip(0.5 + math.log2(m / k) / 16.0),
            clip(math.log2(m * k) / 40.0),
            squash(self.row_stats.cv),
            squash(self.col_stats.cv),
            clip(self.row_stats.gini),
            clip(self.col_stats.gini),
            self.empty_rows / m,
            self.empty_cols / k,
            clip(best_conf),
            clip(self.nm_conformance.get("2:4", {}).get("row", 0.0)),
            clip(self.nm_conformance.get("2:4", {}).get("col", 0.0)),
            clip(best_block.occupancy) if best_block else 0.0,
            clip(b16.block_density) if b16 else 0.0,
            clip(b16.occupancy) if b16 else 0.0,
            clip(self.diag_fraction),
            clip((q + 1) / min(m, k)) if self.nnz else 0.0,
            clip(self.powerlaw_r2) if self.powerlaw_r2 is not None else 0.0,
            clip(self.powerlaw_alpha / 4.0) if self.powerlaw_alpha is not None else 0.0,
        ] + [1.0 if self.pattern == p else 0.0 for p in PATTERNS]
        return [float(v) for v in values]

    @staticmethod
    def feature_names() -> tuple[str, ...]:
        return FEATURE_NAMES


# ---- analysis -----------------------------------------------------------------------------------
def _nnz_stats(counts: np.ndarray) -> NnzStats:
    if counts.size == 0:
        return NnzStats(mean=0.0, std=0.0, min=0, max=0, cv=0.0, gini=0.0)
    mean = float(counts.mean())
    std = float(counts.std())
    return NnzStats(mean=mean, std=std, min=int(counts.min()), max=int(counts.max()),
                    cv=std / mean if mean > 0 else 0.0, gini=gini(counts))


def check_canonical(A: SparseMatrix) -> None:
    """Raise ValueError unless ``A`` is canonical CSR (the signature and the counts rely on it).

    SparseMatrix checks lengths on construction; sortedness, uniqueness and index range cost a
    pass over nnz (~50 ms for 22M nonzeros), so they are checked here, where they matter.
    """
    m, k = A.shape
    indptr, indices = A.indptr, A.indices
    if indptr[0] != 0 or (m > 0 and np.any(np.diff(indptr) < 0)):
        raise ValueError(f"Matrix '{A.name}': indptr must start at 0 and never decrease, got indptr[:5]={indptr[:5]}.")
    if A.nnz == 0:
        return
    low, high = int(indices.min()), int(indices.max())
    if low < 0 or high >= k:
        bad = low if low < 0 else high
        raise ValueError(f"Matrix '{A.name}' of shape {A.shape} has column index {bad} out of range [0, {k}).")
    unsorted = np.diff(indices) <= 0
    starts = indptr[1:-1]
    unsorted[starts[(starts > 0) & (starts < A.nnz)] - 1] = False   # a new row may start anywhere
    if unsorted.any():
        p = int(np.argmax(unsorted)) + 1
        row = int(np.searchsorted(indptr, p, side="right")) - 1
        raise ValueError(f"Matrix '{A.name}': column indices must be sorted and unique within each row; row {row} "
                         f"has column {int(indices[p])} after column {int(indices[p - 1])}. Build it with "
                         f"SparseMatrix.from_scipy or sparseditto.io.load_matrix.")


def analyze(matrix, *, name: str | None = None) -> PatternReport:
    """Analyze a sparsity pattern.

    ``matrix`` is a :class:`SparseMatrix`; anything else (torch tensor, scipy matrix, numpy array,
    file path) goes through :func:`sparseditto.io.load_matrix` first. ``name`` overrides the
    matrix's own name in the report.
    """
    start = time.perf_counter()
    if not isinstance(matrix, SparseMatrix):
        from sparseditto.io import load_matrix  # lazy: io pulls in torch/safetensors readers

        matrix = load_matrix(matrix)
    matrix = matrix.without_explicit_zeros()
    check_canonical(matrix)
    features = compute_features(matrix)
    result = classify(features)
    m, k = matrix.shape
    nnz = matrix.nnz
    blocks = [BlockStat(shape=b.shape, nonzero_blocks=b.nonzero_blocks, total_blocks=b.total_blocks,
                        block_density=b.nonzero_blocks / b.total_blocks,
                        occupancy=nnz / (b.nonzero_blocks * b.shape[0] * b.shape[1]) if b.nonzero_blocks else 0.0)
              for b in features.blocks]
    nm = {f"{n}:{g}": {axis: features.nm_conformance(n, g, axis) for axis in ("row", "col")} for n, g in NM_RATIOS}
    report = PatternReport(
        name=name if name is not None else matrix.name,
        shape=(m, k),
        nnz=nnz,
        density=nnz / (m * k),
        sparsity=1.0 - nnz / (m * k),
        dtype=matrix.dtype,
        row_stats=_nnz_stats(features.row_lengths),
        col_stats=_nnz_stats(features.col_lengths),
        empty_rows=int(np.count_nonzero(features.row_lengths == 0)),
        empty_cols=int(np.count_nonzero(features.col_lengths == 0)),
        nm_conformance=nm,
        blocks=blocks,
        best_block_shape=result.best_block_shape,
        bandwidth=features.max_offset,
        diag_fraction=features.near_diagonal / nnz if nnz else 0.0,
        powerlaw_alpha=result.powerlaw[0] if result.powerlaw else None,
        powerlaw_r2=result.powerlaw[1] if result.powerlaw else None,
        pattern=result.pattern,
        confidence=result.confidence,
        params=result.params,
        scores=result.scores,
        evidence=result.evidence,
        signature=features.signature,
        analysis_seconds=0.0,
        explicit_zeros_dropped=int(matrix.meta.get("explicit_zeros_dropped", 0)),
    )
    report.analysis_seconds = time.perf_counter() - start
    return report
