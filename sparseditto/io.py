"""Turn whatever the user has into the one canonical `SparseMatrix`.

Users arrive with a pruned weight in many shapes: a torch tensor (dense or any sparse layout, on
any device), a scipy matrix, a numpy array, or a file (Matrix Market, DLMC `.smtx`, `.npz`,
`.pt`, `.safetensors`, plain or gzipped). `load_matrix` accepts all of them so that nothing
downstream (analysis, formats, kernels, memory signatures) ever depends on where a matrix came
from. It is also the one place where bad input is caught, with a message that names the problem
and the offending value, before it can surface as an obscure failure inside a kernel.

Conventions:
- Nonzeros are the pattern. Stored zeros are dropped, whatever the source (scipy's explicit zeros,
  the zeros inside a torch BSR tensor's stored blocks, a pruned entry kept as 0.0 in a file), and
  counted in ``meta["explicit_zeros_dropped"]``; the pattern report says how many there were. So a
  BSR tensor and its dense form load (and analyze) as the same matrix.
- The value dtype *name* follows the source (float16/bfloat16/float32/float64); integer values
  load as float32; Matrix Market `real` text loads as float64 (what the text can represent).
  Pattern-only files (`.smtx`, Matrix Market `pattern`) get N(0, 1) values drawn with `seed`.
"""
from __future__ import annotations

import dataclasses
import gzip
import io as _io
import os
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from sparseditto.io_containers import list_container, read_npz, read_safetensors, read_torch
from sparseditto.io_limits import bounded_decompress, check_allocation, check_shape
from sparseditto.io_text import ParsedText, format_matrix_market, format_smtx, parse_matrix_market, parse_smtx
from sparseditto.matrix import VALUE_DTYPES, SparseMatrix

# suffix -> format name; every one may also carry a trailing .gz (detected by magic bytes anyway)
FILE_FORMATS = {".mtx": "mtx", ".smtx": "smtx", ".npz": "npz", ".pt": "pt", ".pth": "pt",
                ".safetensors": "safetensors"}
SAVE_SUFFIXES = (".mtx", ".mtx.gz", ".smtx", ".smtx.gz", ".npz")
_GZIP_MAGIC = b"\x1f\x8b"
_SOURCE_KINDS = "a SparseMatrix, a torch tensor, a scipy.sparse matrix, a 2-D numpy array or a file path"


# ---- public API -------------------------------------------------------------------------------
def load_matrix(source: Any, *, tensor: str | None = None, name: str | None = None, seed: int = 0,
                dtype: str | None = None) -> SparseMatrix:
    """Load `source` as a canonical `SparseMatrix`.

    source: SparseMatrix (returned as is unless `name`/`dtype` override it or it stores zeros), torch
    tensor (dense, sparse COO/CSR/CSC/BSR/BSC; any device), scipy.sparse matrix or array (any format), 2-D numpy
    array, or a path to a `.mtx`, `.smtx`, `.npz`, `.pt`/`.pth` or `.safetensors` file (optionally
    gzipped). `tensor` picks one tensor from a file that holds several. `seed` draws the values of
    pattern-only files. `dtype` overrides the recorded value dtype name.
    """
    override = _normalize_dtype(dtype) if dtype is not None else None
    if isinstance(source, SparseMatrix):
        if tensor is not None:
            raise ValueError(f"tensor={tensor!r} selects a tensor inside a file; the source is already a SparseMatrix.")
        source = source.without_explicit_zeros()
        if source.nnz == 0:
            raise ValueError(f"Matrix '{source.name}' of shape {source.shape} has no nonzeros; there is no sparsity "
                             f"pattern to build a kernel for.")
        changes = {k: v for k, v in (("name", name), ("dtype", override)) if v is not None}
        if override is not None and (override == "float64") != (source.data.dtype == np.float64):
            changes["data"] = source.data.astype(np.float64 if override == "float64" else np.float32)
        return dataclasses.replace(source, **changes) if changes else source
    if isinstance(source, (str, os.PathLike)):
        return _load_file(Path(source).expanduser(), tensor=tensor, name=name, seed=seed, override=override)
    if tensor is not None:
        raise ValueError(f"tensor={tensor!r} selects a tensor inside a file, but the source is an in-memory "
                         f"{type(source).__name__}.")
    mat, dtype_name, meta = _from_object(source)
    return _canonicalize(mat, override or dtype_name, name or "matrix", meta)


