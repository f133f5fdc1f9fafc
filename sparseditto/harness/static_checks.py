"""AST checks that refuse candidate sources which could win by cheating instead of computing.

A generated kernel is judged by its speed against cuBLAS, so the cheapest way to "win" is to call a
vendor GEMM (or cuSPARSE) behind the kernel's back, to cache outputs between calls, to hide work on
a side stream the timer does not see, or to read the answer from somewhere. These checks walk the
syntax tree (regexes alone are defeated by aliases and string tricks) and reject:

* imports outside a small allow-list; relative and wildcard imports;
* vendor matmul paths: torch/numpy/cupy ``mm``/``matmul``/``bmm``/``addmm``/``einsum``/``tensordot``/
  ``linear``/``dot`` (except ``triton.language.dot``)..., the ``@`` operator, ``torch.nn``,
  ``torch.linalg``, ``torch.sparse`` and ``.to_sparse*``, ``torch.ops``/``torch._C``, ``cupyx``,
  cuBLAS/cuSPARSE handles;
* file, network and process access (``open``, ``torch.load``, ``np.save``, ``os``, ``subprocess``,
  sockets, threads) including through re-exports such as ``torch.os``;
* escapes that hide the above: ``eval``/``exec``/``compile``/``__import__``, ``globals``/``vars``,
  ``getattr`` with a computed name, dunder and private attributes, modules passed around as values;
* CUDA streams, events and graphs created by the candidate (work off the timed stream);
* state that survives between calls: ``global``/``nonlocal``, mutation of module-level objects from
  inside functions, mutable default arguments, ``lru_cache`` on functions with parameters,
  instance state written in methods;
* ``#include "..."`` of local files in embedded CUDA source.

Dynamic verification (fresh inputs, NaN pre-fill, in-place refill of B) backs these checks up; the
static pass exists so that the obvious cheats never reach a GPU and the coder gets a precise reason.
"""
from __future__ import annotations

import ast
import re
import threading
from collections import OrderedDict

from .results import StaticCheckResult
from .source_loader import source_hash

# The project modules a candidate may use: formats and row orders (and the tensor-core fragment
# and delta-slice packers, the row-decomposition items), the templates' shared launch plumbing (trusted code: dtype names, PARAMS checks, cached
# launch plans) and the CUDA decode tier's CuPy launch path.
SPARSEDITTO_MODULES = ("sparseditto.formats", "sparseditto.reorder", "sparseditto.tc_formats", "sparseditto.delta_format",
                       "sparseditto.row_items", "sparseditto.kernel_templates.runtime", "sparseditto.kernel_templates.tc_launch")
ALLOWED_MODULES = frozenset({
    "__future__", "math", "numpy", "torch", "triton", "triton.language", "cupy", "typing", "functools",
    *SPARSEDITTO_MODULES,
})
ALLOWED_MODULE_PREFIXES = ("triton.language.",)

# Dotted names that are modules: using one as a plain value (x = torch.cuda) escapes tracking.
KNOWN_SUBMODULES = frozenset({
    "torch.cuda", "torch.nn", "torch.linalg", "torch.sparse", "torch.fft", "torch.special",
    "torch.random", "torch.backends", "torch.utils", "torch.ops", "torch.library", "torch.testing",
    "numpy.linalg", "numpy.random", "numpy.lib", "numpy.fft", "numpy.ma", "numpy.core",
    "cupy.cuda", "cupy.linalg", "cupy.random", "cupy.fft", "triton.language", "triton.runtime",
    "triton.compiler", "triton.testing", "triton.language.extra", "triton.language.math",
    *SPARSEDITTO_MODULES,
})

BANNED_BUILTINS = {
    "eval": "eval() runs arbitrary code",
    "exec": "exec() runs arbitrary code",
    "compile": "compile() builds arbitrary code",
    "__import__": "__import__() bypasses the import allow-list",
    "open": "open() reads or writes files",
    "globals": "globals() exposes module state",
    "locals": "locals() exposes frame state",
    "vars": "vars() exposes object internals",
    "dir": "dir() is used to discover hidden attributes",
    "input": "input() reads stdin",
    "breakpoint": "breakpoint() starts a debugger",
    "help": "help() is interactive",
    "exit": "exit() ends the worker",
    "quit": "quit() ends the worker",
    "setattr": "setattr() rewrites objects by computed names",
    "delattr": "delattr() rewrites objects by computed names",
    "memoryview": "memoryview() gives raw memory access",
}

