"""The vendor libraries a user could call instead of a generated kernel, as kernels with the
candidate contract: ``prepare(A, dtype, device) -> packed`` once, ``spmm(packed, B, out)`` per call.

Why the candidate contract: a vendor path is a candidate like any other (issue 11). The harness
verifies it with the same protocol as generated code (fresh seeds, odd N, NaN / garbage pre-fills,
B and the packed arrays unchanged), times it with the same loop (cold L2, fresh B per launch,
eager and CUDA-graph) and `result.kernel` / a batch bundle can run it. They are trusted harness
code (like dense cuBLAS always was), never candidate sources: generated code still may not call a
vendor library, so these run outside the sandbox's op and kernel tracing.

* ``dense``               torch.matmul on the densified A (cuBLAS; CPU torch on the interpreter)
* ``cusparse_csr_torch``  a torch CSR tensor @ B (cuSPARSE SpMM; MKL on the CPU: float32/64 only)
* ``cusparse_csr_cupy``   cupyx.scipy.sparse.csr_matrix @ B (cuSPARSE through CuPy; fp16/bf16 in fp32)
* ``cusparselt_2to4``     torch.sparse.to_sparse_semi_structured (cuSPARSELt / CUTLASS 2:4)
* ``triton_bsr_torch``    torch.sparse._triton_ops.bsr_dense_mm on a zero-padded BSR tensor

``apply(packed, B)`` returns a new tensor: the call a user would write, what the baselines time.
``spmm`` writes ``out`` (the library's out= form where it has one, else a copy: part of its cost).
Library objects sit in packed behind `Held` (the state check compares their identity); the arrays
they are built from sit beside them, so the check also sees their bytes.
"""
from __future__ import annotations

import importlib.util
import warnings

import numpy as np

BSR_BLOCK_SIZES = (32, 16, 64)  # 32 first: it wins ties (the usual default)


class VendorUnavailable(Exception):
    """This vendor path cannot run on this matrix/dtype/device; the message says why."""


class Held:
    """A library object in a packed dict (a sparse tensor, a CuPy matrix): kept by identity."""

    def __init__(self, value) -> None:
        self.value = value


