"""The result models of `sparseditto bench`: one `BenchRow` per case, one `SuiteSummary` per suite.

A row is written to ``results.jsonl`` the moment its case finishes (so a killed run loses at most
the case in flight) and read back by `--resume`, the metrics and the reports, so it is the one
shape every consumer relies on; ``schema`` is bumped when a field changes meaning.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

ROW_SCHEMA = 1
VENDOR_PATHS = ("cusparse_csr_torch", "cusparse_csr_cupy", "cusparselt_2to4", "triton_bsr_torch")
DENSE_PATH = "cublas_dense"
P_VALUES = (0.0, 1.0, 1.5, 2.0)


class PathTiming(BaseModel):
    """One timed implementation of the case's product: the chosen kernel, dense cuBLAS or a vendor path.

    ``eager_us`` is a plain launch, ``graph_us`` one launch replayed from a CUDA graph (GPU only;
    None when capture failed or on the interpreter), both median, cold L2. ``rechecked`` says
    whether its output matched the fp64 reference on a fresh input after timing (None: not run).
    """

    name: str
    ok: bool
    eager_us: float | None = None
    graph_us: float | None = None
    # launches back to back from one CUDA graph, each on its own L2-cold copy of the weight, per
    # launch: the layer's cost inside a model's graph (the chosen kernel and dense only; None on the
    # CPU, for other paths, or with --no-chain)
    chain_us: float | None = None
    error: str | None = None
    note: str | None = None
    rechecked: bool | None = None
    recheck_message: str = ""


class TriedKernel(BaseModel):
    """One candidate `run_graph` tried for the case, in the order it was tried: what the planner's
    rules and cost model are judged by (its estimate against its measured time, the winner's rank)."""

    rank: int                            # 1-based order of trial (a retried candidate once: its last attempt)
    template: str
    params: dict[str, Any] = Field(default_factory=dict)   # the values set explicitly ("auto" left out)
    origin: str | None = None
    status: str
    expected_us: float | None = None     # the cost model's estimate on the target
    us: float | None = None              # measured: graph-replayed where it has one, else eager
    basis: str | None = None


class ChosenKernel(BaseModel):
    """What `run_graph` answered for this case."""

    template: str
    params: dict[str, Any] = Field(default_factory=dict)
    origin: str | None = None
    backend: str | None = None
    selection: str | None = None
    reason: str = ""
    bottleneck: str | None = None
    source_hash: str | None = None
    candidates_tried: int = 0
    winner_rank: int | None = None     # 1-based position of the chosen kernel among the candidates tried
    stop_reason: str | None = None
    policy: str | None = None          # expert, or the LLM policy when $SPARSEDITTO_LLM_MODEL is set
    tried: list[TriedKernel] = Field(default_factory=list)   # every candidate, vendor paths last


class Speedup(BaseModel):
    """``value`` = competitor time / chosen time on ``basis`` (graph when both have one, else eager;
    "chain" for the chained timing, `speedup_vs_dense_chain`)."""

    versus: str
    value: float
    basis: Literal["graph", "eager", "chain"]


class TemplateTiming(BaseModel):
    """One template of the optional sweep (``--templates``): verified and timed beside dense."""

    template: str
    params: dict[str, Any] = Field(default_factory=dict)
    status: str                          # verified | not_applicable | a verify status (wrong_result, ...)
    message: str = ""
    eager_us: float | None = None
    graph_us: float | None = None
    speedup_vs_dense: Speedup | None = None
    format_bytes: float | None = None
    pct_roofline: float | None = None
    reverified: bool | None = None


class BenchRow(BaseModel):
    """Everything measured for one case."""

    schema_version: int = ROW_SCHEMA
    case_id: str
    suite: str
    case: str
    matrix: dict[str, Any]
    shape: tuple[int, int] | None        # None only when the matrix could not be built
    nnz: int | None
    pattern: str                       # the suite's pruning family (what the case is)
    detected_pattern: str | None = None  # what the analyzer classified it as
    sparsity: float | None
    dtype: str
    n: int
    status: Literal["ok", "error"]
    error: str | None = None
    timings_are_gpu: bool
    chosen: ChosenKernel | None = None
    timings: list[PathTiming] = Field(default_factory=list)
    speedup_vs_dense: Speedup | None = None
    speedup_vs_dense_chain: Speedup | None = None   # the chained basis (GPU, N where both were chained)
    speedups_vs_vendor: list[Speedup] = Field(default_factory=list)
    best_vendor: Speedup | None = None       # the hardest vendor sparse path (smallest speedup)
    best_alternative: Speedup | None = None  # the hardest of dense cuBLAS and the vendor sparse paths
    correct: bool = False
    correctness: str = ""
    format_bytes: float | None = None
    copy_bandwidth_gbs: float | None = None
    roofline_us: float | None = None         # format bytes / measured copy bandwidth
    achieved_gbs: float | None = None        # format bytes / chosen kernel time
    pct_roofline: float | None = None
    prepare_ms: float | None = None
    run_graph_s: float | None = None
    run_graph_nodes: dict[str, float] = Field(default_factory=dict)   # run_graph's seconds per node
    run_graph_memory_s: float | None = None  # a repeat run with the memory (sampled cases only)
    memory_repeat: dict[str, Any] | None = None
    summary: str = ""                        # Result.summary() of the first run
    templates: list[TemplateTiming] = Field(default_factory=list)  # the optional template sweep
    case_seconds: float = 0.0
    settings: dict[str, Any] = Field(default_factory=dict)
    run_id: str = ""
    environment: dict[str, Any] = Field(default_factory=dict)

    def timing(self, name: str) -> PathTiming | None:
        return next((t for t in self.timings if t.name == name), None)


class FastP(BaseModel):
    """fast_p against one kind of competitor: share of the suite's cases that are correct and at
    least ``p`` times as fast as the competitor (``p`` = 0: share correct)."""

    versus: Literal["best_vendor_sparse", "best_of_dense_and_vendor"]
    cases: int                                 # the denominator
    shares: dict[str, float]                   # "0", "1", "1.5", "2" -> share in [0, 1]


class WorstCase(BaseModel):
    case: str
    speedup: float | None
    reason: str


class SuiteSummary(BaseModel):
    """The per-suite answer to "is it faster than what I would use?"."""

    suite: str
    cases: int
    errors: int
    correct: int
    timings_are_gpu: bool
    geomean_vs_dense: float | None
    geomean_vs_dense_chain: float | None = None
    geomean_vs_best_vendor: float | None
    geomean_vs_best_alternative: float | None
    fast_p_vendor: FastP
    fast_p_alternative: FastP
    pct_roofline_median: float | None
    pct_roofline_min: float | None
    run_graph_s_median: float | None
    run_graph_memory_s_median: float | None
    prepare_ms_median: float | None
    chosen_templates: dict[str, int] = Field(default_factory=dict)
    generated_wins: int = 0        # correct cases whose chosen kernel is ours (not a vendor library) with a known rank
    first_candidate_wins: int = 0  # ... of which the planner's first candidate was the winner (winner_rank 1)
    worst: WorstCase | None = None


class BenchReport(BaseModel):
    """What `sparseditto.bench` returns: where the files are and the per-suite summaries."""

    out_dir: str
    rows: int
    new_rows: int
    skipped: int
    remaining: int
    stopped: str | None = None
    summaries: list[SuiteSummary] = Field(default_factory=list)
    files: dict[str, str] = Field(default_factory=dict)
