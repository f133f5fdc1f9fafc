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


def is_trusted(module) -> bool:
    """A vendor kernel of the harness (dense cuBLAS, cuSPARSE, ...), not a candidate module: it runs
    without the gate and the tracers (it *is* the library calls they refuse in candidates)."""
    from .vendor_kernels import VENDOR_KERNELS

    return any(module is k for k in VENDOR_KERNELS.values())


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


def run_candidate(wctx, what: str, fn, *args, tracers=()):
    """Call candidate code ``fn(*args)`` inside the sandbox gate and judge what it did.

    Order of verdicts: anything the audit hook or a tracer refused (even when the candidate
    caught the exception) -> "refused"; a Python thread it left behind, a torch mode it left
    pushed, a torch global it changed, or a change to the modules and types the verifier relies
    on -> "refused", and for the last three the worker is marked tainted (replaced after this
    task); an exception of its own -> classified as usual. The exception is formatted while the
    gate is still closed: a candidate's exception class may run code in ``__str__``.
    """
    from . import guard

    threads = guard.python_threads()
    integrity = getattr(wctx, "integrity", None)
    if integrity is None:
        integrity = wctx.integrity = guard.Integrity.take()
    failure = None
    result = None
    scope = wctx.gate.scope(what)
    with scope:
        try:
            if tracers:
                _call_traced(list(tracers), fn, args)
            else:
                result = fn(*args)
        except BaseException as exc:  # judged below, after the gate is open again
            failure = exc if isinstance(exc, CandidateFailure) else failure_from_exception(exc, what)
    refused = list(scope.violations)
    for tracer in tracers:
        refused += [str(r) for r in getattr(tracer, "refusals", [])]
        check = getattr(tracer, "check", None)
        if check is not None and failure is None:
            try:
                check()
            except guard.SandboxViolation as exc:
                refused.append(str(exc))
    left = guard.python_threads() - threads
    if left:
        refused.append(f"{what} left {len(left)} Python thread(s) running (work outside the traced call)")
    changed = integrity.changed()
    if changed:
        wctx.tainted.extend(changed)
        refused.append(f"{what} changed what the verifier relies on (monkeypatched): {', '.join(changed[:6])}")
    if refused:
        raise CandidateFailure("refused", _refusal_class(refused[0]), f"{what}: {refused[0]}",
                               log="\n".join(refused))
    if failure is not None:
        raise failure
    integrity.refresh()
    return result


def _call_traced(tracers: list, fn, args) -> None:
    if not tracers:
        fn(*args)
        return
    with tracers[0]:
        _call_traced(tracers[1:], fn, args)


def _refusal_class(message: str) -> str:
    for kind in ("vendor_op", "host_export", "scalar_reads", "vendor_kernel", "foreign_kernel"):
        if kind.replace("_", " ") in message or kind in message:
            return kind
    if "monkeypatched" in message:
        return "monkeypatch"
    if "packed" in message or "module-level" in message or "state" in message:
        return "state_carried"
    if "thread" in message:
        return "side_thread"
    if "aten::" in message:
        return "vendor_op"
    if "library kernel" in message:
        return "vendor_kernel"
    if "not one of the candidate's kernels" in message:
        return "foreign_kernel"
    if "to the host" in message:
        return "host_export"
    return "sandbox_violation"


def load_candidate(spec, wctx):
    """The candidate's entry points (or the builtin dense shim); import failures become
    CandidateFailure. Looking the functions up happens inside the gate as well: a module can
    swap its own class for one whose attribute access runs code."""
    if spec.is_builtin:
        from .vendor_kernels import vendor_kernel

        return vendor_kernel(spec.template)
    from types import SimpleNamespace

    from .source_loader import import_path, write_source

    path = write_source(spec.source)
    wctx.gate.add_candidate_file(path)

    def load():
        module = import_path(path)
        entry = {name: getattr(module, name, None) for name in ("prepare", "spmm")}
        missing = [name for name, fn in entry.items() if not callable(fn)]
        if missing:
            raise CandidateFailure("compile_error", "missing_entry_point",
                                   f"import: the module defines no callable {missing[0]}()")
        return SimpleNamespace(module=module, source=spec.source, **entry)

    return run_candidate(wctx, "import", load)


