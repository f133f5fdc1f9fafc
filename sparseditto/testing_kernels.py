"""Kernel sources the scripted LLM scenarios write (`sparseditto.testing_llm`, the HTTP tests).

Each is a complete candidate module under the contract (``prepare`` / ``spmm``), chosen to show
one thing the graph must handle: a correct Triton CSR kernel, a first draft calling a Triton
function that does not exist, an off-by-one, a cheat through torch.mm, two versions of an ELL
kernel where the second packs A in fewer bytes (what a profile that says "memory-bound, these many
bytes per nonzero" should lead to), and a CUDA C++ kernel through CuPy (the CUDA candidate
contract; it runs only on a GPU).
"""
from __future__ import annotations

# ---- a CSR kernel and what goes wrong with it -------------------------------------------------
# A small, correct Triton CSR SpMM that satisfies the candidate contract (prepare/spmm, allow-listed
# imports only, no vendor matmul): one program per (row, N tile); the row's nonzeros are walked in
# chunks of BLOCK_NNZ, the matching rows of B gathered, fp32 multiply-add reduced over the chunk.
GOOD_KERNEL = '''"""CSR SpMM written by the scripted LLM: a program per (row, N tile), chunked nonzeros."""
import torch
import triton
import triton.language as tl

META = {"name": "llm_csr_rowwise", "backend": "triton", "format": "csr"}


@triton.jit
def _csr_row_kernel(indptr_ptr, indices_ptr, values_ptr, b_ptr, out_ptr, N,
                    stride_bk, stride_bn, stride_om, stride_on,
                    BLOCK_N: tl.constexpr, BLOCK_NNZ: tl.constexpr):
    row = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    start = tl.load(indptr_ptr + row)
    end = tl.load(indptr_ptr + row + 1)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    k0 = start
    while k0 < end:  # a while loop: range() over loaded bounds breaks the interpreter on numpy 2
        offs = k0 + tl.arange(0, BLOCK_NNZ)
        live = offs < end
        cols = tl.load(indices_ptr + offs, mask=live, other=0).to(tl.int64)
        vals = tl.load(values_ptr + offs, mask=live, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=live[:, None] & n_mask[None, :], other=0.0)
        acc += tl.sum(vals[:, None] * b.to(tl.float32), axis=0)
        k0 += BLOCK_NNZ
    tl.store(out_ptr + row.to(tl.int64) * stride_om + offs_n * stride_on,
             acc.to(out_ptr.dtype.element_ty), mask=n_mask)


def _torch_dtype(dtype):
    if isinstance(dtype, torch.dtype):
        return dtype
    return {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[str(dtype)]


def prepare(A, dtype, device) -> dict:
    return {
        "indptr": torch.as_tensor(A.indptr.astype("int32"), device=device),
        "indices": torch.as_tensor(A.indices.astype("int32"), device=device),
        "values": torch.as_tensor(A.data, device=device).to(_torch_dtype(dtype)),
        "shape": tuple(A.shape),
    }


def spmm(packed: dict, B, out) -> None:
    M, K = packed["shape"]
    N = B.shape[1]
    block_n = min(triton.next_power_of_2(max(N, 1)), 64)
    grid = (M, triton.cdiv(N, block_n))
    _csr_row_kernel[grid](packed["indptr"], packed["indices"], packed["values"], B, out, N,
                          B.stride(0), B.stride(1), out.stride(0), out.stride(1),
                          BLOCK_N=block_n, BLOCK_NNZ=16)
'''

#: The first draft of the "fix after error" scenario: calls ``tl.reduce_sum``, which triton.language
#: does not have (a typical hallucinated API), so it fails when Triton compiles (or, in the
#: interpreter, runs) the kernel.
BROKEN_KERNEL = GOOD_KERNEL.replace(
    "        acc += tl.sum(vals[:, None] * b.to(tl.float32), axis=0)\n",
    "        acc += tl.reduce_sum(vals[:, None] * b.to(tl.float32), axis=0)\n",
).replace("chunked nonzeros.", "chunked nonzeros (first draft).")

#: Runs fine but stops one nonzero early in every row (an off-by-one): a wrong result.
WRONG_KERNEL = GOOD_KERNEL.replace(
    "    end = tl.load(indptr_ptr + row + 1)\n",
    "    end = tl.load(indptr_ptr + row + 1) - 1\n",
)

