"""`patch_model(model, bundle)`: the bundle's kernels in place of matching ``nn.Linear`` forwards.

y = x W^T is computed as (W x^T)^T: the kernel multiplies the sparse weight W [out, in] by
B = x^T [in, N] (N = tokens), through the custom op ``sparseditto::bundle_linear``
(`torch.library.custom_op`) with a fake (meta) implementation, so `torch.compile` traces through
it (the op itself stays opaque to the compiler). The module keeps its name, parameters and
state_dict; only its ``forward`` is replaced (`unpatch_model` restores it).

Without copies: B is the transposed *view* of x's rows and the kernel writes into the transposed
view of y [N, out], so neither x^T nor y is materialised. Triton templates read B's and C's
strides, so that is the whole cost; a CUDA C++ (CuPy) kernel walks columns with unit stride and
makes its own unit-stride stand-ins (`kernel_templates.runtime.cuda_operands`: one copy of x^T
in, one of C out; none at N = 1). The harness verifies kernels on contiguous B only, so the first
call of each layer at each N runs both layouts once and compares them bitwise; a kernel that
disagrees (one that ignores a stride) keeps the contiguous copies, with a warning. That check is
skipped while a CUDA graph is being captured (the copying path runs until an eager call checks).

A kernel runs only where it was verified: at the bundle's N values and dtype. Any other N or
dtype, or a device the kernel cannot run on, takes the dense forward instead, with a warning the
first time per layer and reason. And it runs only where it is faster: at an N where the batch
measured the kernel slower than dense cuBLAS (the bundle's ``n_speedups`` below 1.0; a decode
kernel chosen at N = 1 can be 4x slower than cuBLAS at N = 16), the dense forward runs, by design
and without a warning (``PatchedLinear.dense_by_choice`` counts those calls). A weight whose shape
or sparsity structure differs from the one the bundle verified is refused (ValueError) before
anything is patched.

Why a direct call in eager mode: in eager PyTorch the custom op's dispatcher, the fallback checks
and SpMMKernel's input checks cost tens of microseconds per call, as much as a decode kernel runs
(the H200, session 23: a patched 3-layer MLP 2.2-4.2x slower than dense, most of it host time).
So each layer decides once per (N, dtype, device, autograd) and caches the answer, and outside
`torch.compile` the forward calls the op's implementation directly; under `torch.compile` (and so
in compiled CUDA graphs) the forward goes through ``torch.ops.sparseditto.bundle_linear``.

Why eager calls measure (``eager="measure"``, the default): even without the dispatcher, a patched
layer's eager call costs more host time than its kernel runs, so an eagerly launched decode step
stayed 2x slower than dense on the H200 while the same layers inside a CUDA graph were 1.4-1.8x
faster (docs/batch.md). On a GPU each layer therefore times both paths once per (N, dtype, device)
in the eager setting (`eager_cost`: host issue time and cold-L2 GPU time, the slower setting the
pace) and runs the cheaper eagerly (``PatchedLinear.dense_by_measure`` counts the dense ones,
``eager_costs`` keeps the figures). During CUDA-graph capture and under `torch.compile` the
kernel runs: there the launch costs are gone and the batch's graph-replayed ratios decided.
``eager="kernel"`` skips the measurement (the kernel wherever it is verified and faster).
"""
from __future__ import annotations

import os
import sys
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

_KERNELS: dict[str, "PatchedLinear"] = {}
_LOCK = threading.Lock()