def save_matrix(matrix: Any, path: str | os.PathLike) -> Path:
    """Write a matrix as Matrix Market (`.mtx`, `.mtx.gz`), DLMC pattern (`.smtx`, `.smtx.gz`; values
    are not stored) or scipy `.npz`. Matrix Market files remember the dtype name in a comment."""
    matrix = matrix if isinstance(matrix, SparseMatrix) else load_matrix(matrix)
    path = Path(path).expanduser()
    lower = path.name.lower()
    compress = lower.endswith(".gz")
    base = lower[:-3] if compress else lower
    if base.endswith(".smtx"):
        payload = format_smtx(matrix.shape, matrix.indptr, matrix.indices).encode("ascii")
    elif base.endswith(".mtx"):
        payload = format_matrix_market(matrix.shape, matrix.row_ids(), matrix.indices.astype(np.int64),
                                       matrix.data, dtype=matrix.dtype, name=matrix.name).encode("utf-8")
    elif base.endswith(".npz") and not compress:
        sp.save_npz(path, matrix.to_scipy(), compressed=True)
        return path
    else:
        raise ValueError(f"Cannot save to '{path}': unsupported suffix; use one of {', '.join(SAVE_SUFFIXES)}.")
    path.write_bytes(gzip.compress(payload, mtime=0) if compress else payload)
    return path


def list_tensors(path: str | os.PathLike) -> dict[str, str]:
    """Name -> 'shape dtype' of every tensor in a `.npz`/`.pt`/`.safetensors` file (plain or gzipped),
    so callers (batch runs over a checkpoint) can pick the 2-D weights to load."""
    path = Path(path).expanduser()
    kind, gz = _detect_format(path)
    try:
        return list_container(kind, _binary_source(path, kind, gz))
    except ValueError as exc:
        raise ValueError(f"Cannot read '{path}': {exc}") from exc
    except (OSError, EOFError, zlib.error, RuntimeError) as exc:
        raise ValueError(f"Cannot read '{path}': {type(exc).__name__}: {exc}") from exc


# ---- files ------------------------------------------------------------------------------------
def _detect_format(path: Path) -> tuple[str, bool]:
    """(format, gzipped) from the suffix and the gzip magic bytes (a .gz suffix is not required)."""
    if not path.exists():
        raise ValueError(f"Matrix file not found: '{path}'.")
    if path.is_dir():
        raise ValueError(f"Expected a matrix file, got a directory: '{path}'.")
    lower = path.name.lower()
    base = lower[:-3] if lower.endswith(".gz") else lower
    kind = next((fmt for suffix, fmt in FILE_FORMATS.items() if base.endswith(suffix)), None)
    if kind is None:
        raise ValueError(f"Unknown matrix file format for '{path}'; supported suffixes: "
                         f"{', '.join(FILE_FORMATS)} (each optionally followed by .gz).")
    with path.open("rb") as fh:
        gz = fh.read(2) == _GZIP_MAGIC
    return kind, gz


def _file_stem(path: Path) -> str:
    name = path.name[:-3] if path.name.lower().endswith(".gz") else path.name
    for suffix in FILE_FORMATS:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)] or "matrix"
    return name


def _read_bytes(path: Path, gz: bool) -> bytes:
    data = path.read_bytes()
    if not gz:
        return data
    try:
        return bounded_decompress(data)
    except (EOFError, OSError, zlib.error) as exc:
        raise ValueError(f"corrupt or truncated gzip data ({exc}).") from None


