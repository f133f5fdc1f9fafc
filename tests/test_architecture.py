"""The dependency order holds: cli -> batch -> benchmark -> api -> graphs -> agents -> kernel_templates -> core,
no arrow up.

Imports are read with ast from every project source file, function-level imports included (a
lazy import is still a dependency). A module may import its own layer or a lower one; a node
module (one the graph wires) imports no other node, so the services nodes share live in
non-node modules (agents/kit.py, agents/records.py, agents/costing.py, agents/state.py); and the
module graph has no cycle.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Source directory -> installed package (pyproject's package-dir mapping).
PACKAGES = {"sparseditto": "sparseditto", "agents": "sparseditto.agents", "graphs": "sparseditto.graphs",
            "kernel_templates": "sparseditto.kernel_templates"}
LAYERS = ("core", "kernel_templates", "agents", "graphs", "api", "benchmark", "batch", "cli")   # low to high
NODE_MODULES = {f"sparseditto.agents.{name}" for name in
                ("analyzer", "planner", "coder", "debugger", "profiler", "finalize", "loader")}


def _modules() -> dict[str, Path]:
    out = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _imports(name: str, path: Path) -> set[str]:
    """Every module ``name`` imports (absolute names; relative imports resolved), at any depth."""
    found = set()
    package = name if _is_package(path) else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)   # `from pkg import module`
    return found


def layer(module: str) -> str | None:
    """The layer of a project module; None for third-party modules."""
    if module == "sparseditto" or not module.startswith("sparseditto."):
        return None if module != "sparseditto" else "api"   # the package facade re-exports run_graph
    head = module.split(".")[1]
    if head in ("agents", "graphs", "kernel_templates", "api", "benchmark", "batch", "cli"):
        return head
    if head == "__main__":   # `python -m sparseditto` is the command line
        return "cli"
    return "core"


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    # `from sparseditto import harness` depends on sparseditto.harness; the package root itself (a
    # facade of lazy names, see sparseditto/__init__.py) is no dependency of anything
    return {name: {m for m in _imports(name, path) if m in modules and m != "sparseditto"}
            for name, path in modules.items()}


def test_the_source_tree_is_what_the_test_reads(graph):
    for expected in ("sparseditto.api", "sparseditto.agents.kit", "sparseditto.graphs.build",
                     "sparseditto.kernel_templates.runtime", "sparseditto.harness.verify", *NODE_MODULES):
        assert expected in graph, expected


def test_no_import_points_up_the_layers(graph):
    bad = []
    for module, imported in graph.items():
        mine = LAYERS.index(layer(module))
        for other in imported:
            if LAYERS.index(layer(other)) > mine:
                bad.append(f"{module} ({layer(module)}) imports {other} ({layer(other)})")
    assert not bad, "\n".join(sorted(bad))


def test_nodes_do_not_import_each_other(graph):
    bad = [f"{m} imports {o}" for m in NODE_MODULES for o in graph[m] if o in NODE_MODULES and o != m]
    assert not bad, "\n".join(sorted(bad))
    # the shared services import no node either (a node's helper would make them nodes in disguise)
    shared = [m for m in graph if layer(m) == "agents" and m not in NODE_MODULES]
    bad = [f"{m} imports {o}" for m in shared for o in graph[m] if o in NODE_MODULES]
    assert not bad, "\n".join(sorted(bad))


def test_graphs_wire_every_node_and_nothing_else(graph):
    wired = {m for m in graph["sparseditto.graphs.build"] | graph["sparseditto.graphs.studio"] if m in NODE_MODULES}
    assert wired == NODE_MODULES
    for path in (ROOT / "graphs").glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        nodes = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)
                 and n.returns is not None and "Command" in ast.unparse(n.returns)]
        assert not nodes, f"{path.name} defines node functions {nodes}: nodes live in agents/"


def test_node_files_stay_small():
    for module in NODE_MODULES:
        path = ROOT / "agents" / (module.rsplit(".", 1)[1] + ".py")
        lines = len(path.read_text(encoding="utf-8").splitlines())
        assert lines < 200, f"{path.name} has {lines} lines"


def test_there_is_no_import_cycle(graph):
    seen: dict[str, int] = {}   # 1 = on the current path, 2 = done
    cycles = []

    def visit(module: str, path: list[str]) -> None:
        seen[module] = 1
        for other in sorted(graph[module]):
            # a package's __init__ importing its own submodules is not a cycle of modules
            if other.startswith(module + "."):
                continue
            if seen.get(other) == 1:
                cycles.append(" -> ".join(path[path.index(other):] + [other]) if other in path else other)
            elif other not in seen:
                visit(other, path + [other])
        seen[module] = 2

    for module in sorted(graph):
        if module not in seen:
            visit(module, [module])
    assert not cycles, "\n".join(cycles)


@pytest.mark.parametrize("source,message", [
    ("from sparseditto.agents import kit\n", "imports sparseditto.agents.kit (agents)"),
    ("def f():\n    from sparseditto.graphs.build import compile_graph\n", "imports sparseditto.graphs.build (graphs)"),
])
def test_the_rule_catches_a_forbidden_import(tmp_path, source, message):
    """The checks above can fail: a core module importing upward, even inside a function."""
    path = tmp_path / "formats.py"
    path.write_text(source)
    modules = _modules()
    imported = {m for m in _imports("sparseditto.formats", path) if m in modules}
    bad = [f"sparseditto.formats (core) imports {o} ({layer(o)})" for o in imported
           if LAYERS.index(layer(o)) > LAYERS.index("core")]
    assert any(message in b for b in bad), bad


def test_planning_modules_need_no_gpu_stack():
    """A template's planning module (and the built-in dense's) is costed on any machine: it may
    import the shared cost arithmetic only, never torch, Triton, CuPy or the kernel itself."""
    paths = sorted((ROOT / "kernel_templates").glob("*/planning/*.py")) + [ROOT / "kernel_templates" / "dense.py"]
    assert len(paths) > 3
    for path in paths:
        imported = _imports("sparseditto.kernel_templates.x.planning.y", path)
        roots = {m.split(".")[0] for m in imported}
        assert roots <= {"__future__", "math", "sparseditto"}, (path.name, roots)
        cost = "sparseditto.kernel_templates.cost"
        project = {m for m in imported if m.startswith("sparseditto")}
        assert all(m == cost or m.startswith(cost + ".") for m in project), (path.name, project)
