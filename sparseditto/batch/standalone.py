"""One kernel source as a standalone Python module: SparseDitto's trusted helpers inlined.

Why: a deployed kernel should not need SparseDitto (nor scipy, pydantic, LangGraph) installed.
A kernel source imports a few trusted project modules (`sparseditto.formats`,
`sparseditto.kernel_templates.runtime`, ... the static checks' allow-list); this module copies
those modules' code into the file, each inside a loader function whose locals become a module
object (``rt = _sparseditto_kernel_templates_runtime``), so their private names never collide.
Their top-level third-party and standard-library imports are hoisted to the file's top (a
dataclass annotated ``ClassVar`` under ``from __future__ import annotations`` looks the name up
in the module's globals). A module that imports something outside the allowed set (matrix.py's
scipy) keeps only what does not use it: methods that use a dropped import are left out, and any
other use is a ValueError at export time, never a NameError at run time. The kernel source
itself stays at module level unchanged except for those import lines (Triton reads its JIT
functions' source and globals there).
"""
from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

# Third-party modules an exported file may import; everything else must be the standard library.
THIRD_PARTY = frozenset({"torch", "triton", "cupy", "numpy"})
# Project modules (the trusted ones a kernel may import, sparseditto.harness.static_checks) are
# inlined; so is what the export's entry needs besides: the SparseMatrix class, the signature.
PROJECT_PREFIX = "sparseditto"
ENTRY_NEEDS = {"sparseditto.matrix": {"SparseMatrix"}, "sparseditto.pattern_features": {"structure_signature"}}
# A Triton kernel's file also gets the interpreter's NumPy >= 2.4 fix (for TRITON_INTERPRET=1).
TRITON_NEEDS = {"sparseditto.harness.interpreter_compat": {"patch_triton_interpreter"}}


def allowed_import(module: str) -> bool:
    root = module.split(".")[0]
    return root in THIRD_PARTY or root in sys.stdlib_module_names


def namespace_var(module: str) -> str:
    """The file-level name the inlined ``module`` is bound to."""
    return "_" + module.replace(".", "_")