#: Computes the product with torch.mm on a densified A: what the static checks exist to reject.
CHEATING_KERNEL = '''"""A "kernel" that hands the work to cuBLAS: forbidden by the candidate contract."""
import torch


def prepare(A, dtype, device) -> dict:
    dense = torch.zeros(A.shape, dtype=torch.float32)
    rows = torch.repeat_interleave(torch.arange(A.shape[0]), torch.as_tensor(A.indptr[1:] - A.indptr[:-1]))
    dense[rows, torch.as_tensor(A.indices).long()] = torch.as_tensor(A.data)
    return {"dense": dense.to(device)}


def spmm(packed: dict, B, out) -> None:
    out.copy_(torch.mm(packed["dense"].to(B.dtype), B))
'''

assert BROKEN_KERNEL != GOOD_KERNEL and WRONG_KERNEL != GOOD_KERNEL


# ---- an ELL kernel, then the same kernel with A packed in half the bytes ---------------------
# Rows padded to the longest one; a program per BLOCK_M rows walks the padded width in chunks of
# BLOCK_W slots, gathers the matching rows of B and reduces in fp32. Version 1 stores fp32 values
# and int32 column ids (8 bytes a slot); version 2 stores values in the run's dtype and int16
# column ids when K allows (4 bytes a slot for fp16/bf16): the same arithmetic, half the bytes.
ELL_KERNEL = '''"""ELL SpMM written by the scripted LLM: rows padded to the longest one, fp32 values, int32 ids."""
import numpy as np
import torch
import triton
import triton.language as tl

META = {"name": "llm_ell", "backend": "triton", "format": "ell"}
BLOCK_W = 64
TILE_ELEMENTS = 8192   # BLOCK_M * BLOCK_W * BLOCK_N: the gathered tile of B one program holds


@triton.jit
def _ell_kernel(cols_ptr, vals_ptr, b_ptr, out_ptr, M, N, W, stride_bk, stride_bn, stride_om, stride_on,
                BLOCK_M: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    n_ok = offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    w0 = 0
    while w0 < W:
        offs_w = w0 + tl.arange(0, BLOCK_W)
        live = row_ok[:, None] & (offs_w[None, :] < W)
        slot = rows[:, None].to(tl.int64) * W + offs_w[None, :]
        cols = tl.load(cols_ptr + slot, mask=live, other=0).to(tl.int64)
        vals = tl.load(vals_ptr + slot, mask=live, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols[:, :, None] * stride_bk + offs_n[None, None, :] * stride_bn,
                    mask=live[:, :, None] & n_ok[None, None, :], other=0.0)
        acc += tl.sum(vals[:, :, None] * b.to(tl.float32), axis=1)
        w0 += BLOCK_W
    tl.store(out_ptr + rows[:, None].to(tl.int64) * stride_om + offs_n[None, :] * stride_on,
             acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


def _torch_dtype(dtype):
    if isinstance(dtype, torch.dtype):
        return dtype
    return {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[str(dtype)]


def _value_dtype(dtype):
    return torch.float32


def _index_dtype(K):
    return np.int32


def prepare(A, dtype, device) -> dict:
    M, K = A.shape
    lengths = np.diff(A.indptr)
    W = max(1, int(lengths.max()) if M else 1)
    rows = np.repeat(np.arange(M), lengths)
    slots = np.arange(A.nnz) - np.repeat(A.indptr[:-1], lengths)
    cols = np.zeros((M, W), dtype=_index_dtype(K))
    vals = np.zeros((M, W), dtype=np.float32)
    cols[rows, slots] = A.indices
    vals[rows, slots] = A.data
    return {"cols": torch.as_tensor(cols, device=device),
            "vals": torch.as_tensor(vals, device=device).to(_value_dtype(_torch_dtype(dtype))),
            "shape": (M, K), "width": W}


def spmm(packed: dict, B, out) -> None:
    M, K = packed["shape"]
    N = B.shape[1]
    if M == 0 or N == 0:
        return
    block_n = min(triton.next_power_of_2(N), 16)
    block_m = max(8, TILE_ELEMENTS // (BLOCK_W * block_n))
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    _ell_kernel[grid](packed["cols"], packed["vals"], B, out, M, N, packed["width"],
                      B.stride(0), B.stride(1), out.stride(0), out.stride(1),
                      BLOCK_M=block_m, BLOCK_W=BLOCK_W, BLOCK_N=block_n)
'''

#: Version 2: values in the run's dtype, int16 column ids when every id fits (K <= 32768).
ELL_KERNEL_COMPACT = ELL_KERNEL.replace(
    "rows padded to the longest one, fp32 values, int32 ids.",
    "rows padded to the longest one, values in the run's dtype, int16 ids when K allows.",
).replace(
    "def _value_dtype(dtype):\n    return torch.float32\n",
    "def _value_dtype(dtype):\n    return dtype\n",
).replace(
    "def _index_dtype(K):\n    return np.int32\n",
    "def _index_dtype(K):\n    return np.int16 if K <= 32768 else np.int32\n",
)

