"""The one canonical in-memory sparse matrix every part of SparseDitto works on.

Inputs arrive as torch tensors, scipy matrices, numpy arrays or files; `sparseditto.io.load_matrix`
turns each into a `SparseMatrix` so the analyzer, the formats and the kernels never have to care
where a matrix came from. The structure (which entries exist) is what matters for kernels and
signatures; values only matter for verification, so they are kept in float32 (float64 when the
source was float64) together with the dtype the user's weights had.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

VALUE_DTYPES = ("float16", "bfloat16", "float32", "float64")


@dataclass(frozen=True, eq=False)
class SparseMatrix:
    """A 2-D sparse matrix in canonical CSR form.

    Invariants (checked in ``__post_init__``): 2-D, non-empty shape, int64 ``indptr`` of length
    ``rows + 1``, int32 ``indices`` sorted within each row with no duplicates, finite ``data``.
    A SparseMatrix may store explicit zeros (the formats keep whatever is stored); the user-facing
    entry points (`sparseditto.io.load_matrix`, `sparseditto.analysis.analyze`) drop them with
    `without_explicit_zeros`, so a zero is never mistaken for a nonzero of the pattern.
    """

    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray
    shape: tuple[int, int]
    dtype: str = "float32"
    name: str = "matrix"
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        rows, cols = self.shape
        if rows <= 0 or cols <= 0:
            raise ValueError(f"Matrix must have a non-empty shape, got shape {self.shape}.")
        if self.dtype not in VALUE_DTYPES:
            raise ValueError(f"Unsupported value dtype '{self.dtype}'; expected one of {VALUE_DTYPES}.")
        if self.indptr.ndim != 1 or self.indptr.shape[0] != rows + 1:
            raise ValueError(
                f"Expected indptr of length rows + 1 = {rows + 1}, got shape {self.indptr.shape}.")
        if self.indices.shape != self.data.shape:
            raise ValueError(
                f"Expected indices and data of equal length, got {self.indices.shape[0]} and {self.data.shape[0]}.")
        if int(self.indptr[-1]) != self.indices.shape[0]:
            raise ValueError(
                f"indptr[-1] = {int(self.indptr[-1])} does not match nnz = {self.indices.shape[0]}.")

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_scipy(cls, mat, *, dtype: str | None = None, name: str = "matrix", meta: dict | None = None) -> "SparseMatrix":
        """Canonicalize any scipy.sparse matrix/array: CSR, sorted, duplicates summed."""
        csr = sp.csr_array(mat, copy=True)
        csr.sum_duplicates()
        csr.sort_indices()
        if dtype is None:
            dtype = "float64" if csr.dtype == np.float64 else "float32"
        values = csr.data.astype(np.float64 if dtype == "float64" else np.float32, copy=False)
        if values.size and not np.isfinite(values).all():
            bad = int((~np.isfinite(values)).sum())
            raise ValueError(f"Matrix '{name}' contains {bad} NaN/Inf values; sparse kernels need finite weights.")
        return cls(
            indptr=csr.indptr.astype(np.int64, copy=False),
            indices=csr.indices.astype(np.int32, copy=False),
            data=values,
            shape=(int(csr.shape[0]), int(csr.shape[1])),
            dtype=dtype,
            name=name,
            meta=dict(meta or {}),
        )

    # ---- views --------------------------------------------------------------------------------
    @property
    def nnz(self) -> int:
        return int(self.indices.shape[0])

    @property
    def rows(self) -> int:
        return self.shape[0]

    @property
    def cols(self) -> int:
        return self.shape[1]

    @property
    def density(self) -> float:
        return self.nnz / float(self.shape[0] * self.shape[1])

    @property
    def sparsity(self) -> float:
        return 1.0 - self.density

    def row_lengths(self) -> np.ndarray:
        return np.diff(self.indptr)

    def row_ids(self) -> np.ndarray:
        """Row index of every stored entry (COO rows), int64."""
        return np.repeat(np.arange(self.rows, dtype=np.int64), self.row_lengths())

    def to_scipy(self) -> sp.csr_array:
        return sp.csr_array((self.data, self.indices, self.indptr), shape=self.shape)

    def to_dense(self, dtype=np.float64) -> np.ndarray:
        out = np.zeros(self.shape, dtype=dtype)
        out[self.row_ids(), self.indices] = self.data
        return out

    def mask(self) -> np.ndarray:
        """Boolean dense mask of stored entries (only for matrices that fit in memory)."""
        out = np.zeros(self.shape, dtype=bool)
        out[self.row_ids(), self.indices] = True
        return out

    def with_values(self, data: np.ndarray) -> "SparseMatrix":
        """Same pattern, new values (used to draw fresh random values for verification)."""
        data = np.asarray(data)
        if data.shape != self.data.shape:
            raise ValueError(f"Expected {self.nnz} values for this pattern, got {data.shape}.")
        return SparseMatrix(self.indptr, self.indices, data, self.shape, self.dtype, self.name, dict(self.meta))

    def explicit_zeros(self) -> int:
        """How many stored entries hold the value 0."""
        return int(self.nnz - np.count_nonzero(self.data))

    def without_explicit_zeros(self) -> "SparseMatrix":
        """This matrix with its stored zeros removed (``self`` when there are none).

        A stored zero is not a nonzero: a torch BSR tensor stores whole blocks, scipy keeps zeros it
        was given, a pruned checkpoint may store the pruned entries as 0.0. Counting them would make
        a 90%-sparse weight look dense to the analysis and the kernels. The count removed is added to
        ``meta["explicit_zeros_dropped"]`` so reports can say how many there were.
        """
        zeros = self.explicit_zeros()
        if zeros == 0:
            return self
        keep = self.data != 0
        kept_per_row = np.bincount(self.row_ids()[keep], minlength=self.rows)
        indptr = np.zeros(self.rows + 1, dtype=np.int64)
        np.cumsum(kept_per_row, out=indptr[1:])
        meta = dict(self.meta, explicit_zeros_dropped=int(self.meta.get("explicit_zeros_dropped", 0)) + zeros)
        return SparseMatrix(indptr, self.indices[keep], self.data[keep], self.shape, self.dtype, self.name, meta)

    def to_torch(self, dtype=None, device="cpu", layout: str = "dense"):
        """Materialize as a torch tensor: ``layout`` is 'dense' or 'csr'."""
        import torch

        tdtype = dtype or getattr(torch, self.dtype)
        if layout == "dense":
            # built where it is wanted: on a GPU only the entries cross the bus, not M*K zeros (65536^2 fp32
            # is 17 GB, which the graphs suite's cuBLAS baseline densified on the host for every timing)
            device = torch.device(device)
            on_gpu = device.type == "cuda"
            where = device if on_gpu else torch.device("cpu")
            rows = torch.from_numpy(self.row_ids()).to(where)
            cols = torch.from_numpy(self.indices.astype(np.int64)).to(where)
            vals = torch.from_numpy(self.data.astype(np.float32)).to(where)
            out = torch.zeros(self.shape, dtype=tdtype if on_gpu else torch.float32, device=where)
            out[rows, cols] = vals.to(out.dtype)   # fp32 first, then the dtype: the same rounding either way
            return out.to(device=device, dtype=tdtype)
        if layout == "csr":
            return torch.sparse_csr_tensor(
                torch.from_numpy(self.indptr), torch.from_numpy(self.indices.astype(np.int64)),
                torch.from_numpy(self.data.astype(np.float32)).to(tdtype), size=self.shape, device=device)
        raise ValueError(f"Unknown layout '{layout}'; expected 'dense' or 'csr'.")

    def __repr__(self) -> str:
        return (f"SparseMatrix(name={self.name!r}, shape={self.shape}, nnz={self.nnz}, "
                f"sparsity={self.sparsity:.4f}, dtype={self.dtype})")
