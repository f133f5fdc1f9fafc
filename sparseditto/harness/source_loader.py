"""Candidate sources as real, content-addressed files, and the one way they are imported.

Triton's JIT reads a kernel's source with ``inspect`` and CuPy/nvcc want files too, so a candidate
that only exists as a string cannot run. Each source is written once to ``<cache>/kernels/<sha256>.py``
(atomically, so concurrent workers never see half a file) and imported from there with importlib
under a fresh module name, so module-level state never leaks from one verification to the next.
"""
from __future__ import annotations

import ast
import hashlib
import importlib.util
import itertools
import os
import sys
from pathlib import Path
from types import ModuleType

_COUNTER = itertools.count()


def default_cache_dir() -> Path:
    """The project's cache directory (`sparseditto.paths.cache_dir`)."""
    from sparseditto.paths import cache_dir

    return cache_dir()


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


def write_source(source: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Write ``source`` to ``<cache_dir>/kernels/<sha256>.py`` (once) and return the path."""
    if not isinstance(source, str):
        raise ValueError(f"Expected candidate source text (str), got {type(source).__name__}.")
    directory = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    directory = directory / "kernels"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{source_hash(source)}.py"
    if not path.exists() or path.read_text(encoding="utf-8") != source:
        tmp = directory / f".{path.name}.{os.getpid()}.{next(_COUNTER)}.tmp"
        tmp.write_text(source, encoding="utf-8")
        os.replace(tmp, path)
    return path


def load_module(source: str, cache_dir: str | os.PathLike | None = None) -> ModuleType:
    """Import the candidate from its content-addressed file under a fresh, unique module name.

    Exceptions raised while executing the module (SyntaxError, ImportError, NameError...) propagate:
    the caller classifies them as compile errors.
    """
    return import_path(write_source(source, cache_dir))


def import_path(path: Path) -> ModuleType:
    """Import an already written candidate file (the sandboxed worker writes it before the gate
    closes, then imports it with no write access)."""
    name = f"sparseditto_candidate_{path.stem[:16]}_{os.getpid()}_{next(_COUNTER)}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:  # pragma: no cover - only for non-.py paths
        raise ImportError(f"cannot build an import spec for {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses, pickling and Triton look modules up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def cuda_sources(source: str) -> dict[str, str]:
    """Module-level string constants that hold CUDA C++ (they contain ``__global__``).

    Read from the syntax tree, so nothing is executed; used for the optional nvcc compile.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    found: dict[str, str] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant) \
                and isinstance(stmt.value.value, str) and "__global__" in stmt.value.value:
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = stmt.value.value
    return found
