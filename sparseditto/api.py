"""`run_graph(matrix, target=...)`: the one call that finds a verified fast kernel for a matrix.

It validates everything cheap first (target, dtype, N, backend, budget, the matrix itself), so bad
input is a ValueError before any kernel is compiled. Then it runs the agent graph with a SQLite
checkpointer under a thread id derived from the matrix content and the settings: if a previous
call with the same matrix and settings was interrupted (a crash, Ctrl-C, a killed job), this call
resumes from its last checkpoint instead of redoing verified candidates. A finished thread is not
reopened; the next call with the same inputs starts a fresh thread (``<id>-1``, ``<id>-2``, ...),
and benefits from the trajectory memory instead.

The `Result` is a pydantic model: the pattern report, every candidate with its source, status,
failure class, timings and rationale, the chosen kernel with the reason it was chosen, speedups,
the decision trail, token usage and fallback events. ``result.kernel(B)`` runs the chosen kernel.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import signal
import sqlite3
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, Field, PrivateAttr, computed_field

from sparseditto.agents.records import CandidateRecord
from sparseditto.llm import LLMCall, RunTokenUsage
from sparseditto.matrix import SparseMatrix

# ---- result models --------------------------------------------------------------------------------

class BestKernel(BaseModel):
    """The answer: a verified candidate, or dense, with how and why it was chosen."""

    template: str                        # 'dense' when nothing beat dense; a vendor path's name when it won
    params: dict[str, Any] = Field(default_factory=dict)
    source: str | None = None            # None for dense and the vendor paths (library code, rebuilt from A)
    source_hash: str | None = None
    backend: str | None = None
    origin: str | None = None            # template | memory | llm | vendor
    vendor: str | None = None            # origin "vendor": the library, in words
    selection: str = "measured"          # measured | cost_model | no_candidate | rejected
    reason: str = ""
    median_ms: float | None = None
    dense_ms: float | None = None
    expected_ms: float | None = None
    speedup_vs_dense: float | None = None
    pct_of_roofline: float | None = None
    bottleneck: str | None = None


class Result(BaseModel):
    """Everything one `run_graph` call found out."""

    run_id: str
    thread_id: str
    matrix_name: str
    matrix_key: str
    shape: tuple[int, int]
    nnz: int
    target: dict[str, Any]               # {"name", "spec", "measured_on", "note"}
    backend: str                         # cuda | interpret
    timings_are_gpu: bool
    n_values: list[int]
    dtype: str
    policy: str
    report: dict[str, Any]
    candidates: list[CandidateRecord]
    best: BestKernel
    dense: dict[str, Any] | None = None
    speedups: dict[str, float] = Field(default_factory=dict)
    speedups_are_estimates: bool = False
    best_vendor: str | None = None                   # the fastest verified vendor path (measured runs)
    speedup_vs_best_vendor: float | None = None      # the answer against it (1.0 when it is the answer)
    best_generated: str | None = None                # our fastest verified generated kernel
    vendor_lead: float | None = None                 # a vendor answer: how many times faster than best_generated
    memory_hits: list[dict[str, Any]] = Field(default_factory=list)
    decisions: list[dict[str, Any]] = Field(default_factory=list)
    token_usage: RunTokenUsage = Field(default_factory=RunTokenUsage)   # LLM tokens: totals + by_role
    llm_calls: list[LLMCall] = Field(default_factory=list)     # every model request (text: memory show --llm)
    events: list[dict[str, Any]] = Field(default_factory=list)
    stop_reason: str | None = None
    resumed: bool = False
    wall_seconds: float
    node_seconds: dict[str, float] = Field(default_factory=dict)   # wall time spent in each node (this call)
    verified_ns: list[int] = Field(default_factory=list)   # the N values the chosen kernel passed
    sandbox: dict[str, Any] = Field(default_factory=dict)  # isolation layers of the worker that verified

    _kernel: Any = PrivateAttr(default=None)

    @property
    def kernel(self) -> "SpMMKernel":
        """The chosen kernel as a callable ``kernel(B) -> C`` (C = A @ B on B's device)."""
        if self._kernel is None:
            from sparseditto.artifacts import get_matrix

            self._kernel = SpMMKernel(get_matrix(self.matrix_key), self.best.source, self.best.template,
                                      verified_ns=self.verified_ns, verified_dtype=self.dtype,
                                      backend=self.backend)
        return self._kernel

    @computed_field
    @property
    def policy_label(self) -> str:
        """The policy that decided, and how often it could not: 'llm (3 steps fell back to expert)'."""
        fallbacks = [e for e in self.events if e.get("event") == "fallback"]
        if not fallbacks:
            return self.policy
        to = fallbacks[0].get("fallback") or "expert"
        return f"{self.policy} ({len(fallbacks)} step{'' if len(fallbacks) == 1 else 's'} fell back to {to})"

    def memory_line(self) -> str:
        """What the trajectory memory did for this run, in words."""
        actions = {d.get("action") for d in self.decisions if d.get("node") == "analyzer"}
        if "memory_off" in actions:
            return "off for this run"
        if any(e.get("event") == "memory_unavailable" for e in self.events):
            return "unavailable (see events); planned from the cost model alone"
        exact = next((h for h in self.memory_hits if h.get("kind") == "exact"), None)
        if exact is not None:
            from sparseditto.memory import found_at_this_n

            run = str(exact.get("run_id") or "")[:8]
            if not found_at_this_n(exact.get("n_values"), self.n_values):
                was = ", ".join(str(v) for v in exact.get("n_values") or [])
                return (f"exact hit at another N: run {run} chose {exact.get('template') or 'dense'} at N = {was}; "
                        "too far from this N to settle it, so it searched")
            if exact.get("template") in (None, "dense"):
                return f"exact hit: run {run} found dense best for this pattern"
            if exact.get("origin") == "vendor":
                return (f"exact hit: run {run} found the vendor path {exact['template']} best for this pattern; "
                        "the vendor paths were measured again")
            reused = any(c.origin == "memory" and c.status == "verified" for c in self.candidates)
            return (f"exact hit: run {run} had verified {exact['template']} for this pattern; "
                    + ("re-verified and reused" if reused else "its kernel failed re-verification, so it searched"))
        if self.memory_hits:
            h = self.memory_hits[0]
            return (f"{len(self.memory_hits)} similar past run(s); the nearest, {h.get('matrix_name')} "
                    f"({h.get('pattern')}), was best with {h.get('template')}, so that was tried early")
        return f"nothing similar yet; recorded as run {self.run_id[:8]} for the next matrix with this pattern"

    def summary(self) -> str:
        """A few lines for the CLI: the pattern, the answer and its speedups, the trail in brief."""
        r = self.report
        lines = [f"{self.matrix_name}: {self.shape[0]}x{self.shape[1]}, nnz={self.nnz}, "
                 f"sparsity {float(r.get('sparsity', 0.0)):.1%}, pattern {r.get('pattern', '?')} "
                 f"(confidence {float(r.get('confidence', 0.0)):.2f})"]
        b = self.best
        if b.template == "dense":
            lines.append(b.reason if b.reason.startswith("dense is best") else f"dense is best: {b.reason}")
        else:
            if b.origin == "vendor":
                lines.append(self.vendor_line())
            lines.append(f"{'why' if b.origin == 'vendor' else 'best'}: "
                         + (b.reason if b.origin == "vendor" else
                            f"{b.template} {_fmt_params(b.params)} ({b.origin or 'template'}) - {b.reason}"))
            if self.speedups:
                label = "estimated speedup (roofline model)" if self.speedups_are_estimates else "speedup"
                lines.append(f"{label}: " + ", ".join(f"{v:.2f}x vs {k}" for k, v in self.speedups.items()))
            if self.best_vendor and self.speedup_vs_best_vendor and b.origin != "vendor":
                lines.append(f"against the best vendor path ({self.best_vendor}): {self.speedup_vs_best_vendor:.2f}x")
            if b.bottleneck and self.timings_are_gpu:   # on the interpreter it only repeats "not a GPU timing"
                lines.append(f"profile: {b.bottleneck}")
        lines.append(f"candidates: {self.candidate_counts() or 'none'}; policy: {self.policy_label}; "
                     f"{self.wall_seconds:.1f} s")
        if self.node_seconds:
            spent = sorted(self.node_seconds.items(), key=lambda kv: -kv[1])
            lines.append("time by node: " + ", ".join(f"{k} {v:.1f} s" for k, v in spent))
        lines.append(f"memory: {self.memory_line()}")
        where = self.target.get("measured_on")
        if self.timings_are_gpu:
            lines.append(f"planned for {self.target.get('name')}, measured on {where}")
        else:
            lines.append(f"planned for {self.target.get('name')}; ran on {where}: timings are NOT GPU timings, "
                         "the choice comes from the roofline cost model")
        if self.target.get("note"):
            lines.append(f"note: {self.target['note']}")
        if self.llm_calls:
            u = self.token_usage
            roles = ", ".join(f"{role} {r.total_tokens}" for role, r in sorted(u.by_role.items()))
            lines.append(f"llm: {len(self.llm_calls)} request(s), {u.prompt_tokens} prompt + {u.completion_tokens} "
                         f"completion tokens ({roles})" + (f", ${u.cost_usd:.4f}" if u.cost_usd else ""))
        if self.events:
            lines.append(f"events: {len(self.events)} (e.g. {self.events[0].get('event') or self.events[0]})")
        return "\n".join(lines)

    def vendor_line(self) -> str:
        """The plain statement of a vendor answer: which library, and by how much it beat ours."""
        b = self.best
        what = f"{b.template} ({b.vendor})" if b.vendor else b.template
        if self.vendor_lead and self.best_generated:
            return (f"best: the vendor library {what}: it beat our best generated kernel {self.best_generated} "
                    f"{self.vendor_lead:.2f}x, so result.kernel runs the library")
        return f"best: the vendor library {what} (no generated kernel verified), so result.kernel runs the library"

    def candidate_counts(self) -> str:
        """'2 verified, 1 wrong_result': each attempt by its outcome."""
        statuses: dict[str, int] = {}
        for c in self.candidates:
            key = "verified" if c.status == "verified" else (c.failure_class or c.status)
            statuses[key] = statuses.get(key, 0) + 1
        return ", ".join(f"{v} {k}" for k, v in sorted(statuses.items()))


def _fmt_params(params: dict) -> str:
    return "{" + ", ".join(f"{k}={v}" for k, v in sorted((params or {}).items())) + "}"


# ---- the chosen kernel as a callable ----------------------------------------------------------------

def _torch_tensor_type():
    import torch

    return torch.Tensor


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


KERNEL_DTYPES = ("float16", "bfloat16", "float32", "float64")


class SpMMKernel:
    """``kernel(B) -> A @ B`` for the chosen kernel, keeping the harness's contract.

    ``prepare`` gets a ``torch.dtype`` (as in verification) and runs once per device and dtype
    (the packed format is cached), then ``spmm`` runs. The kernel only runs for the N values and
    dtype it was verified for (`verified_ns`, `verified_dtype`): any other N is verified on first
    use in the sandbox (``verify_new_n=True``, the default; a failure is a clear ValueError) or
    refused. B must be a 2-D floating-point tensor with A's column count; the dense answer
    (``template == 'dense'``) refuses integer B instead of computing in a silently wrong dtype.

    ``source`` None: a vendor path (``template`` names it: dense cuBLAS, cusparse_csr_torch, ...),
    rebuilt from ``matrix`` by the harness's vendor kernel, with the same prepare-once / apply-per-call
    contract; a vendor path other than dense runs only at the dtype and N it was verified for.
    """

    def __init__(self, matrix: SparseMatrix, source: str | None, template: str = "dense", *,
                 verified_ns=(), verified_dtype: str | None = None, backend: str = "auto",
                 verify_new_n: bool = True):
        self.matrix = matrix
        self.source = source
        self.template = template
        self.verified_ns = set(int(n) for n in verified_ns)
        self.verified_dtype = verified_dtype
        self.backend = backend
        self.verify_new_n = verify_new_n
        self.verifications: list[dict] = []
        self._module = None
        self._packed: dict[tuple, Any] = {}
        self._lock = threading.Lock()
        # (N, dtype, device) whose B passed check_input and the N check: a call like them goes straight
        # to the kernel (patch_model calls it once per layer and token step; the checks cost more
        # host time than a decode kernel runs)
        self._accepted: dict[tuple, Any] = {}

    def __repr__(self) -> str:
        return (f"SpMMKernel({self.template}, A={self.matrix.shape}, nnz={self.matrix.nnz}, "
                f"verified N={sorted(self.verified_ns)}, dtype={self.verified_dtype})")

    @property
    def checked(self) -> bool:
        """Whether calls are held to the verified N values and dtype (all but the dense answer)."""
        return self.source is not None or self.template != "dense"

    def _load(self):
        if self._module is None and self.source is None:
            from sparseditto.harness.vendor_kernels import vendor_kernel

            self._module = vendor_kernel(self.template)   # ValueError for an unknown vendor path
        if self._module is None:
            # The harness's loader: a content-addressed file (Triton needs real source files).
            from sparseditto.harness.source_loader import load_module

            if os.environ.get("TRITON_INTERPRET") == "1":
                # Same interpreter fix the harness's CPU worker applies (NumPy >= 2.4).
                from sparseditto.harness.interpreter_compat import patch_triton_interpreter

                patch_triton_interpreter()
            self._module = load_module(self.source)
        return self._module

    def check_input(self, B) -> None:
        """ValueError naming the problem when B is not something this kernel was verified for."""
        import torch

        if not isinstance(B, torch.Tensor):
            raise ValueError(f"Expected B as a torch.Tensor, got {type(B).__name__}.")
        if B.dim() != 2:
            raise ValueError(f"Expected a 2-D B of shape ({self.matrix.shape[1]}, N), got {B.dim()}-D tensor "
                             f"of shape {tuple(B.shape)}.")
        if B.shape[0] != self.matrix.shape[1]:
            raise ValueError(f"B has {B.shape[0]} rows but A is {self.matrix.shape[0]}x{self.matrix.shape[1]}: "
                             f"expected B of shape ({self.matrix.shape[1]}, N).")
        if B.shape[1] < 1:
            raise ValueError(f"B has no columns (shape {tuple(B.shape)}); expected N >= 1.")
        name = _dtype_name(B.dtype)
        if name not in KERNEL_DTYPES:
            raise ValueError(f"B has dtype {B.dtype}; the kernel computes in floating point "
                             f"({', '.join(KERNEL_DTYPES)}): convert B first (an integer product would "
                             f"silently overflow or truncate).")
        if self.checked:
            if self.verified_dtype is not None and name != self.verified_dtype:
                raise ValueError(f"This kernel was verified for {self.verified_dtype} inputs, got B in {name}; "
                                 f"pass B.to(torch.{self.verified_dtype}) or run run_graph with dtype={name!r}.")
            if B.device.type == "meta":
                raise ValueError("B is on the 'meta' device and has no values.")

    def _ensure_verified(self, n: int, device) -> None:
        if not self.checked or not self.verified_ns or n in self.verified_ns:
            return
        if not self.verify_new_n:
            raise ValueError(f"This kernel was verified for N in {sorted(self.verified_ns)}, not N={n}; "
                             f"create it with verify_new_n=True or run run_graph with n=[..., {n}].")
        from sparseditto import harness

        backend = "cuda" if getattr(device, "type", str(device)) == "cuda" else "interpret"
        what = self.source if self.source is not None else harness.vendor_spec(self.template)
        result = harness.run_and_verify(what, self.matrix, n_values=(n,), dtype=self.verified_dtype or "float16",
                                        backend=backend, extra_ns=False)
        self.verifications.append({"n": n, "status": result.status, "seed": result.seed, "message": result.message})
        if not result.ok:
            raise ValueError(f"The kernel failed verification at N={n} (its first use at this N): "
                             f"{result.status}: {result.message}")
        self.verified_ns.add(n)

    def _packed_for(self, B):
        key = (str(B.device), _dtype_name(B.dtype))
        with self._lock:
            packed = self._packed.get(key)
            if packed is None:
                packed = self._packed[key] = self._load().prepare(self.matrix, B.dtype, B.device)
        return packed

    def __call__(self, B):
        import torch

        self.check_input(B)
        out = torch.empty((self.matrix.shape[0], B.shape[1]), dtype=B.dtype, device=B.device)
        self.spmm_into(B.contiguous(), out)
        return out

    def spmm_into(self, B, out) -> None:
        """``out[:] = A @ B`` into the caller's ``out`` [M, N], with B and out passed to the kernel as
        they are (any strides: a Triton template reads B's and C's strides, a CUDA C++ one copies
        a column-strided B or C into a unit-stride stand-in). `patch_model` uses it to compute
        y = x W^T as (W x^T)^T on views of x and y, without copying either."""
        key = (B.shape[1], B.dtype, B.device) if isinstance(B, _torch_tensor_type()) and B.dim() == 2 else None
        packed = self._accepted.get(key) if key is not None and B.shape[0] == self.matrix.shape[1] else None
        if packed is None:
            self.check_input(B)
            self._ensure_verified(int(B.shape[1]), B.device)
            packed = self._packed_for(B)
            self._accepted[key] = packed
        self._module.spmm(packed, B, out)   # a generated kernel, or the vendor path's (dense: matmul out=)


# ---- input validation --------------------------------------------------------------------------------

def _check_settings(target, n, dtype, backend, budget) -> tuple[Any, str | None, list[int], str]:
    from sparseditto.agents.state import check_backend, check_budget, check_dtype, parse_n_values
    from sparseditto.targets import resolve_target

    check_dtype(dtype)
    check_backend(backend)
    n_values = [16] if n is None else parse_n_values(n)
    if budget is not None:
        check_budget(budget)
    import torch

    has_cuda = torch.cuda.is_available()
    if backend == "cuda" and not has_cuda:
        raise ValueError("backend='cuda' needs a CUDA GPU, but torch.cuda.is_available() is False; "
                         "use backend='interpret' (Triton interpreter on the CPU) or 'auto'.")
    resolved = backend if backend != "auto" else ("cuda" if has_cuda else "interpret")
    if resolved == "interpret" and "triton" not in sys.modules:
        # The interpreter must be chosen before Triton is first imported in this process.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    tgt, note = resolve_target(target, fallback="A100")
    if resolved == "cuda":
        from sparseditto.agents.costing import arch_note
        from sparseditto.targets import detect_local_target

        extra = arch_note(tgt, detect_local_target())
        note = "; ".join(x for x in (note, extra) if x) or None
    return tgt, note, n_values, resolved


FLOAT16_MAX = 65504.0


def warn_float16_overflow(A: SparseMatrix, dtype: str) -> None:
    """Weights beyond float16's range become inf in a float16 kernel: say so before the run."""
    if dtype != "float16" or not A.nnz:
        return
    peak = float(abs(A.data).max())
    if peak > FLOAT16_MAX:
        import warnings

        count = int((abs(A.data) > FLOAT16_MAX).sum())
        warnings.warn(f"{count} value(s) of '{A.name}' exceed float16's range (|x| up to {peak:.6g} > 65504): a "
                      f"float16 kernel turns them into inf. Use dtype='bfloat16' or 'float32', or rescale.",
                      UserWarning, stacklevel=3)


def _memory_settings(memory) -> dict:
    if memory is False:
        return {"use_memory": False}
    if memory is None or memory is True:
        return {"use_memory": True, "memory_path": None}
    if isinstance(memory, (str, os.PathLike)):
        from sparseditto.memory import check_writable_file

        if not str(memory).strip():
            raise ValueError("memory path is empty; pass a .sqlite file path, None (default file) or False (off).")
        if str(memory) != ":memory:":
            check_writable_file(Path(memory).expanduser(), "Memory")
        return {"use_memory": True, "memory_path": str(memory)}
    if hasattr(memory, "exact_hit") and hasattr(memory, "start_run"):
        return {"use_memory": True, "memory": memory}
    raise ValueError(f"memory must be a path, a Memory, None (default file) or False (off), got {memory!r}.")


# ---- threads and checkpoints ---------------------------------------------------------------------------

def default_checkpoint_path() -> Path:
    from sparseditto.artifacts import cache_dir

    return cache_dir() / "checkpoints.sqlite"


def derive_thread_id(matrix_key: str, settings: dict) -> str:
    """Same matrix content + same settings -> same thread (so an interrupted run resumes)."""
    blob = json.dumps({"matrix": matrix_key, **settings}, sort_keys=True, default=str)
    return "sd-" + hashlib.sha256(blob.encode()).hexdigest()[:20]


def _config(thread_id: str, recursion_limit: int) -> dict:
    return {"configurable": {"thread_id": thread_id}, "recursion_limit": recursion_limit}


def _thread_state(graph, thread_id: str) -> str:
    """'new' (never run), 'resume' (unfinished: crashed or waiting for approval) or 'done'."""
    snap = graph.get_state({"configurable": {"thread_id": thread_id}})
    if not snap.values:
        return "new"
    if snap.next:
        return "resume"
    return "done" if snap.values.get("done") else "resume_broken"


def pick_thread(graph, base: str, explicit: bool) -> tuple[str, str]:
    if explicit:
        return base, _thread_state(graph, base)
    for i in range(10_000):
        tid = base if i == 0 else f"{base}-{i}"
        state = _thread_state(graph, tid)
        if state in ("new", "resume"):
            return tid, state
    raise RuntimeError(f"too many finished threads for {base}")  # pragma: no cover


# ---- progress display ---------------------------------------------------------------------------------

class _Progress:
    """Streams node messages to the terminal with rich (stderr).

    ``mode`` True or "all": one line per message under a spinner; "status": only the spinner, showing
    the latest message (the demo, whose story is printed at the end); False: nothing."""

    def __init__(self, mode: bool | str, clock=None):
        self.lines = mode is True or mode == "all"
        self.clock = clock
        self.console = None
        self.status = None
        if mode:
            from rich.console import Console

            self.console = Console(stderr=True)

    def __enter__(self):
        if self.console is not None:
            self.status = self.console.status("starting the SparseDitto graph ...")
            self.status.__enter__()
        return self

    def __exit__(self, *exc):
        if self.status is not None:
            self.status.__exit__(*exc)

    def message(self, chunk: dict) -> None:
        if self.console is None or not isinstance(chunk, dict):
            return
        node, msg = chunk.get("node", "?"), chunk.get("msg", "")
        if self.lines:
            at = f"[dim]{self.clock.elapsed():6.1f}s[/] " if self.clock is not None else ""
            self.console.print(f"{at}[bold cyan]{node:>9}[/] {msg}", highlight=False, markup=True, soft_wrap=True)
        if self.status is not None:
            self.status.update(f"{node}: {str(msg)[:80]}")


@contextlib.contextmanager
def _fast_interrupt():
    """Ctrl-C during a run stops it within a fraction of a second: the SIGINT handler also tells the
    sandbox to stop waiting for its workers (the running node's thread then unwinds, see
    `sparseditto.harness.sandbox.cancel_calls`), then raises KeyboardInterrupt as usual. Every step
    finished before it is checkpointed, so the same call resumes the run."""
    from sparseditto.harness.sandbox import allow_calls, cancel_calls

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)

    def on_sigint(signum, frame):
        cancel_calls()
        if callable(previous) and previous is not signal.default_int_handler:
            previous(signum, frame)
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        allow_calls()