def _binary_source(path: Path, kind: str, gz: bool):
    """Plain files are opened by path (lazy/mmap reads); gzipped ones are decompressed in memory."""
    if not gz:
        return path
    data = _read_bytes(path, gz)
    return data if kind == "safetensors" else _io.BytesIO(data)


def _read_file(path: Path, kind: str, gz: bool, tensor: str | None, seed: int):
    """Return (raw object, chosen tensor name, format-specific meta)."""
    if kind in ("mtx", "smtx"):
        if tensor is not None:
            raise ValueError(f"tensor={tensor!r} was given, but a .{kind} file holds a single matrix.")
        data = _read_bytes(path, gz)
        parsed = parse_matrix_market(data, seed=seed) if kind == "mtx" else parse_smtx(data.decode("latin-1"),
                                                                                        seed=seed)
        return parsed, None, dict(parsed.meta)
    reader = {"npz": read_npz, "pt": read_torch, "safetensors": read_safetensors}[kind]
    return reader(_binary_source(path, kind, gz), tensor)


def _load_file(path: Path, *, tensor, name, seed, override) -> SparseMatrix:
    kind, gz = _detect_format(path)
    try:
        raw, chosen, meta = _read_file(path, kind, gz, tensor, seed)
        if isinstance(raw, ParsedText):
            mat = (sp.csr_array(raw.dense) if raw.dense is not None
                   else sp.coo_array((raw.values, (raw.rows, raw.cols)), shape=raw.shape))
            dtype_name, obj_meta = raw.dtype, {}
        else:
            mat, dtype_name, obj_meta = _from_object(raw)
        meta = {"source": str(path), "format": kind, "gzip": gz, "seed": seed, **meta,
                **{k: v for k, v in obj_meta.items() if k not in ("source", "format")}}
        if chosen is not None:
            meta["tensor"] = chosen
        default_name = f"{_file_stem(path)}:{chosen}" if tensor is not None else _file_stem(path)
        return _canonicalize(mat, override or dtype_name, name or default_name, meta)
    except ValueError as exc:
        raise ValueError(f"Cannot load '{path}': {exc}") from exc
    except (OSError, EOFError, zlib.error, RuntimeError, KeyError) as exc:
        raise ValueError(f"Cannot load '{path}' as .{kind}: {type(exc).__name__}: {exc}") from exc


# ---- in-memory objects ------------------------------------------------------------------------
def _normalize_dtype(dtype) -> str:
    """Accept 'float16', torch.float16 or np.float16 for the dtype override."""
    text = str(getattr(dtype, "name", None) or dtype).replace("torch.", "")
    if text not in VALUE_DTYPES:
        raise ValueError(f"Unsupported dtype override {dtype!r}; expected one of {', '.join(VALUE_DTYPES)}.")
    return text


def _shape_text(shape) -> str:
    return str(tuple(int(s) for s in shape))


def _require_2d(ndim: int, shape, kind: str) -> None:
    if ndim != 2:
        raise ValueError(f"Expected a 2-D matrix, got {ndim}-D {kind} of shape {_shape_text(shape)}.")


def _numpy_dtype_name(dt: np.dtype, what: str) -> str:
    if dt.name == "bfloat16":  # ml_dtypes' numpy bfloat16
        return "bfloat16"
    if dt.kind == "f" and dt.name in VALUE_DTYPES:
        return dt.name
    if dt.kind in "iu":
        return "float32"
    raise ValueError(f"Unsupported value dtype {dt.name} for a {what}; expected floating point "
                     f"({', '.join(VALUE_DTYPES)}) or integer values.")


def _host_values(values: np.ndarray, dtype_name: str) -> np.ndarray:
    """Values in the precision SparseMatrix stores (scipy cannot hold float16/bfloat16)."""
    with np.errstate(over="ignore"):  # a float64 value beyond float32 range becomes inf: reported below
        return np.asarray(values, dtype=np.float64 if dtype_name == "float64" else np.float32)