@dataclass
class PatchedLinear:
    """What one patched layer runs: its bundle kernel and where it may run it."""

    name: str
    kernel: Any                     # sparseditto.api.SpMMKernel over the layer's weight
    verified_ns: frozenset
    verified_dtype: str
    out_features: int
    warned: set = field(default_factory=set)
    calls: int = 0                  # kernel calls (not the dense fallbacks)
    fallbacks: int = 0
    strided_ok: dict = field(default_factory=dict)   # (device, N) -> strided views give the same bits
    n_speedups: dict = field(default_factory=dict)   # N -> the batch's kernel-vs-dense ratio there
    dense_by_choice: int = 0        # calls at an N where dense was measured faster (no warning)
    decisions: dict = field(default_factory=dict)    # (dtype, N, device type, autograd) -> None | reason
    eager: str = "measure"          # "measure": eager calls take the path measured cheaper; "kernel": always it
    eager_paths: dict = field(default_factory=dict)  # (dtype, N, torch.device) -> "kernel" | "dense" (eager calls)
    eager_costs: dict = field(default_factory=dict)  # (dtype, N, torch.device) -> {"kernel": .., "dense": .., "path": ..}
    dense_by_measure: int = 0       # eager calls run dense because dense measured cheaper there

    def route(self, x: torch.Tensor, weight: torch.Tensor) -> str | None:
        """None to run the kernel, "dense" where the batch measured dense faster at this N, else the
        reason for the dense fallback; decided once per (dtype, N, device type, autograd)."""
        grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
        n = x.numel() // max(1, x.shape[-1])
        key = (x.dtype, n, x.device.type, grad)
        if key not in self.decisions:
            reason = self.fallback_reason(x, weight)
            if reason is None and self.n_speedups.get(n, 1.0) < 1.0:
                reason = "dense"
            self.decisions[key] = reason
        return self.decisions[key]

    def linear_into(self, rows: torch.Tensor, y: torch.Tensor) -> None:
        """y [N, out] = rows [N, in] @ W^T through the kernel, on transposed views when that was
        checked to give the same bits as contiguous copies (see the module docstring)."""
        key = (str(rows.device), rows.shape[0])
        ok = self.strided_ok.get(key)
        if ok is None and not _capturing(rows):
            self.kernel.spmm_into(rows.t(), y.t())
            copied = self.kernel(rows.t().contiguous())
            ok = self.strided_ok[key] = bool(torch.equal(copied, y.t()))
            if not ok:
                self.warn_once("strided views", f"sparseditto: {self.name}'s kernel gives other results on "
                               "strided views of x^T and y than on contiguous copies; it gets the copies from now on.")
                y.copy_(copied.t())
            return
        if ok:
            self.kernel.spmm_into(rows.t(), y.t())
        else:
            y.copy_(self.kernel(rows.t().contiguous()).t())

    def eager_path(self, x: torch.Tensor, module: torch.nn.Linear) -> str:
        """"kernel" or "dense" for an eager call the kernel may serve: on a GPU with eager="measure",
        the path measured cheaper per call at this (dtype, N, device), measured on the first such
        call (module docstring); "kernel" otherwise (in the interpreter the kernel runs for its
        correctness, not its speed)."""
        if self.eager != "measure" or not x.is_cuda:
            return "kernel"
        key = (x.dtype, x.numel() // max(1, x.shape[-1]), x.device)    # per call: no string building
        path = self.eager_paths.get(key)
        if path is None:
            path = self.eager_paths[key] = self._measure_eager(key, x, module)
        return path

    def _measure_eager(self, key: tuple, x: torch.Tensor, module: torch.nn.Linear) -> str:
        from sparseditto.batch import eager_cost

        bias = module.bias

        def kernel_call():
            y = _linear(self, x)
            return y if bias is None else y + bias

        def dense_call():
            return torch.nn.functional.linear(x, module.weight, bias)

        kernel_call(), dense_call()    # first calls: the strided-view check, cuBLAS's first-call setup
        costs = eager_cost.measure({"kernel": kernel_call, "dense": dense_call}, device=x.device)
        path = "kernel" if costs["kernel"].per_call_us <= costs["dense"].per_call_us else "dense"
        self.eager_costs[key] = {"kernel": costs["kernel"].as_dict(), "dense": costs["dense"].as_dict(), "path": path}
        return path

    def fallback_reason(self, x: torch.Tensor, weight: torch.Tensor) -> str | None:
        if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
            return ("autograd (the kernels are for inference: run under torch.no_grad() or "
                    "torch.inference_mode(); the dense forward keeps training correct)")
        dtype = str(x.dtype).replace("torch.", "")
        n = x.numel() // max(1, x.shape[-1])
        if dtype != self.verified_dtype:
            return f"dtype {dtype} (the kernel was verified for {self.verified_dtype})"
        if n not in self.verified_ns:
            return f"N={n} tokens (the kernel was verified for N in {sorted(self.verified_ns)})"
        if x.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            return "a CPU tensor without the Triton interpreter (set TRITON_INTERPRET=1 before importing triton)"
        if x.is_cuda:
            why = arch_fallback(getattr(self.kernel, "template", None), torch.cuda.get_device_name(x.device),
                                torch.cuda.get_device_capability(x.device))
            if why:
                return f"a GPU its kernel cannot run on ({why})"
        return None

    def warn_once(self, reason: str, message: str | None = None) -> None:
        if reason not in self.warned:
            self.warned.add(reason)
            warnings.warn(message or f"sparseditto: {self.name} runs dense for {reason}; later calls like this stay "
                          "dense without another warning.", stacklevel=3)


def arch_fallback(template: str | None, gpu_name: str, capability: tuple) -> str | None:
    """Why a bundle kernel of ``template`` cannot run on this GPU (a bundle made on an H200 and
    patched in on an A100: the tensor-core tier needs compute capability 9.0), or None. A kernel
    that is not a registry template (written by an LLM) declares nothing and is tried."""
    from types import SimpleNamespace

    from sparseditto.kernel_templates.registry import get_template

    try:
        t = get_template(str(template))
    except ValueError:
        return None
    return t.arch_reason(SimpleNamespace(name=gpu_name, compute_capability=tuple(capability)))


def _linear(entry: PatchedLinear, x: torch.Tensor) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])                  # [N, in]: a view of a contiguous x
    y = x.new_empty((rows.shape[0], entry.out_features))
    entry.linear_into(rows, y)                         # y^T = W @ x^T, written through views
    return y.reshape(*x.shape[:-1], entry.out_features)