# ---- run_graph -----------------------------------------------------------------------------------------

def run_graph(matrix, target: str = "A100", *, n: int | list[int] | None = None, dtype: str = "float16",
              backend: str = "auto", llm: Any = None, budget: int | None = None, memory: Any = None,
              tensor: str | None = None, seed: int = 0, approve: bool | Callable[[dict], Any] = False,
              thread_id: str | None = None, checkpoint: str | os.PathLike | None = None,
              progress: bool | str = False, **options) -> Result:
    """Find the fastest verified SpMM kernel for ``matrix`` (C = A @ B, B with N columns).

    ``matrix``: torch tensor, scipy.sparse, numpy array, SparseMatrix, or a file path (``tensor``
    names the weight inside .pt/.safetensors). ``target``: GPU to plan for (or "auto"). ``n``: N,
    or a list (the first is the one benchmarked; all are verified). ``llm``: chat model or name
    (None: expert policy, or $SPARSEDITTO_LLM_MODEL). ``memory``: path, Memory, None (default file)
    or False. ``approve``: True asks on the terminal before accepting a kernel, or a callable
    ``approve(payload) -> bool``. ``thread_id``/``checkpoint``: resume control (see module doc).
    ``progress``: True prints every agent's progress line on stderr, "status" only a spinner with
    the latest one. Extra ``options`` set `Context` fields (max_debug_attempts, time_budget_s,
    near_roofline, ...).
    """
    t0 = time.time()
    from sparseditto.agents.kit import build_policy
    from sparseditto.agents.state import RunContext, check_llm_budget, check_seed

    tgt, note, n_values, resolved = _check_settings(target, n, dtype, backend, budget)
    seed = check_seed(seed)
    if any(k in options for k in ("max_llm_tokens", "max_llm_cost", "llm_price")):
        (options["max_llm_tokens"], options["max_llm_cost"], options["llm_price"]) = check_llm_budget(
            options.get("max_llm_tokens"), options.get("max_llm_cost"), options.get("llm_price"))
    # Context fields that run_graph's own arguments set may not come in again through **options.
    extra = set(RunContext.__dataclass_fields__) - {"target", "n_values", "dtype", "backend", "budget", "llm", "seed",
                                                    "approve", "use_memory", "memory_path", "memory", "chat_model"}
    bad = sorted(set(options) - extra)
    if bad:
        raise ValueError(f"Unknown run_graph option(s) {bad}; accepted extra options: {sorted(extra)}.")
    if approve is True and not (sys.stdin and sys.stdin.isatty()):
        raise ValueError("approve=True asks on the terminal, but stdin is not interactive; "
                         "pass a callable approve(payload) -> bool instead.")
    mem_settings = _memory_settings(memory)

    from sparseditto.artifacts import put_matrix
    from sparseditto.io import load_matrix

    A = load_matrix(matrix, tensor=tensor, seed=seed)   # a SparseMatrix comes back as is (without stored zeros)
    if not isinstance(A, SparseMatrix):  # pragma: no cover - load_matrix's contract
        raise ValueError(f"load_matrix returned {type(A).__name__}, expected a SparseMatrix.")
    warn_float16_overflow(A, dtype)
    key = put_matrix(A)

    # A detected GPU may be missing from the table, so 'auto' travels as the Target object itself.
    ctx = RunContext(target=tgt if str(target).strip().lower() == "auto" else tgt.name, n_values=n_values,
                     dtype=dtype, backend=resolved, budget=budget, llm=llm if isinstance(llm, str) else None,
                     chat_model=None if isinstance(llm, str) else llm, seed=seed,
                     approve=bool(approve), **mem_settings, **options)
    policy = ctx.policy or build_policy(ctx)
    ctx.policy = policy

    model = getattr(policy, "model", None)
    settings = {"target": tgt.name, "n": n_values, "dtype": dtype, "backend": resolved, "budget": budget,
                "policy": policy.name, "llm": _llm_identity(model), "seed": seed,
                "options": {k: v for k, v in options.items() if k not in ("hooks", "policy", "memory")}}
    base = thread_id or derive_thread_id(key, settings)

    from langgraph.checkpoint.sqlite import SqliteSaver

    from sparseditto.graphs.build import compile_graph

    ckpt = Path(checkpoint).expanduser() if checkpoint is not None else default_checkpoint_path()
    conn = open_checkpoint(ckpt)
    try:
        saver = SqliteSaver(conn)
        graph = compile_graph(checkpointer=saver)
        tid, state = pick_thread(graph, base, explicit=thread_id is not None)
        from sparseditto.agents.state import resolved_budget

        per_candidate = 4 + 2 * (ctx.max_debug_attempts + 1)
        config = _config(tid, 30 + resolved_budget(ctx) * per_candidate * 2)
        if state == "done":
            values = graph.get_state(config).values
            return build_result(values, tid, ctx, tgt, note, A, time.time() - t0, resumed=True)
        if state == "resume_broken":
            raise ValueError(f"Thread {tid!r} in {ckpt} ended without finishing; use another thread_id.")
        inp: Any = None
        if state == "new":
            inp = {"matrix_key": key, "matrix_name": A.name, "run_id": uuid.uuid4().hex, "started_at": time.time(),
                   "iteration": 0}
        if state == "resume":
            _claim_memory_run(ctx, graph.get_state(config).values)
        from sparseditto.harness.timing import LapClock

        # each streamed update closes the interval since the previous one, charged to its node; a
        # node's inner tasks (`kit.once`: "finalize_vendor_paths", "finalize_retime") to that node
        clock = LapClock()
        with _Progress(progress, clock) as prog, _fast_interrupt():
            while True:
                # durability="sync": each step's checkpoint is on disk before the next step starts, so
                # a kill -9 anywhere loses at most the step that was running (LangGraph's default
                # writes checkpoints in the background and a kill can lose the last one).
                for mode, chunk in graph.stream(inp, config, context=ctx, stream_mode=["updates", "custom"],
                                                durability="sync"):
                    if mode == "custom":
                        prog.message(chunk)
                    elif mode == "updates":
                        clock.lap(*_charged_nodes(chunk))
                snap = graph.get_state(config)
                pending = [i for task in snap.tasks for i in (task.interrupts or ())]
                if not pending:
                    break
                if not approve:
                    raise ValueError(f"Thread {tid!r} is waiting for a human approval of its kernel; call "
                                     "run_graph again with approve=True (terminal) or approve=callable.")
                answer = _ask(approve, pending[0].value)
                clock.lap()   # the person's thinking time is no node's
                from langgraph.types import Command

                inp = Command(resume=answer)
        values = graph.get_state(config).values
        return build_result(values, tid, ctx, tgt, note, A, time.time() - t0, resumed=state == "resume",
                            node_seconds=clock.rounded())
    finally:
        conn.close()