# Dense/sparse vendor products reachable as attributes of torch, numpy, cupy or tensors.
MATMUL_ATTRS = frozenset({
    "mm", "matmul", "bmm", "addmm", "addmm_", "addmv", "addmv_", "addbmm", "addbmm_", "baddbmm",
    "baddbmm_", "mv", "dot", "vdot", "inner", "einsum", "tensordot", "linear", "bilinear",
    "chain_matmul", "multi_dot", "matrix_power", "spmm", "smm", "sspaddmm", "hspmm",
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "convolution",
})
TRITON_DOT_OK = frozenset({"triton.language.dot", "triton.language.dot_scaled"})
VENDOR_LIB_ATTRS = frozenset({"cublas", "cublaslt", "cusparse", "cusparselt", "cusolver", "cutlass",
                              "cudnn", "cutensor", "sparse"})
STREAM_ATTRS = frozenset({"Stream", "stream", "Event", "ExternalStream", "CUDAGraph", "Graph",
                          "graph", "graphs", "make_graphed_callables", "set_stream",
                          "StreamContext", "wait_stream", "wait_event", "record_stream"})
BANNED_MODULE_NAMES = frozenset({
    "os", "sys", "subprocess", "io", "pathlib", "shutil", "socket", "pickle", "gc", "inspect",
    "ctypes", "importlib", "builtins", "multiprocessing", "threading", "urllib", "requests", "http",
    "signal", "tempfile", "glob", "platform", "marshal", "shelve", "runpy", "pty", "mmap",
    "resource", "atexit", "linecache", "cffi", "concurrent", "asyncio", "code", "cupyx",
})
# File I/O attribute names that are never legitimate in a kernel, whatever the receiver.
IO_ATTRS_ANYWHERE = frozenset({"tofile", "fromfile", "savez", "savez_compressed", "loadtxt",
                               "savetxt", "genfromtxt", "memmap", "from_file", "fromregex",
                               "DataSource", "read_text", "write_text", "read_bytes",
                               "write_bytes", "urlopen", "ctypeslib", "load_file"})
# I/O names that clash with Triton's tl.load/tl.store: banned only on torch/numpy/cupy paths.
IO_ATTRS_ON_LIBS = frozenset({"load", "save", "open"})
BANNED_PATH_PREFIXES = {
    "torch.nn": "torch.nn (F.linear, conv and friends call cuBLAS/cuDNN)",
    "torch.linalg": "torch.linalg (vendor matmul paths)",
    "torch.functional": "torch.functional (einsum and friends)",
    "torch.ops": "torch.ops (raw aten operators such as aten.mm)",
    "torch.hub": "torch.hub (downloads)",
    "torch.utils": "torch.utils (C++ extensions, data loaders, files)",
    "torch.distributed": "torch.distributed (network)",
    "torch.multiprocessing": "torch.multiprocessing (processes)",
    "torch.jit": "torch.jit (arbitrary compiled code)",
    "torch.compile": "torch.compile (Inductor may call cuBLAS)",
    "torch.library": "torch.library (custom operator registration)",
    "torch.backends": "torch.backends (global math-mode switches)",
    "torch.fx": "torch.fx", "torch.export": "torch.export", "torch.onnx": "torch.onnx",
    "torch.package": "torch.package (file I/O)", "torch.profiler": "torch.profiler",
    "torch.classes": "torch.classes", "torch.cuda.cudart": "torch.cuda.cudart (raw runtime)",
    "numpy.lib": "numpy.lib (file formats, raw strided views)",
    "numpy.linalg": "numpy.linalg (dense matmul paths)",
    "numpy.distutils": "numpy.distutils", "numpy.f2py": "numpy.f2py (compiles code)",
    "cupy.linalg": "cupy.linalg (cuBLAS)",
    "cupy.cuda.runtime": "cupy.cuda.runtime (raw CUDA runtime calls)",
    "cupy.cuda.driver": "cupy.cuda.driver (raw CUDA driver calls)",
    "cupy.cuda.profiler": "cupy.cuda.profiler",
}
MUTATING_METHODS = frozenset({"append", "extend", "insert", "update", "setdefault", "pop",
                              "popitem", "clear", "add", "discard", "remove", "sort", "reverse",
                              "put", "put_"})
