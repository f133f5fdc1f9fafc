"""Test configuration: pick the Triton interpreter when there is no GPU.

TRITON_INTERPRET must be set before triton is first imported, so this runs at collection start.
GPU-only tests carry the `gpu` marker and are skipped cleanly without CUDA.

`make test` runs the suite in several pytest processes (pytest-xdist, each test file in one of
them): every process gets its own SparseDitto cache directory (artifacts, kernel files, default
memory and checkpoints) under its own pytest temp dir, unless SPARSEDITTO_CACHE_DIR is set, so two
processes never share a SQLite file or a cache entry and the user's ~/.cache is left alone.
"""
import os
from pathlib import Path

import pytest

try:
    import torch

    HAS_CUDA = torch.cuda.is_available()
except Exception:  # pragma: no cover - torch is a hard dependency
    HAS_CUDA = False

if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # in-process kernel tests need the same NumPy >= 2.4 interpreter fix the sandbox worker applies
    from sparseditto.harness.interpreter_compat import patch_triton_interpreter

    patch_triton_interpreter()

SHARED_DATA = Path(os.environ.get("SPARSEDITTO_DATA", Path(__file__).resolve().parents[1] / ".." / "shared" / "data")).resolve()


def slow_seconds(item) -> float:
    """What the test's ``slow`` mark says it takes on a CPU (10 s when the mark gives no number)."""
    mark = item.get_closest_marker("slow")
    return 0.0 if mark is None else float(mark.kwargs.get("seconds", 10))


def slowest_files_first(items) -> None:
    """Reorder whole test files, those with the most slow seconds first (the rest in their order).

    Under ``--dist loadfile --no-loadscope-reorder`` xdist hands out files in this order, so the
    two-minute CLI benchmark starts at the beginning instead of being the last thing running on
    one process while the other one idles."""
    file_of = lambda item: item.nodeid.split("::")[0]
    order: dict[str, int] = {}
    weight: dict[str, float] = {}
    for item in items:
        order.setdefault(file_of(item), len(order))
        weight[file_of(item)] = weight.get(file_of(item), 0.0) + slow_seconds(item)
    items.sort(key=lambda item: (-weight[file_of(item)], order[file_of(item)]))


def pytest_collection_modifyitems(config, items):
    if getattr(config.option, "dist", "no") != "no" or hasattr(config, "workerinput"):
        slowest_files_first(items)
    if HAS_CUDA:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session", autouse=True)
def own_cache_dir(tmp_path_factory):
    """This test process's SparseDitto cache directory (module doc); tests that need another one
    set SPARSEDITTO_CACHE_DIR themselves (monkeypatch), which wins while they run."""
    if os.environ.get("SPARSEDITTO_CACHE_DIR"):
        yield Path(os.environ["SPARSEDITTO_CACHE_DIR"])
        return
    path = tmp_path_factory.getbasetemp() / "sparseditto-cache"
    os.environ["SPARSEDITTO_CACHE_DIR"] = str(path)
    try:
        yield path
    finally:
        os.environ.pop("SPARSEDITTO_CACHE_DIR", None)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The read-only real matrices (DLMC, SuiteSparse) beside the checkout; skip when absent."""
    if not SHARED_DATA.is_dir():
        if os.environ.get("SPARSEDITTO_REQUIRE_DATA"):
            pytest.fail(f"shared data required (SPARSEDITTO_REQUIRE_DATA) but not found at {SHARED_DATA}")
        pytest.skip(f"shared data not found at {SHARED_DATA} (set SPARSEDITTO_DATA)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def pool(tmp_path_factory):
    """One sandboxed worker pool for the whole session (the harness's default pool), so each
    backend's worker starts once."""
    from sparseditto.harness import WorkerPool, sandbox

    existing = sandbox.default_pool_if_started()
    if existing is not None:
        return existing
    created = WorkerPool(cache_dir=tmp_path_factory.getbasetemp() / "harness-cache")
    sandbox.set_default_pool(created)
    return created