def _from_object(obj) -> tuple[Any, str, dict]:
    """(scipy sparse matrix, dtype name, meta) for a tensor, scipy matrix or numpy array."""
    if sp.issparse(obj):
        _require_2d(obj.ndim, obj.shape, f"scipy.sparse {type(obj).__name__}")
        dtype_name = _numpy_dtype_name(obj.dtype, "scipy.sparse matrix")
        mat = obj.astype(np.float64 if dtype_name == "float64" else np.float32)
        return mat, dtype_name, {"source": f"scipy.sparse.{type(obj).__name__}", "format": f"scipy_{obj.format}"}
    if isinstance(obj, np.ndarray):
        _require_2d(obj.ndim, obj.shape, "array")
        dtype_name = _numpy_dtype_name(obj.dtype, "numpy array")
        return sp.csr_array(_host_values(obj, dtype_name)), dtype_name, {"source": "numpy.ndarray", "format": "dense"}
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        torch = None
    if torch is not None and isinstance(obj, torch.Tensor):
        return _from_torch(obj)
    raise ValueError(f"Unsupported matrix source of type {type(obj).__name__}; expected {_SOURCE_KINDS}.")


def _torch_dtype_name(t) -> str:
    import torch

    if t.is_quantized or t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"Unsupported value dtype {t.dtype}; expected floating point "
                         f"({', '.join(VALUE_DTYPES)}) or integer values.")
    if t.is_floating_point():
        name = str(t.dtype).replace("torch.", "")
        if name not in VALUE_DTYPES:
            raise ValueError(f"Unsupported value dtype {t.dtype}; expected one of {', '.join(VALUE_DTYPES)} "
                             f"(or integer values).")
        return name
    return "float32"


def _from_torch(t) -> tuple[Any, str, dict]:
    """Every torch layout -> scipy, on the CPU. Stored entries of sparse layouts are kept as is."""
    import torch

    layout = {torch.strided: "dense", torch.sparse_coo: "sparse_coo", torch.sparse_csr: "sparse_csr",
              torch.sparse_csc: "sparse_csc", torch.sparse_bsr: "sparse_bsr",
              torch.sparse_bsc: "sparse_bsc"}.get(t.layout)
    kind = "tensor" if layout == "dense" else f"{layout} tensor"
    if layout is None:
        raise ValueError(f"Unsupported torch layout {t.layout}; expected strided or a sparse layout.")
    _require_2d(t.dim(), t.shape, kind)
    dtype_name = _torch_dtype_name(t)
    if t.device.type == "meta":
        raise ValueError(f"The tensor of shape {_shape_text(t.shape)} is on the 'meta' device and has no values.")
    if layout != "dense" and t.dense_dim() != 0:
        raise ValueError(f"Expected a plain 2-D sparse tensor, got a hybrid {kind} of shape {_shape_text(t.shape)} "
                         f"with {t.dense_dim()} dense dimension(s).")
    meta = {"source": "torch.Tensor", "format": f"torch_{layout}", "device": str(t.device)}
    t = t.detach().cpu()

    def host(x):
        x = x.to(torch.float64 if dtype_name == "float64" else torch.float32)
        return x.numpy()

    shape = (int(t.shape[0]), int(t.shape[1]))
    if layout == "dense":
        return _dense_torch_to_csr(t, host, shape), dtype_name, meta
    if layout == "sparse_coo":
        t = t.coalesce()
        idx = t.indices().numpy()
        return sp.coo_array((host(t.values()), (idx[0], idx[1])), shape=shape), dtype_name, meta
    if layout == "sparse_csr":
        return sp.csr_array((host(t.values()), t.col_indices().numpy(), t.crow_indices().numpy()),
                            shape=shape), dtype_name, meta
    if layout == "sparse_csc":
        return sp.csc_array((host(t.values()), t.row_indices().numpy(), t.ccol_indices().numpy()),
                            shape=shape), dtype_name, meta
    blocks = host(t.values())  # (nblocks, block_rows, block_cols)
    if layout == "sparse_bsr":
        mat = sp.bsr_array((blocks, t.col_indices().numpy(), t.crow_indices().numpy()), shape=shape)
    else:  # BSC of A is BSR of A^T with each block transposed
        mat = sp.bsr_array((np.ascontiguousarray(blocks.transpose(0, 2, 1)), t.row_indices().numpy(),
                            t.ccol_indices().numpy()), shape=(shape[1], shape[0])).T
    meta["block_size"] = list(blocks.shape[1:])
    return mat, dtype_name, meta


