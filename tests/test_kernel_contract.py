"""result.kernel keeps the harness's contract: torch dtypes, verified N values and dtypes only."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from sparseditto.api import SpMMKernel
from sparseditto.matrix import SparseMatrix

STRICT = '''
import numpy as np
import torch


def prepare(A, dtype, device):
    assert isinstance(dtype, torch.dtype), f"prepare got {dtype!r}, not a torch.dtype"
    return {"rows": torch.from_numpy(A.row_ids()).to(device), "cols": torch.from_numpy(A.indices.astype(np.int64)).to(device),
            "values": torch.from_numpy(A.data).to(device=device, dtype=dtype).float(), "m": A.shape[0]}


def spmm(packed, B, out):
    acc = torch.zeros((packed["m"], B.shape[1]), dtype=torch.float32, device=B.device)
    acc.index_add_(0, packed["rows"], packed["values"][:, None] * B[packed["cols"]].float())
    if B.shape[1] == 5:
        acc[0] += 1.0   # wrong only at N = 5
    out.copy_(acc)
'''


@pytest.fixture(scope="module")
def A():
    return SparseMatrix.from_scipy(sp.random(16, 12, density=0.4, random_state=2, format="csr"), name="k")


def reference(A, B):
    return torch.from_numpy(A.to_dense() @ B.double().numpy())


def test_prepare_gets_a_torch_dtype_and_verified_n_runs(A):
    k = SpMMKernel(A, STRICT, "custom", verified_ns=[1, 3, 4], verified_dtype="float32", backend="interpret")
    B = torch.randn(12, 4)
    assert torch.allclose(k(B).double(), reference(A, B), atol=1e-4)
    assert k.verifications == []  # N=4 was verified by the run


def test_a_new_n_is_verified_on_first_use_and_a_failure_is_refused(A):
    k = SpMMKernel(A, STRICT, "custom", verified_ns=[1, 4], verified_dtype="float32", backend="interpret")
    B = torch.randn(12, 6)
    assert torch.allclose(k(B).double(), reference(A, B), atol=1e-4)
    assert k.verifications[0]["n"] == 6 and k.verifications[0]["status"] == "verified" and 6 in k.verified_ns
    with pytest.raises(ValueError, match="failed verification at N=5"):
        k(torch.randn(12, 5))
    strict = SpMMKernel(A, STRICT, "custom", verified_ns=[1, 4], verified_dtype="float32", verify_new_n=False)
    with pytest.raises(ValueError, match="verified for N in \\[1, 4\\], not N=7"):
        strict(torch.randn(12, 7))


@pytest.mark.parametrize("dtype", [torch.int8, torch.int64, torch.bool, torch.complex64])
def test_non_float_b_is_refused_on_the_dense_path_too(A, dtype):
    dense = SpMMKernel(A, None)
    with pytest.raises(ValueError, match="floating point"):
        dense(torch.ones(12, 3, dtype=dtype))


def test_b_dtype_shape_and_kind_are_checked(A):
    k = SpMMKernel(A, STRICT, "custom", verified_ns=[1, 3], verified_dtype="float32")
    with pytest.raises(ValueError, match="verified for float32 inputs, got B in float16"):
        k(torch.ones(12, 3, dtype=torch.float16))
    with pytest.raises(ValueError, match="B has 11 rows"):
        k(torch.ones(11, 3))
    with pytest.raises(ValueError, match="2-D B"):
        k(torch.ones(12))
    with pytest.raises(ValueError, match="torch.Tensor"):
        k(np.ones((12, 3)))
    with pytest.raises(ValueError, match="no columns"):
        k(torch.ones(12, 0))
