"""The decision interface every agent node calls, and the data it exchanges.

Nodes (planner, coder, debugger) never decide anything themselves: they hand plain data to a
`Policy` and act on its answer. Two policies implement it: the deterministic expert policy
(`sparseditto.agents.expert.ExpertPolicy`, the default that runs on a fresh machine) and the LLM
policy (`sparseditto.agents.llm_policy.LLMPolicy`, any LangChain chat model, falling back to the
expert for a step whenever the model is unreachable or answers garbage). Keeping the interface to
pydantic models means the same objects serve as structured-output schemas for the LLM, as
checkpointable graph state (via ``model_dump``) and as trajectory records in memory.
"""
from __future__ import annotations

from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field

Origin = Literal["template", "memory", "llm"]


class CandidateSpec(BaseModel):
    """One kernel to try: a template with parameters, or a full source proposed by an LLM."""

    template: str = Field(description="template name from the registry (or 'dense')")
    params: dict[str, Any] = Field(default_factory=dict, description="template parameters")
    rationale: str = Field(default="", description="one line: why this candidate, now")
    expected_ms: float | None = Field(default=None, description="cost-model estimate at the main N")
    origin: Origin = "template"
    source: str | None = Field(default=None, description="full kernel source when not a plain template instance")


class TriedCandidate(BaseModel):
    """What the planner needs to know about a candidate already tried (kept small for prompts)."""

    template: str
    params: dict[str, Any] = Field(default_factory=dict)
    status: str
    failure_class: str | None = None
    median_ms: float | None = None
    speedup_vs_dense: float | None = None
    pct_of_roofline: float | None = None
    bottleneck: str | None = None


class KernelProfile(BaseModel):
    """The current best kernel as the planner and the coder see it: its source, where its time
    goes and how far it is from its format's byte roofline (what "faster" has to beat)."""

    template: str
    params: dict[str, Any] = Field(default_factory=dict)
    origin: str | None = None
    source: str | None = None
    median_ms: float | None = None        # measured (GPU) or CPU time (interpreter: not a GPU timing)
    timings_are_gpu: bool | None = None
    expected_ms: float | None = None      # the cost model's estimate on the target (what ranks on the interpreter)
    a_bytes: float | None = None          # bytes of A as this kernel packs it
    a_bytes_measured: bool = False        # True: counted from prepare()'s tensors; False: the format formula
    bytes_per_nnz: float | None = None
    roofline_ms: float | None = None      # byte roofline: (A + B + C) / bandwidth on the measuring GPU
    pct_of_roofline: float | None = None  # roofline / measured time (GPU timings only)
    bottleneck: str | None = None         # the profiler's one line
    ncu: dict[str, float] = Field(default_factory=dict)   # Nsight Compute metrics (GPU with ncu only)


class CodingBrief(BaseModel):
    """What the graph knows beyond the candidate spec when the coder writes a kernel."""

    best: KernelProfile | None = None
    lessons: list[str] = Field(default_factory=list)    # the memory's lessons for similar patterns
    target: str | None = None                           # the GPU planned for
    backend: str | None = None                          # execution backend: cuda | interpret


class PlanningInput(BaseModel):
    """Everything a planning decision may use; built by the planner node from state + context."""

    report: dict[str, Any]
    target: dict[str, Any]
    n_values: list[int]
    dtype: str
    memory_hits: list[dict[str, Any]] = Field(default_factory=list)
    tried: list[TriedCandidate] = Field(default_factory=list)
    best: TriedCandidate | None = None
    dense_ms: float | None = None
    roofline_ms: float | None = None
    budget_left: int = 0
    templates: list[dict[str, Any]] = Field(default_factory=list, description="applicable templates with cost estimates")
    best_kernel: KernelProfile | None = None
    lessons: list[str] = Field(default_factory=list)


class PlanDecision(BaseModel):
    """The planner's answer: the next candidates in order, or stop."""

    action: Literal["try", "stop"]
    candidates: list[CandidateSpec] = Field(default_factory=list)
    rationale: str = Field(description="one line: why this plan, or why stop")


class CodeProposal(BaseModel):
    """The coder's answer: the complete source of one candidate kernel."""

    source: str = Field(description="complete, self-contained candidate source defining prepare() and spmm()")
    rationale: str = ""
    origin: Origin = "template"


class FailureReport(BaseModel):
    """What went wrong with a candidate, as the debugger sees it."""

    template: str
    params: dict[str, Any] = Field(default_factory=dict)
    status: str
    failure_class: str | None = None      # the harness's classification (e.g. backend_unavailable)
    message: str = ""
    log: str = ""
    attempt: int = 1


class Diagnosis(BaseModel):
    """The debugger's answer: the failure's class and what to do about it."""

    failure_class: str = Field(description="e.g. compile_error, shared_memory_overflow, wrong_result, timeout, crash, cheating")
    action: Literal["retry_params", "retry_source", "switch_template", "give_up"]
    params: dict[str, Any] | None = Field(default=None, description="new parameters for retry_params")
    source: str | None = Field(default=None, description="fixed full source for retry_source")
    template: str | None = Field(default=None, description="template to switch to")
    rationale: str = ""


@runtime_checkable
class Policy(Protocol):
    """The three decisions an agent graph needs. Implementations must never raise on bad luck:
    an LLM policy falls back to the expert and records why."""

    name: str

    def plan(self, inp: PlanningInput) -> PlanDecision: ...

    def code(self, spec: CandidateSpec, template_source: str, feedback: str | None = None,
             brief: CodingBrief | None = None) -> CodeProposal: ...

    def diagnose(self, failure: FailureReport, source: str) -> Diagnosis: ...
