"""Test configuration: pick the Triton interpreter when there is no GPU.

TRITON_INTERPRET must be set before triton is first imported, so this runs at collection start.
GPU-only tests carry the `gpu` marker and are skipped cleanly without CUDA.
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


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


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