def _module_path(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ValueError(f"Cannot inline {module}: it is not importable here.")
    return Path(spec.origin)


def _is_project(module: str | None) -> bool:
    return bool(module) and (module == PROJECT_PREFIX or module.startswith(PROJECT_PREFIX + "."))


def _project_binding(node: ast.stmt) -> list[tuple[str, str, str | None]] | None:
    """[(bound name, project module, attribute or None)] for a project import, else None."""
    if isinstance(node, ast.Import) and any(_is_project(a.name) for a in node.names):
        if len(node.names) != 1 or node.names[0].asname is None:
            raise ValueError(f"Cannot inline `{ast.unparse(node)}`: import project modules one per line with "
                             "`as` (or `from ... import`).")
        return [(node.names[0].asname, node.names[0].name, None)]
    if isinstance(node, ast.ImportFrom) and _is_project(node.module):
        out = []
        for alias in node.names:
            full = f"{node.module}.{alias.name}"
            if _is_submodule(full):     # `from sparseditto.kernel_templates import runtime as rt`
                out.append((alias.asname or alias.name, full, None))
            else:
                out.append((alias.asname or alias.name, node.module, alias.name))
        return out
    return None


def _is_submodule(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _names_used(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _bound_names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return set()


class Bundler:
    """The inlined modules of one export: what each must keep, in dependency order, and the
    imports hoisted to the file's top.

    Only what is used is inlined: a name imported ``from sparseditto.formats import CSR`` keeps
    CSR and what it needs; a module imported whole (``runtime as rt``) keeps the ``rt.<name>``
    attributes its importers read (everything when the module object itself is passed around).
    So a Triton kernel's file carries no CuPy launch path it never calls, and the wanted sets are
    grown to a fixed point because a module can be needed by several importers."""

    def __init__(self) -> None:
        self.hoisted: dict[str, str] = {}                 # bound name -> its import line
        self.wanted: dict[str, set[str] | None] = {}      # project module -> names kept (None: all)
        self._trees: dict[str, list[ast.stmt]] = {}

    def request(self, module: str, names: set[str] | None) -> bool:
        """Add ``names`` to what ``module`` must keep; True when that grew."""
        if module not in self.wanted:
            self.wanted[module] = None if names is None else set(names)
            return True
        old = self.wanted[module]
        new = None if old is None or names is None else old | names
        self.wanted[module] = new
        return new != old

    def kept(self, module: str) -> list[ast.stmt]:
        if module not in self._trees:
            self._trees[module] = ast.parse(_module_path(module).read_text(encoding="utf-8")).body
        body = self._trees[module]
        wanted = self.wanted[module]
        return body if wanted is None else _closure(body, wanted)

    def resolve(self, body: list[ast.stmt]) -> None:
        """Request what ``body`` (the kernel's) imports, then everything those need, to a fixed point."""
        for dep, names in _requests(body).items():
            self.request(dep, names)
        changed = True
        while changed:
            changed = False
            for module in list(self.wanted):
                for dep, names in _requests(self.kept(module)).items():
                    changed |= self.request(dep, names)

    def order(self) -> list[str]:
        """The inlined modules, each after the ones it imports."""
        done: list[str] = []

        def visit(module: str, path: tuple[str, ...]) -> None:
            if module in done or module in path:
                return
            for dep in _requests(self.kept(module)):
                visit(dep, path + (module,))
            done.append(module)

        for module in sorted(self.wanted):
            visit(module, ())
        return done

    def hoist(self, line: str) -> None:
        node = ast.parse(line).body[0]
        for name in _bound_names(node):
            if self.hoisted.get(name, line) != line:
                raise ValueError(f"Cannot inline: `{line}` and `{self.hoisted[name]}` bind the same name {name!r}.")
            self.hoisted[name] = line

    def rewrite_imports(self, body: list[ast.stmt]) -> tuple[list[ast.stmt], set[str]]:
        """``body`` with project imports turned into bindings of the inlined modules and allowed
        imports hoisted; returns the new body and the names bound by imports not allowed (dropped)."""
        out, dropped = [], set()
        for node in body:
            binding = _project_binding(node)
            if binding is not None:
                for name, module, attr in binding:
                    value = namespace_var(module) + (f".{attr}" if attr else "")
                    out.append(ast.parse(f"{name} = {value}").body[0])
                continue
            if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if not all(allowed_import(m) for m in modules):
                    dropped |= _bound_names(node)
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        self.hoist(ast.unparse(ast.Import(names=[alias])))
                else:
                    for alias in node.names:
                        self.hoist(ast.unparse(ast.ImportFrom(module=node.module, names=[alias], level=0)))
                continue
            out.append(node)
        return out, dropped

    def loader(self, module: str) -> str:
        """The loader function of ``module`` and the line that binds its module object."""
        body, dropped = self.rewrite_imports(self.kept(module))
        body = [_without_methods_using(node, dropped) for node in body]
        left = sorted(_names_used(ast.Module(body=body, type_ignores=[])) & dropped)
        if left:
            raise ValueError(f"Cannot inline {module}: its code still uses {left}, imported from a module an "
                             f"exported kernel may not import (allowed: {sorted(THIRD_PARTY)} and the standard "
                             "library).")
        code = ast.unparse(ast.Module(body=body, type_ignores=[]))
        fn = namespace_var(module) + "_load"
        indented = "\n".join(("    " + line) if line.strip() else "" for line in code.splitlines())
        return (f"def {fn}():\n    \"\"\"{module}, inlined (what this kernel uses of it).\"\"\"\n{indented}\n"
                f"    return _as_module({module!r}, locals())\n\n\n{namespace_var(module)} = {fn}()")


def _requests(body: list[ast.stmt]) -> dict[str, set[str] | None]:
    """Project module -> the names ``body`` uses of it (None: the module object escapes)."""
    out: dict[str, set[str] | None] = {}
    module_aliases: dict[str, str] = {}
    for node in body:
        for name, module, attr in _project_binding(node) or ():
            if attr is None:
                module_aliases[name] = module
                out.setdefault(module, set())
            elif out.get(module, set()) is not None:
                out.setdefault(module, set()).add(attr)
    tree = ast.Module(body=body, type_ignores=[])
    attribute_values = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in module_aliases:
            attribute_values.add(id(node.value))
            names = out[module_aliases[node.value.id]]
            if names is not None:
                names.add(node.attr)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in module_aliases and id(node) not in attribute_values \
                and isinstance(node.ctx, ast.Load):
            out[module_aliases[node.id]] = None
    return out


def _closure(body: list[ast.stmt], wanted: set[str]) -> list[ast.stmt]:
    """The top-level statements that define ``wanted`` and everything they use, in order."""
    defs: dict[str, list[ast.stmt]] = {}
    for node in body:
        for name in _bound_names(node):
            defs.setdefault(name, []).append(node)
    need, todo = set(), list(wanted)
    while todo:
        name = todo.pop()
        if name in need or name not in defs:
            continue
        need.add(name)
        for node in defs[name]:
            todo.extend(_names_used(node))
    keep = {id(node) for n in need for node in defs[n]}
    return [node for node in body if id(node) in keep]


def _without_methods_using(node: ast.stmt, dropped: set[str]) -> ast.stmt:
    if not dropped or not isinstance(node, ast.ClassDef):
        return node
    node.body = [s for s in node.body
                 if not (isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and _names_used(s) & dropped)]
    return node


AS_MODULE = '''def _as_module(name, namespace):
    """The locals of an inlined module's loader as a module object."""
    module = types.ModuleType(name)
    module.__dict__.update(namespace)
    return module
'''


ENTRY_IMPORTS = ("import os", "import sys", "import types", "import warnings", "import numpy as np", "import torch")


def standalone_source(kernel_source: str, entry: str, docstring: str, export: dict, *, triton: bool) -> str:
    """The text of the standalone module: ``docstring``, the hoisted imports, ``EXPORT = export``,
    the inlined modules, the kernel source, then ``entry`` (its public API and self-check)."""
    import pprint

    try:
        tree = ast.parse(kernel_source)
    except SyntaxError as exc:
        raise ValueError(f"The kernel source does not parse: {exc}") from None
    doc = ast.get_docstring(tree)
    body = tree.body[1:] if doc else tree.body
    bundler = Bundler()
    for module, names in {**ENTRY_NEEDS, **(TRITON_NEEDS if triton else {})}.items():
        bundler.request(module, names)
    bundler.resolve(body)
    kernel_body, dropped = bundler.rewrite_imports(body)   # hoists the kernel's own imports too
    if dropped:
        raise ValueError(f"The kernel imports modules an exported kernel may not import: {sorted(dropped)}.")
    entry_names = {n for s in ast.parse(entry).body for n in _bound_names(s)} | {"EXPORT", "_as_module"}
    clash = sorted(entry_names & {n for s in kernel_body for n in _bound_names(s)})
    if clash:
        raise ValueError(f"The kernel source defines {clash}, names the exported module's entry needs.")
    order = bundler.order()
    loaders = [bundler.loader(module) for module in order]
    for line in ENTRY_IMPORTS:
        bundler.hoist(line)
    text = docstring.strip() + (f"\n\nThe kernel, as its source describes it:\n\n{doc}" if doc else "")
    quoted = '"""' + text.replace("\\", "\\\\").replace('"""', "'''") + '\n"""'
    kernel_title = f" ({doc.splitlines()[0]})" if doc else ""
    parts = [quoted, "from __future__ import annotations",
             "\n".join(dict.fromkeys(bundler.hoisted.values())),
             "EXPORT = " + pprint.pformat(export, width=100, sort_dicts=False),
             AS_MODULE,
             "# ---- SparseDitto's trusted helpers, inlined: " + ", ".join(order) + " ----",
             *loaders,
             f"# ---- the kernel{kernel_title} ----",
             _kernel_text(kernel_source, tree, doc is not None),
             entry]
    return "\n\n\n".join(p.strip("\n") for p in parts) + "\n"


def _kernel_text(source: str, tree: ast.Module, has_doc: bool) -> str:
    """The kernel source verbatim (comments kept), except: its docstring (now the module's), the
    ``__future__`` import (now the file's first statement) and its project imports (bindings of
    the inlined modules)."""
    lines = source.splitlines()
    for i, node in reversed(list(enumerate(tree.body))):
        span = slice(node.lineno - 1, node.end_lineno)
        if i == 0 and has_doc:
            lines[span] = []
        elif isinstance(node, ast.ImportFrom) and node.module == "__future__":
            lines[span] = []
        elif (binding := _project_binding(node)) is not None:
            lines[span] = [f"{name} = {namespace_var(module)}" + (f".{attr}" if attr else "")
                           for name, module, attr in binding]
    return "\n".join(lines)


def third_party_imports(source: str) -> set[str]:
    """Root names of every import in ``source`` outside the standard library (the test's check)."""
    roots = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            roots.add((node.module or "").split(".")[0])
    return {r for r in roots if r not in sys.stdlib_module_names}