CACHE_DECORATORS = frozenset({"functools.lru_cache", "functools.cache", "functools.cached_property"})
ALLOWED_CUDA_HEADERS = frozenset({
    "cuda_fp16.h", "cuda_bf16.h", "cuda_runtime.h", "cuda.h", "stdint.h", "mma.h",
    "cuda_pipeline.h", "cooperative_groups.h", "cuda_fp8.h", "vector_types.h", "math_constants.h",
})
_INCLUDE_RE = re.compile(r"^\s*#\s*include\s*([<\"])([^>\"]+)[>\"]", re.MULTILINE)
_IMMUTABLE_CALLS = frozenset({"tuple", "frozenset", "int", "float", "str", "bool", "bytes"})
_FUNCTION_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


# One check per source: the debugger, compile, verify, bench and ncu all gate on the same source,
# so its verdict is kept by content hash (a bounded, most-recently-used table).
_RESULTS: OrderedDict[str, StaticCheckResult] = OrderedDict()
_RESULTS_MAX = 512
_RESULTS_LOCK = threading.Lock()


def check_source(source: str) -> StaticCheckResult:
    """Run every static check on a candidate source (once per distinct source: the verdict is
    cached by content hash); never raises on bad input source."""
    if not isinstance(source, str):
        raise ValueError(f"Expected candidate source text (str), got {type(source).__name__}.")
    key = source_hash(source)
    with _RESULTS_LOCK:
        hit = _RESULTS.get(key)
        if hit is not None:
            _RESULTS.move_to_end(key)
            return hit.model_copy(deep=True)
    result = _check(source)
    with _RESULTS_LOCK:
        _RESULTS[key] = result
        while len(_RESULTS) > _RESULTS_MAX:
            _RESULTS.popitem(last=False)
    return result.model_copy(deep=True)


def _check(source: str) -> StaticCheckResult:
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        msg = f"syntax error at line {exc.lineno}: {exc.msg}"
        return StaticCheckResult(ok=False, violations=[msg], syntax_error=msg)
    checker = _Checker(tree)
    checker.run()
    return StaticCheckResult(ok=not checker.violations, violations=checker.violations)


def _dotted_prefixes(path: str) -> list[str]:
    parts = path.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _is_private(name: str) -> bool:
    return name.startswith("_")