def open_checkpoint(path: Path) -> sqlite3.Connection:
    """The checkpoint database, with a clear ValueError for a path that cannot hold one."""
    from sparseditto.memory import check_writable_file

    check_writable_file(path, "Checkpoint")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(str(path), check_same_thread=False, timeout=30.0)
        conn.execute("PRAGMA busy_timeout = 30000")
        conn.execute("SELECT name FROM sqlite_master LIMIT 1")
    except (OSError, sqlite3.Error) as exc:
        raise ValueError(f"Checkpoint file {path} cannot be used ({exc}); pass checkpoint= a writable "
                         f".sqlite path.") from exc
    return conn


def _claim_memory_run(ctx, values: dict) -> None:
    """A resumed run continues its memory row (marked crashed when its first process died)."""
    run_id = values.get("memory_run_id")
    if not run_id or not ctx.use_memory:
        return
    from sparseditto.memory import Memory

    try:
        if ctx.memory is not None:
            ctx.memory.claim_run(run_id)
        else:
            with Memory(ctx.memory_path) as mem:
                mem.claim_run(run_id)
    except Exception:  # a memory problem never stops the run it describes
        pass


def _llm_identity(model) -> str | None:
    if model is None:
        return None
    for attr in ("model_name", "model", "model_id"):
        value = getattr(model, attr, None)
        if isinstance(value, str) and value:
            return f"{type(model).__name__}:{value}"
    return type(model).__name__