@torch.library.custom_op("sparseditto::bundle_linear", mutates_args=())
def bundle_linear(x: torch.Tensor, key: str) -> torch.Tensor:
    """x @ W^T for the patched layer ``key``, as (W @ x^T)^T through its bundle kernel."""
    return _linear(_KERNELS[key], x)


def _capturing(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


@bundle_linear.register_fake
def _bundle_linear_fake(x: torch.Tensor, key: str) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], _KERNELS[key].out_features))


def _forward(module: torch.nn.Linear, key: str):
    entry = _KERNELS[key]

    def forward(x: torch.Tensor) -> torch.Tensor:
        reason = entry.route(x, module.weight)
        if reason is not None:
            if reason == "dense":
                entry.dense_by_choice += 1
            else:
                entry.fallbacks += 1
                entry.warn_once(reason)
            return torch.nn.functional.linear(x, module.weight, module.bias)
        if torch.compiler.is_compiling():
            y = torch.ops.sparseditto.bundle_linear(x, key)
        elif _capturing(x) or entry.eager_path(x, module) == "kernel":
            y = _linear(entry, x)   # the op's implementation without the dispatcher (module docstring)
        else:
            entry.dense_by_measure += 1
            return torch.nn.functional.linear(x, module.weight, module.bias)
        entry.calls += 1
        return y if module.bias is None else y + module.bias
    return forward


def _ensure_interpreter() -> None:
    """Without a GPU the kernels run in the Triton interpreter, which must be chosen before Triton
    is first imported (as `run_graph` does)."""
    if not torch.cuda.is_available() and "triton" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")


EAGER_MODES = ("measure", "kernel")


def patch_model(model: torch.nn.Module, bundle, *, strict: bool = False, eager: str = "measure"
                ) -> dict[str, PatchedLinear]:
    """Patch every ``nn.Linear`` of ``model`` whose ``<name>.weight`` has a kernel in ``bundle``
    (a `Bundle` or its folder). Returns {module name: PatchedLinear}. Every weight is checked
    against the bundle's signature first: a mismatch is a ValueError and nothing is patched.
    ``strict``: also refuse bundle kernels that match no nn.Linear of the model. ``eager``:
    "measure" (eager calls on a GPU take whichever of kernel and dense measured cheaper per call,
    module docstring) or "kernel" (always the kernel where it is verified and faster)."""
    from sparseditto.batch.bundle import Bundle, load_bundle
    from sparseditto.io import load_matrix

    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"patch_model needs an nn.Module, got {type(model).__name__}.")
    if eager not in EAGER_MODES:
        raise ValueError(f"patch_model's eager must be one of {EAGER_MODES}, got {eager!r}.")
    bundle = bundle if isinstance(bundle, Bundle) else load_bundle(bundle)
    _ensure_interpreter()
    chosen = []
    for name, module in model.named_modules():
        key = f"{name}.weight" if name else "weight"
        if isinstance(module, torch.nn.Linear) and key in bundle.kernels:
            A = load_matrix(module.weight.detach(), name=key)
            bundle.check_weight(key, A)           # raises before anything is patched
            chosen.append((name, module, key, A))
    if strict:
        unused = sorted(set(bundle.kernels) - {key for _, _, key, _ in chosen})
        if unused:
            raise ValueError(f"Bundle kernels match no nn.Linear of the model: {unused[:5]}.")
    patched = {}
    for name, module, key, A in chosen:
        entry = bundle.kernels[key]
        op_key = f"{id(module)}:{key}"
        state = PatchedLinear(name=name or key, kernel=bundle.kernel(key, A), verified_ns=frozenset(entry.verified_ns),
                              verified_dtype=entry.verified_dtype, out_features=module.out_features,
                              n_speedups={int(n): float(v) for n, v in entry.n_speedups.items()}, eager=eager)
        with _LOCK:
            _KERNELS[op_key] = state
        module.forward = _forward(module, op_key)
        module._sparseditto_patch = state
        patched[name or key] = state
    return patched


def unpatch_model(model: torch.nn.Module) -> int:
    """Give every patched layer its own forward back; returns how many were patched."""
    count = 0
    for module in model.modules():
        state = module.__dict__.pop("_sparseditto_patch", None)
        if state is not None:
            module.__dict__.pop("forward", None)
            count += 1
    return count