def is_2to4_rows(matrix) -> tuple[bool, str]:
    """Every group of 4 consecutive columns of every row holds at most 2 nonzeros (K % 4 == 0)."""
    m, k = matrix.shape
    if k % 4:
        return False, f"K = {k} is not a multiple of 4"
    if matrix.nnz == 0:
        return True, ""
    groups = matrix.row_ids() * (k // 4) + matrix.indices.astype(np.int64) // 4
    worst = int(np.bincount(groups).max())
    if worst > 2:
        return False, f"a group of 4 columns holds {worst} nonzeros (not 2:4 along rows)"
    return True, ""


def choose_bsr_block(matrix) -> int:
    """Block size among 16/32/64 that stores the fewest elements (nonzero blocks x b^2)."""
    best, best_cost = 32, None
    rows = matrix.row_ids()
    cols = matrix.indices.astype(np.int64)
    for b in BSR_BLOCK_SIZES:
        n_col_blocks = -(-matrix.shape[1] // b)
        nblocks = np.unique((rows // b) * n_col_blocks + cols // b).size if matrix.nnz else 0
        cost = nblocks * b * b
        if best_cost is None or cost < best_cost:
            best, best_cost = b, cost
    return best


def _name(dtype) -> str:
    return str(dtype).replace("torch.", "")


class CopiedOut:
    """A library call without an out= form: ``spmm`` copies its result into ``out`` (part of its cost)."""

    @classmethod
    def spmm(cls, packed, B, out) -> None:
        out.copy_(cls.apply(packed, B))


class Dense:
    name, baseline, library = "dense", "cublas_dense", "cuBLAS dense GEMM (torch.matmul)"
    runs_on_cpu = True

    @staticmethod
    def unavailable(matrix, dtype: str, backend: str) -> str | None:
        return None

    @staticmethod
    def prepare(A, dtype, device) -> dict:
        note = None if str(device).startswith("cuda") else "CPU torch.matmul (interpreter backend), not cuBLAS"
        return {"dense": A.to_torch(dtype=dtype, device=device, layout="dense"), "shape": tuple(A.shape), "note": note}

    @staticmethod
    def apply(packed, B):
        import torch

        return torch.matmul(packed["dense"], B)

    @staticmethod
    def spmm(packed, B, out) -> None:
        import torch

        torch.matmul(packed["dense"], B, out=out)


class CsrTorch:
    name, baseline, library = "cusparse_csr_torch", "cusparse_csr_torch", "cuSPARSE CSR SpMM via torch.sparse"
    runs_on_cpu = True

    @staticmethod
    def unavailable(matrix, dtype: str, backend: str) -> str | None:
        if backend != "cuda" and dtype in ("float16", "bfloat16"):
            return f"CPU torch CSR (MKL) has no {dtype} SpMM"
        return None

    @staticmethod
    def prepare(A, dtype, device) -> dict:
        import torch

        index = torch.int32 if A.nnz < 2 ** 31 - 1 else torch.int64
        crow = torch.from_numpy(A.indptr).to(device=device, dtype=index)
        col = torch.from_numpy(A.indices.astype(np.int64)).to(device=device, dtype=index)
        values = torch.from_numpy(A.data).to(device=device, dtype=dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)   # "Sparse CSR tensor support is in beta state"
            a = torch.sparse_csr_tensor(crow, col, values, size=tuple(A.shape))
        note = None if str(device).startswith("cuda") else "CPU torch CSR (interpreter backend), not cuSPARSE"
        return {"crow": crow, "col": col, "values": values, "csr": Held(a), "shape": tuple(A.shape), "note": note}

    @staticmethod
    def apply(packed, B):
        import torch

        return torch.sparse.mm(packed["csr"].value, B)

    @staticmethod
    def spmm(packed, B, out) -> None:
        import torch

        # beta=0: out's old contents are ignored (NaN included), as for a BLAS call
        torch.addmm(out, packed["csr"].value, B, beta=0, out=out)


class CsrCupy(CopiedOut):
    name, baseline, library = "cusparse_csr_cupy", "cusparse_csr_cupy", "cuSPARSE CSR SpMM via CuPy (cupyx)"
    runs_on_cpu = False

    @staticmethod
    def unavailable(matrix, dtype: str, backend: str) -> str | None:
        if backend != "cuda":
            return "needs a CUDA GPU"
        if importlib.util.find_spec("cupy") is None:
            return "CuPy is not installed"
        return None

    @staticmethod
    def prepare(A, dtype, device) -> dict:
        import torch

        try:
            import cupy
            import cupyx.scipy.sparse as cusparse
        except ImportError as exc:
            raise VendorUnavailable(f"CuPy is not installed ({exc})") from None
        # cupyx's sparse matrices hold only bool/float32/float64/complex values: half-precision
        # weights are computed in float32 (what a CuPy user would have to do), and the note says so.
        compute, note = dtype, None
        if dtype in (torch.float16, torch.bfloat16):
            compute, note = torch.float32, f"cupyx has no {_name(dtype)} SpMM: computed in float32"
        values = torch.from_numpy(A.data).to(device=device, dtype=compute)
        indptr = torch.from_numpy(A.indptr.astype(np.int32)).to(device)
        indices = torch.from_numpy(A.indices).to(device)
        a = cusparse.csr_matrix((cupy.from_dlpack(values), cupy.from_dlpack(indices), cupy.from_dlpack(indptr)),
                                shape=tuple(A.shape))
        return {"values": values, "indptr": indptr, "indices": indices, "csr": Held(a), "compute": _name(compute),
                "shape": tuple(A.shape), "note": note, "scratch": {}}

    @staticmethod
    def apply(packed, B):
        import cupy
        import torch

        # torch's current stream at call time (not at prepare time), so that the call also lands on
        # the capturing stream when it is recorded into a CUDA graph
        ptr = torch.cuda.current_stream().cuda_stream
        streams = packed["scratch"].setdefault("streams", {})
        stream = streams.get(ptr)
        if stream is None:
            stream = streams[ptr] = cupy.cuda.ExternalStream(ptr)
        b = B if _name(B.dtype) == packed["compute"] else B.to(getattr(torch, packed["compute"]))
        with stream:
            return torch.from_dlpack(packed["csr"].value @ cupy.from_dlpack(b.contiguous()))


class SemiStructured24(CopiedOut):
    name, baseline, library = "cusparselt_2to4", "cusparselt_2to4", "cuSPARSELt 2:4 via torch semi-structured"
    runs_on_cpu = False

    @staticmethod
    def unavailable(matrix, dtype: str, backend: str) -> str | None:
        if backend != "cuda":
            return "needs a CUDA GPU (sm80+)"
        if dtype not in ("float16", "bfloat16"):
            return f"2:4 semi-structured sparsity needs float16/bfloat16, got {dtype}"
        ok, why = is_2to4_rows(matrix)
        return None if ok else f"matrix is not 2:4 along rows: {why}"

    @staticmethod
    def prepare(A, dtype, device) -> dict:
        import torch

        major, minor = torch.cuda.get_device_capability()
        if major < 8:
            raise VendorUnavailable(f"2:4 sparse tensor cores need sm80+, this GPU is sm{major}{minor}")
        ok, why = is_2to4_rows(A)
        if not ok:
            raise VendorUnavailable(f"matrix is not 2:4 along rows: {why}")
        from torch.sparse import to_sparse_semi_structured

        a = to_sparse_semi_structured(A.to_torch(dtype=dtype, device=device, layout="dense"))
        return {"a": Held(a), "shape": tuple(A.shape), "note": f"backend {type(a).__name__}"}

    @staticmethod
    def apply(packed, B):
        import torch

        return torch.mm(packed["a"].value, B)


class TritonBsr(CopiedOut):
    name, baseline, library = "triton_bsr_torch", "triton_bsr_torch", "torch's Triton BSR kernels (bsr_dense_mm)"
    runs_on_cpu = False

    @staticmethod
    def unavailable(matrix, dtype: str, backend: str) -> str | None:
        return None if backend == "cuda" else "needs a CUDA GPU (torch's Triton BSR kernels)"

    @staticmethod
    def prepare(A, dtype, device) -> dict:
        import torch

        try:
            from torch.sparse._triton_ops import bsr_dense_mm
        except ImportError as exc:
            raise VendorUnavailable(f"torch.sparse._triton_ops unavailable ({exc})") from None
        if bsr_dense_mm is None:
            raise VendorUnavailable("torch was built without Triton support for BSR")
        b = choose_bsr_block(A)
        M, K = A.shape
        Mp, Kp = -(-M // b) * b, -(-K // b) * b
        dense = torch.zeros((Mp, Kp), dtype=dtype, device=device)
        dense[:M, :K] = A.to_torch(dtype=dtype, device=device, layout="dense")
        note = f"block {b}x{b}" + (f"; A zero-padded to {Mp}x{Kp}" if (Mp, Kp) != (M, K) else "") + \
            "; B padded to a power-of-two N >= 16 when needed (bsr_dense_mm's column tiles)"
        return {"bsr": Held(dense.to_sparse_bsr((b, b))), "shape": (M, K), "padded": (Mp, Kp), "note": note,
                "scratch": {}}

    @staticmethod
    def apply(packed, B):
        import torch
        from torch.sparse._triton_ops import bsr_dense_mm

        (M, K), (Mp, Kp) = packed["shape"], packed["padded"]
        n = B.shape[1]
        # a power of two, at least 16: bsr_dense_mm tiles B's columns with tl.arange over the padded
        # width (measured on the H200: N = 33 padded to 48 failed "arange's range must be a power of 2")
        Np = max(16, 1 << (n - 1).bit_length())
        key = (n, str(B.dtype), str(B.device))
        bufs = packed["scratch"].get(key)
        if bufs is None:   # per N: the padded B and C (zeros outside the real block stay zero)
            bufs = packed["scratch"][key] = (
                torch.zeros((Kp, Np), dtype=B.dtype, device=B.device) if (Kp, Np) != (K, n) else None,
                torch.empty((Mp, Np), dtype=B.dtype, device=B.device))
        b_pad, c_pad = bufs
        if b_pad is not None:
            b_pad[:K, :n].copy_(B)
        bsr_dense_mm(packed["bsr"].value, B if b_pad is None else b_pad, out=c_pad)
        return c_pad[:M, :n]


VENDOR_KERNELS = {k.name: k for k in (Dense, CsrTorch, CsrCupy, SemiStructured24, TritonBsr)}
VENDOR_NAMES = tuple(VENDOR_KERNELS)
BY_BASELINE = {k.baseline: k for k in VENDOR_KERNELS.values()}


def is_vendor_kernel(template: str | None) -> bool:
    """Whether ``template`` names a vendor path (dense cuBLAS included), not a generated kernel."""
    return template in VENDOR_KERNELS


def vendor_kernel(name: str):
    """The vendor kernel class for a template name or a baseline name (ValueError for neither)."""
    kernel = VENDOR_KERNELS.get(name) or BY_BASELINE.get(name)
    if kernel is None:
        raise ValueError(f"Unknown vendor kernel {name!r}; expected one of {VENDOR_NAMES}.")
    return kernel


def unavailable_reason(name: str, matrix, dtype: str, backend: str) -> str | None:
    """Why vendor path ``name`` cannot run for (matrix, dtype) on ``backend``, or None. Cheap: it
    starts no GPU context (what only the device can say, e.g. sm80+, comes back from prepare)."""
    return vendor_kernel(name).unavailable(matrix, dtype, backend)