def _ask(approve, payload: dict):
    if callable(approve):
        return approve(payload)
    from rich.prompt import Confirm

    print(json.dumps(payload, indent=2, default=str), file=sys.stderr)
    return Confirm.ask(payload.get("question", "Accept this kernel?"))


def _charged_nodes(chunk) -> list[str]:
    """The nodes an "updates" chunk's interval is charged to: its node keys, and for a node's inner
    task (`kit.once` names them "<node>_<step>") that node. Before, finalize's vendor paths and
    re-timing (26 s of a 112 s run on an 11008 x 4096 weight) were charged to no node."""
    from sparseditto.graphs.build import NODES

    if not isinstance(chunk, dict):
        return []
    names = []
    for key in chunk:
        node = key if key in NODES else str(key).split("_", 1)[0]
        if node in NODES and node not in names:
            names.append(node)
    return names


def build_result(values: dict, thread_id: str, ctx, target, note, A: SparseMatrix, wall: float,
                 resumed: bool, node_seconds: dict[str, float] | None = None) -> Result:
    final = values.get("final") or {}
    rec = final.get("candidate") or None
    dense = values.get("dense")
    gpu = ctx.backend == "cuda" or bool((rec or {}).get("timings_are_gpu"))
    measured_on = (dense or {}).get("gpu_name") or (rec or {}).get("gpu_name") or (
        "CPU (Triton interpreter)" if not gpu else "cuda")
    if rec:
        best = BestKernel(
            template=rec["template"], params=rec.get("params") or {}, source=rec.get("source"),
            source_hash=rec.get("source_hash"), backend=rec.get("backend"), origin=rec.get("origin"),
            vendor=rec.get("vendor"),
            selection=final.get("selection", "measured"), reason=final.get("reason", ""),
            median_ms=rec.get("median_ms"), dense_ms=rec.get("dense_ms"), expected_ms=rec.get("expected_ms"),
            speedup_vs_dense=rec.get("speedup_vs_dense"), pct_of_roofline=rec.get("pct_of_roofline"),
            bottleneck=rec.get("bottleneck"))
    else:
        best = BestKernel(template="dense", selection=final.get("selection", "no_candidate"),
                          reason=final.get("reason", "dense is best"),
                          median_ms=(dense or {}).get("median_ms"), dense_ms=(dense or {}).get("median_ms"),
                          speedup_vs_dense=1.0 if gpu else None)
    return Result(
        run_id=values.get("memory_run_id") or values.get("run_id") or thread_id, thread_id=thread_id,
        matrix_name=values.get("matrix_name") or A.name, matrix_key=values["matrix_key"], shape=A.shape, nnz=A.nnz,
        target={"name": target.name, "spec": target.model_dump(mode="json"), "measured_on": measured_on,
                "note": note},
        backend=ctx.backend, timings_are_gpu=gpu, n_values=list(ctx.n_values), dtype=ctx.dtype,
        policy=ctx.policy.name, report=values.get("report") or {},
        candidates=[CandidateRecord.model_validate(c) for c in values.get("candidates") or []],
        best=best, dense=dense, speedups=dict(final.get("speedups") or {}),
        speedups_are_estimates=bool(final.get("speedups_are_estimates", not gpu)),
        **{k: final.get(k) for k in ("best_vendor", "speedup_vs_best_vendor", "best_generated", "vendor_lead")},
        memory_hits=[{k: v for k, v in h.items() if k != "source"} for h in values.get("memory_hits") or []],
        decisions=list(values.get("decisions") or []),
        token_usage=RunTokenUsage.model_validate(values.get("token_usage") or {}),
        llm_calls=[LLMCall.model_validate(c) for c in values.get("llm_calls") or []],
        events=list(values.get("events") or []), stop_reason=values.get("stop_reason"), resumed=resumed,
        wall_seconds=round(wall, 3), node_seconds=dict(node_seconds or {}),
        verified_ns=_verified_ns(ctx, vendor=rec.get("origin") == "vendor") if rec else [],
        sandbox=_sandbox_layers(ctx))


def _sandbox_layers(ctx) -> dict:
    """Which isolation layers the run's worker had (network namespace or not, limits, audit hook)."""
    from sparseditto.harness.sandbox import default_pool_if_started

    pool = default_pool_if_started()
    info = pool.worker_info(ctx.backend).get("sandbox", {}) if pool is not None else {}
    return {k: v for k, v in info.items() if k in ("network", "audit_hook", "limits")}


def _verified_ns(ctx, vendor: bool = False) -> list[int]:
    """The N values the answer was verified at: the debugger's list plus the odd ones the harness
    adds for a generated kernel; the debugger's list alone for a vendor path (agents/vendors.py)."""
    from sparseditto.agents.state import verify_n_values
    from sparseditto.harness.verify import verification_ns

    if vendor:
        return list(verify_n_values(ctx))
    return list(verification_ns(verify_n_values(ctx), ctx.backend))


__all__ = ["run_graph", "Result", "BestKernel", "CandidateRecord", "SpMMKernel", "derive_thread_id"]
