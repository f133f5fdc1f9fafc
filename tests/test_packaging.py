"""The distribution installs agents/, graphs/ and kernel_templates/ under the sparseditto namespace.

Both ways a user gets the package must work: an editable install (this checkout, as `make setup`
does) and a built wheel installed elsewhere. A wheel that leaked a top-level `agents` or `graphs`
package would clash with other libraries, so the test also checks nothing but `sparseditto` lands
at the top level.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUBPACKAGES = ("sparseditto.agents", "sparseditto.graphs", "sparseditto.kernel_templates",
               "sparseditto.kernel_templates.triton", "sparseditto.kernel_templates.cuda",
               "sparseditto.kernel_templates.triton.planning", "sparseditto.kernel_templates.cuda.planning",
               "sparseditto.kernel_templates.runtime", "sparseditto.harness", "sparseditto.cli.app")


def test_editable_install_maps_top_level_dirs():
    import sparseditto.agents
    import sparseditto.graphs
    import sparseditto.kernel_templates

    assert Path(sparseditto.agents.__file__).resolve().parent == ROOT / "agents"
    assert Path(sparseditto.graphs.__file__).resolve().parent == ROOT / "graphs"
    assert Path(sparseditto.kernel_templates.__file__).resolve().parent == ROOT / "kernel_templates"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # build from a copy so setuptools' build/ directory never lands (stale) in the checkout
    src = tmp_path_factory.mktemp("src") / "sparseditto"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", ".gpu", ".whl", ".site", "*.egg-info", "__pycache__", ".pytest_cache"))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q", "-w", str(out)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    wheels = list(out.glob("sparseditto-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_wheel_has_only_the_sparseditto_namespace(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"sparseditto"}, top
    # data files the package needs at run time travel with it
    assert any(n.startswith("sparseditto/kernel_templates/triton/") and n.endswith(".py") for n in names)
    assert "sparseditto/agents/policy.py" in names
    assert "sparseditto/examples/block_pruned_mlp_1024x4096.safetensors.gz" in names   # the demo's weight
    assert "sparseditto/__main__.py" in names and "sparseditto/cli/story.py" in names


@pytest.mark.slow
def test_wheel_imports_outside_the_checkout(wheel, tmp_path):
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    code = ("import sys, importlib; sys.path.insert(0, sys.argv[1]);"
            "mods = [importlib.import_module(m) for m in sys.argv[2:]];"
            "print('\\n'.join(m.__file__ for m in mods))")
    # run from tmp_path with -I so neither the checkout nor the editable finder can satisfy the import
    proc = subprocess.run([sys.executable, "-I", "-c", code, str(target), *SUBPACKAGES],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for line in proc.stdout.split():
        assert line.startswith(str(target)), line
    assert not (target / "agents").exists() and not (target / "graphs").exists()


def test_installed_triton_is_in_the_declared_supported_range():
    """The templates are tested against the Triton range pyproject.toml declares (see its comment:
    newer interpreters reject their masks)."""
    import importlib.metadata

    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    triton = next(Requirement(d) for d in deps if d.startswith("triton"))
    try:
        installed = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("triton is not installed")
    assert triton.specifier.contains(installed, prereleases=True), (installed, str(triton.specifier))


# import name -> distribution(s) that may provide it, for optional modules this machine lacks
OPTIONAL_PROVIDERS = {"cupy": ("cupy-cuda12x", "cupy-cuda13x"), "cupyx": ("cupy-cuda12x", "cupy-cuda13x"),
                      "ray": ("ray",)}


def _requirement_names(requirements) -> set[str]:
    import re

    return {re.split(r"[\s\[<>=!~;]", r.strip(), maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def test_every_third_party_import_is_declared():
    """What the package imports is in pyproject: core dependencies, or an extra for optional paths
    (CuPy: gpu / gpu-cuda12; matplotlib: report; Ray: ray). Nothing declared goes unused either."""
    import ast
    import importlib.metadata as md

    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = _requirement_names(project["dependencies"])
    extras = {name: _requirement_names(reqs) for name, reqs in project["optional-dependencies"].items()}
    declared = core | set().union(*(v for k, v in extras.items() if k != "dev"))
    providers = md.packages_distributions()
    imported: dict[str, str] = {}
    for folder in ("sparseditto", "agents", "graphs", "kernel_templates"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                    [node.module] if isinstance(node, ast.ImportFrom) and not node.level and node.module else [])
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top != "sparseditto":
                        imported.setdefault(top, str(path.relative_to(ROOT)))
    missing = []
    used = set()
    for top, where in sorted(imported.items()):
        dists = {d.lower().replace("_", "-") for d in providers.get(top, OPTIONAL_PROVIDERS.get(top, ()))}
        if not dists & declared:
            missing.append(f"{top} (imported in {where}; provided by {sorted(dists) or 'nothing installed'})")
        used |= dists & declared
    assert not missing, "undeclared imports: " + "; ".join(missing)
    # typing_extensions / langgraph-checkpoint-sqlite are imported under other names; all else is used
    unused = core - used - {"langgraph-checkpoint-sqlite"}
    assert not unused, f"declared but never imported: {sorted(unused)}"
    assert extras["report"] == {"matplotlib"} and extras["ray"] == {"ray"}   # the batch's Ray workers
    assert {"cupy-cuda13x"} == extras["gpu"] == extras["gpu-cuda13"] and extras["gpu-cuda12"] == {"cupy-cuda12x"}