class _Checker:
    """One pass over the tree with parent links; collects human-readable violations."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.violations: list[str] = []
        self._seen: set[str] = set()
        self.parents: dict[int, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parents[id(child)] = node
        self.aliases: dict[str, str] = {}       # local name -> dotted path it was imported as
        self.module_aliases: set[str] = set()   # local names bound to modules
        self.module_level: set[str] = set()     # names bound at module top level

    # ---- bookkeeping ---------------------------------------------------------------------------
    def flag(self, node: ast.AST | None, message: str) -> None:
        line = getattr(node, "lineno", None)
        text = f"line {line}: {message}" if line else message
        if text not in self._seen:
            self._seen.add(text)
            self.violations.append(text)

    def resolve(self, node: ast.AST) -> str | None:
        """Dotted path of a Name/Attribute chain rooted at an imported name, else None."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    # ---- driver --------------------------------------------------------------------------------
    def run(self) -> None:
        self._collect_imports()
        self._collect_module_level()
        self._check_required_functions()
        for node in ast.walk(self.tree):
            self._check_node(node)
        self._check_state_across_calls()

    # ---- imports -------------------------------------------------------------------------------
    @staticmethod
    def _module_allowed(name: str) -> bool:
        return name in ALLOWED_MODULES or name.startswith(ALLOWED_MODULE_PREFIXES)

    def _collect_imports(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if not self._module_allowed(alias.name):
                        self.flag(node, f"import of '{alias.name}' is not allowed "
                                        f"(allowed: {', '.join(sorted(ALLOWED_MODULES - {'__future__'}))})")
                        continue
                    if alias.asname:
                        self.aliases[alias.asname] = alias.name
                        self.module_aliases.add(alias.asname)
                    else:
                        root = alias.name.split(".")[0]
                        self.aliases[root] = root
                        self.module_aliases.add(root)
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level:
                    self.flag(node, f"relative import 'from {'.' * node.level}{module} import ...' is not allowed")
                    continue
                for alias in node.names:
                    if alias.name == "*":
                        self.flag(node, f"wildcard import 'from {module} import *' is not allowed")
                        continue
                    path = f"{module}.{alias.name}"
                    local = alias.asname or alias.name
                    if self._module_allowed(path) or path in KNOWN_SUBMODULES:
                        if not self._module_allowed(path):
                            self.flag(node, f"import of '{path}' is not allowed")
                            continue
                        self.aliases[local] = path
                        self.module_aliases.add(local)
                    elif self._module_allowed(module):
                        self.aliases[local] = path
                        self._check_path(node, path, [alias.name])
                    else:
                        self.flag(node, f"import from '{module}' is not allowed")

    def _collect_module_level(self) -> None:
        for stmt in self.tree.body:
            for node in ast.walk(stmt):
                if isinstance(node, _FUNCTION_NODES + (ast.ClassDef,)) and node is not stmt:
                    continue
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    self.module_level.add(node.id)
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.module_level.add(stmt.name)
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                for alias in stmt.names:
                    self.module_level.add((alias.asname or alias.name).split(".")[0])

    def _check_required_functions(self) -> None:
        defs = {s.name: s for s in self.tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for name, params in (("prepare", "(A, dtype, device)"), ("spmm", "(packed, B, out)")):
            fn = defs.get(name)
            if fn is None:
                self.flag(None, f"missing module-level function {name}{params}")
                continue
            if isinstance(fn, ast.AsyncFunctionDef):
                self.flag(fn, f"{name} must be a plain function, not async")
                continue
            positional = fn.args.posonlyargs + fn.args.args
            required = len(positional) - len(fn.args.defaults)
            if (len(positional) < 3 and fn.args.vararg is None) or required > 3 or \
                    any(d is None for d in fn.args.kw_defaults):
                self.flag(fn, f"{name} must accept exactly the arguments {params}")

    # ---- per-node rules ------------------------------------------------------------------------
    def _check_node(self, node: ast.AST) -> None:
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            kind = "global" if isinstance(node, ast.Global) else "nonlocal"
            self.flag(node, f"'{kind} {', '.join(node.names)}' keeps state across calls")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            self.flag(node, "the '@' operator calls a vendor matmul (cuBLAS)")
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.MatMult):
            self.flag(node, "the '@=' operator calls a vendor matmul (cuBLAS)")
        elif isinstance(node, ast.Name):
            self._check_name(node)
        elif isinstance(node, ast.Attribute):
            parent = self.parents.get(id(node))
            if not (isinstance(parent, ast.Attribute) and parent.value is node):
                self._check_attribute_chain(node)
        elif isinstance(node, ast.Call):
            self._check_call(node)
        elif isinstance(node, _FUNCTION_NODES):
            self._check_function(node)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "#include" in node.value:
            self._check_includes(node)

    def _check_name(self, node: ast.Name) -> None:
        name = node.id
        if name.startswith("__") and name.endswith("__") and name not in ("__name__", "__all__", "__doc__"):
            self.flag(node, f"dunder name '{name}' is not allowed")
            return
        if not isinstance(node.ctx, ast.Load):
            return
        if name in BANNED_BUILTINS and name not in self.aliases:
            self.flag(node, f"'{name}' is not allowed: {BANNED_BUILTINS[name]}")
        elif name == "getattr" and name not in self.aliases:
            parent = self.parents.get(id(node))
            if not (isinstance(parent, ast.Call) and parent.func is node):
                self.flag(node, "getattr may only be called directly")
        if name in self.module_aliases:
            parent = self.parents.get(id(node))
            # `if cp is None` / `if not cp` after an optional import is fine: only a test.
            is_test = isinstance(parent, ast.Compare) or (
                isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.Not)) or (
                isinstance(parent, (ast.If, ast.IfExp)) and parent.test is node)
            if not (isinstance(parent, ast.Attribute) and parent.value is node) and not is_test:
                self.flag(node, f"module '{self.aliases[name]}' used as a value "
                                f"(modules may only be used through attribute access)")

    def _check_attribute_chain(self, outer: ast.Attribute) -> None:
        attrs: list[str] = []
        node: ast.AST = outer
        while isinstance(node, ast.Attribute):
            attrs.append(node.attr)
            node = node.value
        attrs.reverse()
        path = self.resolve(outer)
        allow_external_stream = self._is_current_stream_wrapper(outer)
        root = node.id if isinstance(node, ast.Name) else "<expr>"
        self._check_path(outer, path, attrs, allow_external_stream=allow_external_stream,
                         shown=path or ".".join([root] + attrs))
        if path and path in KNOWN_SUBMODULES:
            parent = self.parents.get(id(outer))
            if not (isinstance(parent, ast.Attribute) and parent.value is outer):
                self.flag(outer, f"module '{path}' used as a value (modules may only be used "
                                 f"through attribute access)")
        if isinstance(outer.ctx, (ast.Store, ast.Del)) and isinstance(node, ast.Name) \
                and node.id in self.module_aliases:
            self.flag(outer, f"assigning to '{path}' monkeypatches a library")

    def _is_current_stream_wrapper(self, outer: ast.Attribute) -> bool:
        """cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream) launches on the
        timed stream: that one wrapper is how a CuPy kernel joins torch's stream, so allow it."""
        if outer.attr != "ExternalStream":
            return False
        call = self.parents.get(id(outer))
        if not (isinstance(call, ast.Call) and call.func is outer and len(call.args) == 1):
            return False
        arg = call.args[0]
        return (isinstance(arg, ast.Attribute) and arg.attr == "cuda_stream"
                and isinstance(arg.value, ast.Call) and isinstance(arg.value.func, ast.Attribute)
                and arg.value.func.attr == "current_stream")

    def _check_path(self, node: ast.AST, path: str | None, attrs: list[str], *,
                    allow_external_stream: bool = False, shown: str | None = None) -> None:
        shown = shown or path or ".".join(["<expr>"] + attrs)
        for attr in attrs:
            if _is_private(attr):
                self.flag(node, f"private or dunder attribute '{attr}' is not allowed ({shown})")
                return
            if attr in BANNED_MODULE_NAMES:
                self.flag(node, f"'{shown}' reaches the '{attr}' module (files, processes or "
                                f"interpreter internals)")
                return
        for attr in attrs:
            if attr in MATMUL_ATTRS and not (path and path in TRITON_DOT_OK):
                self.flag(node, f"'{shown}' is a vendor matmul path ('{attr}'); write the "
                                f"product in the kernel (tl.dot inside Triton is fine)")
                return
            if attr in VENDOR_LIB_ATTRS or attr.startswith(("to_sparse", "sparse_")):
                self.flag(node, f"'{shown}' uses a vendor sparse/dense library path ('{attr}')")
                return
            if attr in STREAM_ATTRS and not (attr == "ExternalStream" and allow_external_stream):
                self.flag(node, f"'{shown}': candidates may not create or switch CUDA streams, "
                                f"events or graphs (work on a side stream escapes the timer)")
                return
            if attr in IO_ATTRS_ANYWHERE:
                self.flag(node, f"'{shown}' does file I/O")
                return
        if not path:
            return
        root = path.split(".")[0]
        for prefix in _dotted_prefixes(path):
            if prefix in BANNED_PATH_PREFIXES:
                self.flag(node, f"'{path}' is not allowed: {BANNED_PATH_PREFIXES[prefix]}")
                return
        last = path.rsplit(".", 1)[-1]
        if root in ("torch", "numpy", "cupy") and last in IO_ATTRS_ON_LIBS:
            self.flag(node, f"'{path}' does file I/O")
        elif root == "torch" and last.startswith("set_"):
            self.flag(node, f"'{path}' changes global torch state (it would also change the "
                            f"baselines measured in the same process)")
        elif root == "sparseditto" and not any(path == m or path.startswith(m + ".") for m in SPARSEDITTO_MODULES):
            self.flag(node, f"'{path}': candidates may only use sparseditto.formats and "
                            f"sparseditto.reorder (and the trusted modules {', '.join(SPARSEDITTO_MODULES[2:])})")

    def _check_call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id == "getattr" and "getattr" not in self.aliases:
            if len(node.args) < 2 or not (isinstance(node.args[1], ast.Constant)
                                          and isinstance(node.args[1].value, str)):
                self.flag(node, "getattr with a computed attribute name is not allowed "
                                "(use the attribute directly or a dict)")
                return
            attr = node.args[1].value
            target = node.args[0]
            path = self.resolve(target)
            self._check_path(node, f"{path}.{attr}" if path else None, [attr])
        for kw in node.keywords:
            if kw.arg in ("path", "file", "filename") and isinstance(func, ast.Attribute) \
                    and func.attr in ("RawModule", "RawKernel"):
                self.flag(node, f"{func.attr}({kw.arg}=...) loads code from a file; embed the source")

    def _check_function(self, node: ast.AST) -> None:
        args = node.args
        for default in list(args.defaults) + [d for d in args.kw_defaults if d is not None]:
            if isinstance(default, ast.Call) and (
                    self.resolve(default.func) == "torch.device"
                    or (isinstance(default.func, ast.Name) and default.func.id in _IMMUTABLE_CALLS)):
                continue
            if isinstance(default, (ast.List, ast.Dict, ast.Set, ast.Call) + _COMPREHENSIONS):
                name = getattr(node, "name", "<lambda>")
                self.flag(default, f"mutable default argument in '{name}' persists between calls")
        if isinstance(node, ast.Lambda):
            return
        n_params = len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs) + \
            (args.vararg is not None) + (args.kwarg is not None)
        for deco in node.decorator_list:
            target = deco.func if isinstance(deco, ast.Call) else deco
            path = self.resolve(target)
            if path in CACHE_DECORATORS and n_params > 0:
                self.flag(deco, f"'{path}' on '{node.name}' (which takes arguments) caches "
                                f"results between calls; cache only argument-free setup")

    def _check_includes(self, node: ast.Constant) -> None:
        for bracket, header in _INCLUDE_RE.findall(node.value):
            if bracket == '"':
                self.flag(node, f'#include "{header}" reads a local file; embed the code')
            elif header not in ALLOWED_CUDA_HEADERS and not header.startswith("cuda/"):
                self.flag(node, f"#include <{header}> is not an allowed CUDA header")

    # ---- state that survives between calls ---------------------------------------------------
    def _check_state_across_calls(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, _FUNCTION_NODES):
                self._check_function_body(node)
        self._check_import_time_state()

    def _check_import_time_state(self) -> None:
        """State built by running the candidate's own code at import time: a generator or a
        closure over a mutable local (``_F = _make()``), or a mutable literal bound into a helper
        (``functools.partial(_impl, {})``). Calls inside spmm then share it between calls."""
        local_funcs = {s.name: s for s in self.tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for stmt in self.tree.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            for node in ast.walk(stmt):
                if not isinstance(node, ast.Call):
                    continue
                fname = node.func.id if isinstance(node.func, ast.Name) else None
                if fname in local_funcs or self.resolve(node.func) == "functools.partial":
                    for arg in list(node.args) + [kw.value for kw in node.keywords]:
                        if _is_mutable_literal(arg):
                            self.flag(node, "a mutable object bound into a function at import time "
                                            "persists between calls")
                if fname not in local_funcs:
                    continue
                factory = local_funcs[fname]
                if any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in ast.walk(factory)):
                    self.flag(node, f"generator '{fname}' created at import time keeps state between calls")
                factory_locals = self._scope_locals(factory)
                for nested in ast.walk(factory):
                    if nested is not factory and isinstance(nested, _FUNCTION_NODES) and \
                            self._mutates_outer(nested, factory_locals):
                        self.flag(node, f"closure created by '{fname}' at import time mutates "
                                        f"'{fname}' locals, which persist between calls")
                        break

    def _mutates_outer(self, fn: ast.AST, outer: set[str]) -> bool:
        own = self._scope_locals(fn)
        for node in ast.walk(fn):
            root = None
            if isinstance(node, (ast.Subscript, ast.Attribute)) and isinstance(node.ctx, (ast.Store, ast.Del)):
                root = _root_name(node)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                    node.func.attr in MUTATING_METHODS or node.func.attr.endswith("_")):
                root = _root_name(node.func.value)
            if root is not None and root in outer and root not in own:
                return True
        return False

    def _enclosing_scopes(self, node: ast.AST) -> list[ast.AST]:
        scopes = []
        cur = self.parents.get(id(node))
        while cur is not None:
            if isinstance(cur, _FUNCTION_NODES + _COMPREHENSIONS):
                scopes.append(cur)
            cur = self.parents.get(id(cur))
        return scopes

    @staticmethod
    def _scope_locals(scope: ast.AST) -> set[str]:
        names: set[str] = set()
        if isinstance(scope, _FUNCTION_NODES):
            a = scope.args
            for arg in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg]:
                if arg is not None:
                    names.add(arg.arg)
            body = scope.body if isinstance(scope.body, list) else [scope.body]
        else:
            body = scope.generators
        stack = list(body)
        while stack:
            n = stack.pop()
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                names.add(n.id)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(n.name)
                continue
            if isinstance(n, (ast.Lambda,) + _COMPREHENSIONS) and n not in body:
                continue
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                names.update((al.asname or al.name).split(".")[0] for al in n.names)
            stack.extend(ast.iter_child_nodes(n))
        return names

    def _check_function_body(self, fn: ast.AST) -> None:
        name = getattr(fn, "name", "<lambda>")
        locals_ = self._scope_locals(fn)
        outer_locals: set[str] = set()
        for scope in self._enclosing_scopes(fn):
            outer_locals |= self._scope_locals(scope)
        instance = None
        parent = self.parents.get(id(fn))
        if isinstance(parent, ast.ClassDef) and isinstance(fn, ast.FunctionDef):
            positional = fn.args.posonlyargs + fn.args.args
            is_static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)
            if positional and not is_static:
                instance = positional[0].arg

        def is_persistent_root(root: str) -> bool:
            return root not in locals_ and root not in outer_locals and root in self.module_level

        stack = list(fn.body) if isinstance(fn.body, list) else [fn.body]
        while stack:
            node = stack.pop()
            if isinstance(node, _FUNCTION_NODES + (ast.ClassDef,)):
                continue  # nested scopes are checked on their own
            targets: list[ast.AST] = []
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            elif isinstance(node, ast.Delete):
                targets = list(node.targets)
            for tgt in targets:
                for sub in ast.walk(tgt):
                    if isinstance(sub, (ast.Attribute, ast.Subscript)) and \
                            isinstance(sub.ctx, (ast.Store, ast.Del)):
                        root = _root_name(sub)
                        if root is None:
                            continue
                        if is_persistent_root(root):
                            self.flag(node, f"'{name}' writes into module-level '{root}', which "
                                            f"keeps state (e.g. cached outputs) between calls")
                        elif instance is not None and root == instance and isinstance(sub, ast.Attribute):
                            self.flag(node, f"method '{name}' stores state on the instance "
                                            f"('{root}.{sub.attr}'), which persists between calls")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                method = node.func.attr
                root = _root_name(node.func.value)
                if root and root not in self.module_aliases and is_persistent_root(root) and (
                        method in MUTATING_METHODS or (method.endswith("_") and not method.startswith("_"))):
                    self.flag(node, f"'{name}' mutates module-level '{root}' (.{method}), which "
                                    f"keeps state between calls")
            stack.extend(ast.iter_child_nodes(node))


def _is_mutable_literal(node: ast.AST) -> bool:
    if isinstance(node, (ast.List, ast.Dict, ast.Set) + _COMPREHENSIONS):
        return True
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
        node.func.id in ("dict", "list", "set", "bytearray")


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None