def _dense_torch_to_csr(t, host, shape: tuple[int, int]):
    """A dense tensor's nonzeros as CSR, found with torch's (multi-threaded) kernels in the
    tensor's own dtype: the row-major scan gives sorted, unique column indices at once. scipy's
    dense -> COO -> CSR path took 2.4 s on an 11008 x 4096 weight (2-core machine), most of it
    in the float32 copy of every element and the COO sort; a batch loads each weight twice."""
    import torch

    flat = t.reshape(-1)
    mask = flat != 0                                     # NaN != 0: kept, so the finiteness check sees it
    where = torch.nonzero(mask).reshape(-1)
    counts = mask.view(shape).sum(dim=1)
    indptr = np.zeros(shape[0] + 1, dtype=np.int64)
    np.cumsum(counts.numpy(), out=indptr[1:])
    index_dtype = np.int32 if shape[1] < 2 ** 31 and where.numel() < 2 ** 31 else np.int64
    indices = torch.remainder(where, shape[1]).numpy().astype(index_dtype)
    csr = sp.csr_array((host(flat[where]), indices, indptr.astype(index_dtype)), shape=shape)
    csr.has_sorted_indices = True
    return csr


# ---- canonical form and its checks ------------------------------------------------------------
def _canonicalize(mat, dtype_name: str, name: str, meta: dict) -> SparseMatrix:
    """Checks every input shares (shape, nnz, finiteness), then builds the SparseMatrix."""
    rows, cols = (int(s) for s in mat.shape)
    if rows == 0 or cols == 0:
        raise ValueError(f"Expected a non-empty matrix, got shape ({rows}, {cols}) for '{name}'.")
    check_shape(rows, cols, f"matrix '{name}'")
    entries = mat.nnz
    check_allocation((rows + 1) * 8 * 3 + entries * 16 * 3, f"Converting matrix '{name}' ({rows} x {cols}, "
                                                            f"{entries} entries)")
    csr = sp.csr_array(mat, copy=True)  # never sort/sum the caller's arrays in place
    csr.sum_duplicates()
    if csr.nnz < entries and mat.format == "coo":
        meta["duplicates_summed"] = int(entries - csr.nnz)
    if csr.nnz == 0:
        raise ValueError(f"Matrix '{name}' of shape ({rows}, {cols}) has no nonzeros; there is no sparsity "
                         f"pattern to build a kernel for.")
    values = _host_values(csr.data, dtype_name)
    finite = np.isfinite(values)
    if not finite.all():
        bad = np.flatnonzero(~finite)
        first = int(bad[0])
        row = int(np.searchsorted(csr.indptr, first, side="right") - 1)
        raise ValueError(f"Matrix '{name}' contains {bad.size} NaN/Inf value(s), e.g. {values[first]} at "
                         f"(row {row}, column {int(csr.indices[first])}); sparse kernels need finite weights.")
    csr.data = values
    stored = csr.nnz
    csr.eliminate_zeros()  # a stored 0.0 (a BSR block's padding, a pruned entry kept as 0) is no nonzero
    if csr.nnz < stored:
        meta["explicit_zeros_dropped"] = int(stored - csr.nnz)
    if csr.nnz == 0:
        raise ValueError(f"Matrix '{name}' of shape ({rows}, {cols}) has no nonzeros: all {stored} stored value(s) "
                         f"are 0, so there is no sparsity pattern to build a kernel for.")
    return SparseMatrix.from_scipy(csr, dtype=dtype_name, name=name, meta=meta)