assert "def _value_dtype(dtype):\n    return dtype\n" in ELL_KERNEL_COMPACT and "np.int16" in ELL_KERNEL_COMPACT


# ---- a CUDA C++ kernel through CuPy ----------------------------------------------------------
def _example_dtype_traits() -> str:
    """The fp32/fp16/bf16 storage traits of the CUDA template the coder is shown as its example
    (kernel_templates/cuda/dtypes.cuh, which the registry inlines in front of csr_vector.cu:
    header-free conversions through inline PTX), copied the way a model adapting that example
    copies them."""
    from importlib.resources import files

    text = (files("sparseditto.kernel_templates") / "cuda" / "dtypes.cuh").read_text(encoding="utf-8")
    start = text.index("typedef unsigned short u16;")
    return text[start: text.index("};", text.index("struct BF16")) + 2]


# The CUDA candidate contract, as the CUDA templates follow it (kernel_templates/cuda/csr_vector):
# CUDA_SRC holds the whole CUDA C++ text, prepare() builds the format and compiles it with
# cupy.RawModule once (on a GPU only; the tensors are built anywhere), spmm() checks its operands
# and makes one launch on torch's current stream through the templates' runtime helpers
# (rt.cuda_operands, rt.cupy_stream). A thread per element of C: simple, correct, no claim to speed.
CUDA_KERNEL = '''"""CSR SpMM in CUDA C++ written by the scripted LLM: a thread per (row, column) of C."""
import numpy as np
import torch

from sparseditto.formats import CSR
from sparseditto.kernel_templates import runtime as rt

try:  # CuPy needs a GPU and a CUDA runtime; prepare() builds the tensors without it.
    import cupy as cp
except ImportError:
    cp = None

META = {"name": "llm_csr_scalar_cuda", "backend": "cuda", "format": "csr"}

CUDA_SRC = r"""
@DTYPE_TRAITS@

template <typename T>
__global__ void csr_scalar(const int* __restrict__ indptr, const int* __restrict__ indices,
                           const typename T::storage* __restrict__ values,
                           const typename T::storage* __restrict__ B, typename T::storage* __restrict__ C,
                           int M, int N, long long ldb, long long sb, long long ldc, long long sc) {
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    const int row = blockIdx.y * blockDim.y + threadIdx.y;
    if (row >= M || col >= N) return;
    float acc = 0.f;
    for (int p = indptr[row]; p < indptr[row + 1]; ++p)
        acc += T::to_float(values[p]) * T::to_float(B[(long long)indices[p] * ldb + (long long)col * sb]);
    C[(long long)row * ldc + (long long)col * sc] = T::from_float(acc);
}
"""

_TAGS = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}
_BLOCK = (32, 8, 1)


def prepare(A, dtype, device) -> dict:
    dtype = rt.torch_dtype(dtype)
    if dtype not in _TAGS:
        raise ValueError(f"this kernel supports float32, float16 and bfloat16, got {dtype}")
    device = torch.device(device)
    csr = CSR.from_matrix(A, index_dtype="int32")
    tensors = csr.to_torch(device=device, dtype=dtype)
    name = f"csr_scalar<{_TAGS[dtype]}>"
    kernels = {}
    if device.type == "cuda":
        if cp is None:
            raise RuntimeError("this kernel needs CuPy on a CUDA GPU")
        with cp.cuda.Device(device.index if device.index is not None else 0):
            module = cp.RawModule(code=CUDA_SRC, options=("-std=c++17",), name_expressions=(name,))
            kernels[name] = module.get_function(name)
    return {**tensors, "shape": tuple(A.shape), "kernel_name": name, "kernels": kernels, "scratch": {}}


def spmm(packed: dict, B, out) -> None:
    N, b, target = rt.cuda_operands(packed, B, out, packed["values"].dtype, "llm_csr_scalar_cuda")
    M = packed["shape"][0]
    if N == 0 or M == 0:
        return
    grid = (-(-N // _BLOCK[0]), -(-M // _BLOCK[1]), 1)
    args = (np.uint64(packed["indptr"].data_ptr()), np.uint64(packed["indices"].data_ptr()),
            np.uint64(packed["values"].data_ptr()), np.uint64(b.data_ptr()), np.uint64(target.data_ptr()),
            np.int32(M), np.int32(N), np.int64(b.stride(0)), np.int64(b.stride(1)),
            np.int64(target.stride(0)), np.int64(target.stride(1)))
    device, stream = rt.cupy_stream(packed["scratch"], b.device)
    with device, stream:
        packed["kernels"][packed["kernel_name"]](grid, _BLOCK, args)
    if target is not out:
        out.copy_(target)
'''.replace("@DTYPE_TRAITS@", _example_dtype_traits())