def call_prepare(module, matrix, dtype: str, device: str, wctx) -> dict:
    from .numerics import torch_dtype

    def prepare():
        packed = module.prepare(matrix, torch_dtype(dtype), device)
        synchronize(device)
        return packed

    if is_trusted(module):
        try:
            packed = prepare()
        except Exception as exc:   # VendorUnavailable (e.g. sm80+ only) or the library refusing this matrix
            raise failure_from_exception(exc, "prepare") from None
    else:
        packed = run_candidate(wctx, "prepare", prepare)
    if type(packed) is not dict:
        raise CandidateFailure("runtime_error", "bad_prepare_result",
                               f"prepare: must return a plain dict of tensors, got {type(packed).__name__}")
    return packed


def spmm_tracers(wctx, device: str, source: str) -> tuple:
    """The tracers a verification call of spmm runs under (op tracing; kernel tracing on CUDA)."""
    from .tracing import KernelTracer, OpTracer, own_kernel_names

    roots = tuple(getattr(wctx, "interpreter_roots", ()) or ())
    if not roots:
        from .guard import _package_dir

        triton_dir = _package_dir("triton")
        roots = wctx.interpreter_roots = ((triton_dir + "/",) if triton_dir else ())
    tracers = [OpTracer(interpreter_roots=roots)]
    if device == "cuda":
        tracers.insert(0, KernelTracer(own_kernel_names(source)))
    return tuple(tracers)


def call_spmm(module, packed: dict, B, out, device: str, wctx, *, source: str | None = None,
              traced: bool = True) -> None:
    """One spmm call under the gate; ``traced`` adds the op/kernel tracers (verification calls)."""
    def spmm():
        module.spmm(packed, B, out)
        synchronize(device)

    if is_trusted(module):
        try:
            spmm()
        except BaseException as exc:
            raise failure_from_exception(exc, "spmm") from None
        return
    tracers = spmm_tracers(wctx, device, source or "") if traced else ()
    run_candidate(wctx, "spmm", spmm, tracers=tracers)


# ---- state a call may not change -------------------------------------------------------------------

def is_scratch_key(key) -> bool:
    return isinstance(key, str) and key.startswith("scratch")


def packed_nbytes(packed: dict) -> int:
    """Bytes of every array reachable from the packed dict outside ``scratch`` keys, each storage
    counted once: what the kernel can read of A as it packed it (the measured side of a byte
    roofline; an LLM's kernel is costed with it)."""
    import numpy as np
    import torch

    arrays: dict = {}
    _describe(packed, "packed", {}, arrays, clone=False)
    storages: dict = {}
    for arr in arrays.values():
        if isinstance(arr, torch.Tensor):
            storage = arr.untyped_storage()
            key, size = (str(arr.device), storage.data_ptr()), storage.nbytes()
        else:
            base = arr if arr.base is None else arr.base
            key, size = ("numpy", np.asarray(base).__array_interface__["data"][0]), np.asarray(base).nbytes
        storages[key] = max(storages.get(key, 0), int(size))
    return int(sum(storages.values()))


