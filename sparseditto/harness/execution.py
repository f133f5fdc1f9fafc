"""Worker-side plumbing shared by the compile, verify and bench tasks.

Loading a candidate, calling it, synchronizing, and turning whatever it raised into a
(status, failure_class) pair the debugger agent can route on. Runs inside the sandboxed worker.
"""
from __future__ import annotations

import traceback
from dataclasses import dataclass

from .worker import is_sticky_cuda_error

_TB_LIMIT = 6000


class CandidateFailure(Exception):
    """Raised inside a task to stop at the first failure with a classified outcome."""

    def __init__(self, status: str, failure_class: str, message: str, log: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.failure_class = failure_class
        self.message = message
        self.log = log


def device_for(backend: str) -> str:
    return "cuda" if backend == "cuda" else "cpu"


def synchronize(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


class BuiltinDense:
    """The trusted cuBLAS floor: ``torch.matmul`` on the densified A (never a candidate source)."""

    @staticmethod
    def prepare(A, dtype, device) -> dict:
        return {"dense": A.to_torch(dtype=dtype, device=device, layout="dense")}

    @staticmethod
    def spmm(packed, B, out) -> None:
        import torch

        torch.matmul(packed["dense"], B, out=out)


def classify_exception(exc: BaseException, phase: str) -> tuple[str, str]:
    """(status, failure_class) for an exception raised while importing/preparing/running."""
    name = type(exc).__name__
    module = type(exc).__module__ or ""
    text = f"{name}: {exc}"
    if is_sticky_cuda_error(text):
        return "crash", "illegal_memory_access" if "illegal" in text.lower() else "cuda_sticky_error"
    if phase == "import":
        if isinstance(exc, SyntaxError):
            return "compile_error", "syntax_error"
        return "compile_error", "import_error"
    if name == "OutOfResources":
        return "compile_error", "out_of_resources"
    if name in ("CompilationError", "CompileTimeAssertionFailure", "InterpreterError") or \
            module.startswith("triton.compiler"):
        return "compile_error", "triton_compile_error"
    if name == "CompileException" or module.startswith("cupy.cuda.compiler"):
        return "compile_error", "cuda_compile_error"
    if name in ("CUDADriverError", "CUDARuntimeError") or "CUDA error" in str(exc):
        return "runtime_error", "cuda_error"
    if name == "OutOfMemoryError":
        return "runtime_error", "out_of_memory"
    return "runtime_error", "python_exception"


def failure_from_exception(exc: BaseException, phase: str) -> CandidateFailure:
    status, failure_class = classify_exception(exc, phase)
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    if len(tb) > _TB_LIMIT:
        tb = "[... traceback truncated ...]\n" + tb[-_TB_LIMIT:]
    first = str(exc).strip().splitlines()
    summary = first[0] if first else ""
    if len(first) > 1 and type(exc).__name__ in ("CompilationError", "InterpreterError"):
        summary = " ".join(line.strip() for line in first[-3:])
    message = f"{phase}: {type(exc).__name__}: {summary[:600]}"
    return CandidateFailure(status, failure_class, message, log=tb)


def load_candidate(spec):
    """The candidate's module (or the builtin dense shim); import failures become CandidateFailure."""
    if spec.is_builtin_dense:
        return BuiltinDense
    from .source_loader import load_module

    try:
        module = load_module(spec.source)
    except BaseException as exc:  # SyntaxError, ImportError, NameError at module level, SystemExit
        raise failure_from_exception(exc, "import") from None
    for name in ("prepare", "spmm"):
        if not callable(getattr(module, name, None)):
            raise CandidateFailure("compile_error", "missing_entry_point",
                                   f"import: the module defines no callable {name}()")
    return module


def call_prepare(module, matrix, dtype: str, device: str) -> dict:
    from .numerics import torch_dtype

    try:
        packed = module.prepare(matrix, torch_dtype(dtype), device)
        synchronize(device)
    except BaseException as exc:
        raise failure_from_exception(exc, "prepare") from None
    if not isinstance(packed, dict):
        raise CandidateFailure("runtime_error", "bad_prepare_result",
                               f"prepare: must return a dict of tensors, got {type(packed).__name__}")
    return packed


def call_spmm(module, packed: dict, B, out, device: str) -> None:
    try:
        module.spmm(packed, B, out)
        synchronize(device)
    except BaseException as exc:
        raise failure_from_exception(exc, "spmm") from None


@dataclass
class Snapshot:
    """Byte copies of every array reachable from the packed dict, to prove spmm left them alone.

    Keys starting with ``scratch`` are the documented exception: workspace a kernel may overwrite
    (e.g. split-K partials). Non-array leaves (ints, strings, kernel handles) are compared for
    identity of the key set only.
    """

    keys: frozenset
    arrays: dict

    @classmethod
    def take(cls, packed: dict) -> "Snapshot":
        arrays: dict = {}
        _walk(packed, "", arrays, clone=True)
        return cls(keys=frozenset(packed.keys()), arrays=arrays)

    def changed(self, packed: dict) -> list[str]:
        if frozenset(packed.keys()) != self.keys:
            added = sorted(map(str, set(packed.keys()) - self.keys))
            removed = sorted(map(str, self.keys - set(packed.keys())))
            return [f"packed keys changed (added {added}, removed {removed})"]
        now: dict = {}
        _walk(packed, "", now, clone=False)
        bad = []
        for path, before in self.arrays.items():
            after = now.get(path)
            if after is None or not _same_bytes(before, after):
                bad.append(f"packed[{path}]")
        return bad


def _walk(obj, path: str, out: dict, clone: bool) -> None:
    import numpy as np
    import torch

    if isinstance(obj, torch.Tensor):
        out[path] = obj.detach().clone() if clone else obj.detach()
    elif isinstance(obj, np.ndarray):
        out[path] = obj.copy() if clone else obj
    elif isinstance(obj, dict):
        for key, value in obj.items():
            if isinstance(key, str) and key.startswith("scratch"):
                continue
            _walk(value, f"{path}.{key}" if path else str(key), out, clone)
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            _walk(value, f"{path}[{i}]", out, clone)


def _same_bytes(a, b) -> bool:
    import numpy as np
    import torch

    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.shape == b.shape and a.dtype == b.dtype and \
            a.tobytes() == b.tobytes()
    if not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    return torch.equal(_as_bytes(a), _as_bytes(b))


def _as_bytes(t):
    import torch

    flat = t.contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.numel() else flat