def _clone_tree(obj):
    import numpy as np
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, np.ndarray):
        return obj.copy()
    if isinstance(obj, dict):
        return type(obj)((k, _clone_tree(v)) for k, v in obj.items()) if type(obj) is dict else dict(
            (k, _clone_tree(v)) for k, v in obj.items())
    if isinstance(obj, list):
        return [_clone_tree(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_clone_tree(v) for v in obj)
    return obj


@dataclass
class Snapshot:
    """Everything a call of spmm must leave as it found it, and the scratch it may use.

    * the packed dict: its structure at every depth (keys, types, lengths), every array's bytes,
      every tensor's shape/dtype/device/strides/storage offset/address and the attributes set on
      it, and the identity of every other object in it;
    * the candidate module's globals: identity of each value, the contents of module-level
      containers (a dict used as an output cache), attributes set on its functions and classes;
    * keys starting with ``scratch`` are the documented workspace: not compared, but reset to
      their state right after ``prepare`` before every verification call (`reset_scratch`), so a
      scratch cache cannot carry an output from one call to the next.
    """

    layout: dict
    arrays: dict
    scratch: dict
    module_state: dict

    @classmethod
    def take(cls, packed: dict, module=None) -> "Snapshot":
        layout: dict = {}
        arrays: dict = {}
        _describe(packed, "packed", layout, arrays, clone=True)
        scratch = {k: _clone_tree(v) for k, v in packed.items() if is_scratch_key(k)}
        return cls(layout=layout, arrays=arrays, scratch=scratch, module_state=_module_state(module))

    def reset_scratch(self, packed: dict) -> None:
        for key, value in self.scratch.items():
            packed[key] = _clone_tree(value)

    def changed(self, packed: dict, module=None) -> list[str]:
        layout: dict = {}
        now: dict = {}
        _describe(packed, "packed", layout, now, clone=False)
        bad = []
        for path in sorted(set(self.layout) | set(layout)):
            if self.layout.get(path) != layout.get(path):
                before, after = self.layout.get(path), layout.get(path)
                what = "added" if before is None else "removed" if after is None else "changed"
                bad.append(f"{path} {what}" + (f" ({_short(before)} -> {_short(after)})" if what == "changed" else ""))
        for path, before in self.arrays.items():
            after = now.get(path)
            if after is not None and not _same_bytes(before, after):
                bad.append(f"{path} contents changed")
        if module is not None:
            state = _module_state(module)
            for name in sorted(self.module_state):
                if self.module_state.get(name) != state.get(name):
                    bad.append(f"module-level '{name}' changed (state kept between calls)")
        return bad


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _describe(obj, path: str, layout: dict, arrays: dict, clone: bool, depth: int = 0) -> None:
    import numpy as np
    import torch

    if depth > 8:
        layout[path] = ("deep", id(obj))
        return
    if isinstance(obj, torch.Tensor):
        attrs = tuple(sorted((str(k), id(v)) for k, v in vars(obj).items())) if hasattr(obj, "__dict__") else ()
        layout[path] = ("tensor", tuple(obj.shape), str(obj.dtype), str(obj.device), tuple(obj.stride()),
                        obj.storage_offset(), obj.data_ptr() if obj.numel() else 0, type(obj).__name__, attrs)
        arrays[path] = obj.detach().clone() if clone else obj.detach()
    elif isinstance(obj, np.ndarray):
        layout[path] = ("ndarray", obj.shape, str(obj.dtype))
        arrays[path] = obj.copy() if clone else obj
    elif isinstance(obj, dict):
        layout[path] = ("dict", type(obj).__name__, tuple(sorted(map(repr, obj.keys()))))
        for key, value in obj.items():
            if is_scratch_key(key) and depth == 0:
                continue
            _describe(value, f"{path}[{key!r}]", layout, arrays, clone, depth + 1)
    elif isinstance(obj, (list, tuple)):
        layout[path] = (type(obj).__name__, len(obj))
        for i, value in enumerate(obj):
            _describe(value, f"{path}[{i}]", layout, arrays, clone, depth + 1)
    elif obj is None or isinstance(obj, (bool, int, float, complex, str, bytes)):
        layout[path] = ("value", type(obj).__name__, obj)
    else:
        attrs = ()
        try:
            attrs = tuple(sorted((str(k), id(v)) for k, v in vars(obj).items()))
        except TypeError:
            pass
        layout[path] = ("object", type(obj).__name__, id(obj), attrs)


def _module_state(module) -> dict:
    """What of the candidate module's globals could carry an output between calls: containers
    (their contents), plain values (rebinding), and the attributes of the functions and classes
    it defines. Names added later, modules and Triton's objects are left out: Triton's
    interpreter rewrites kernel globals and caches on its JIT functions as it runs."""
    if module is None or not hasattr(module, "__dict__"):
        return {}
    own = getattr(module, "__name__", None)
    out = {}
    for name, value in list(vars(module).items()):
        if name.startswith("__") and name.endswith("__"):
            continue
        kind = type(value)
        if kind.__module__.startswith("triton") or isinstance(value, type(module)):
            continue
        if isinstance(value, (dict, list, set, bytearray)):
            try:
                items = value.items() if isinstance(value, dict) else enumerate(
                    sorted(value, key=repr) if isinstance(value, set) else value)
                out[name] = (id(value), len(value), tuple((repr(k), id(v)) for k, v in items))
            except Exception:
                out[name] = (id(value), len(value))
        elif value is None or isinstance(value, (bool, int, float, complex, str, bytes, tuple, frozenset)):
            out[name] = (id(value),)
        elif getattr(value, "__module__", None) == own and (callable(value) or isinstance(value, type)):
            try:
                out[name] = (id(value), tuple(sorted((str(k), id(v)) for k, v in vars(value).items()
                                                     if not (str(k).startswith("__") and str(k).endswith("__")))))
            except TypeError:
                out[name] = (id(value),)
        else:
            hint = getattr(value, "__length_hint__", None)
            entry: tuple = (id(value),)
            if hint is not None:
                try:
                    entry += (hint(),)
                except Exception:
                    pass
            out[name] = entry
    return out


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
