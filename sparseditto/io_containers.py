"""Binary container files that hold one or many named arrays: `.npz`, `.pt`/`.pth`, `.safetensors`.

A checkpoint usually holds many tensors, so every reader here works the same way: list what the
file holds, pick the one named by `tensor=` (or the only one), and hand back the raw object (a
torch tensor, numpy array or scipy matrix) for `sparseditto.io` to canonicalize. Errors list the
names present, because the user's next step is always "which name did I mean?".

Plain (non-gzipped) files are opened lazily where the format allows it (safetensors `safe_open`,
`torch.load(mmap=True)`), so picking one layer of a multi-GB checkpoint does not read the rest.
"""
from __future__ import annotations

import difflib
import io
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

# Keys scipy.sparse.save_npz writes (CSR/CSC/BSR: data, indices, indptr; COO: row, col, data).
_SCIPY_NPZ_KEYS = {"format", "shape"}
_MAX_LISTED = 40


def describe_names(entries: Mapping[str, str]) -> str:
    """'a (512, 512) float16, b (512,) float32, ... and 7 more' for error messages."""
    items = [f"{name} {desc}".rstrip() for name, desc in entries.items()]
    shown = ", ".join(items[:_MAX_LISTED])
    if len(items) > _MAX_LISTED:
        shown += f", ... and {len(items) - _MAX_LISTED} more"
    return shown or "(none)"


def select_name(entries: Mapping[str, str], tensor: str | None, what: str) -> str:
    """The entry to load: the one named `tensor`, or the only one when `tensor` is None."""
    if not entries:
        raise ValueError(f"the {what} holds no tensors or arrays.")
    if tensor is None:
        if len(entries) == 1:
            return next(iter(entries))
        raise ValueError(f"the {what} holds {len(entries)} tensors; pass tensor=NAME to pick one of: "
                         f"{describe_names(entries)}.")
    if tensor in entries:
        return tensor
    close = difflib.get_close_matches(tensor, list(entries), n=3)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise ValueError(f"tensor {tensor!r} not found in the {what}.{hint} Names present: "
                     f"{describe_names(entries)}.")


# safetensors reports dtypes by short codes; show the names users know.
_SAFETENSORS_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64",
                       "I8": "int8", "I16": "int16", "I32": "int32", "I64": "int64", "U8": "uint8",
                       "BOOL": "bool"}


def _shape_dtype(shape, dtype) -> str:
    name = str(dtype).replace("torch.", "")
    return f"{tuple(int(s) for s in shape)} {_SAFETENSORS_DTYPES.get(name, name)}"


# ---- .npz --------------------------------------------------------------------------------------
def _member_header(archive, name: str):
    """(shape, dtype) from a member's .npy header without loading the array; None when the member
    name or header version is unusual."""
    try:
        with archive.zip.open(name + ".npy") as fh:
            version = np.lib.format.read_magic(fh)
            reader = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                      else np.lib.format.read_array_header_2_0)
            shape, _, dtype = reader(fh)
    except (KeyError, ValueError):
        return None
    return shape, dtype


def _npz_entries(archive) -> dict[str, str]:
    """Shapes and dtypes from each member's .npy header, without loading the arrays."""
    entries = {}
    for name in archive.files:
        header = _member_header(archive, name)
        shape, dtype = header if header is not None else (archive[name].shape, archive[name].dtype)
        entries[name] = _shape_dtype(shape, dtype)
    return entries


def _check_member_size(archive, name: str) -> None:
    """A compressed member can declare a huge array in a few bytes: check before loading it."""
    from sparseditto.io_limits import check_allocation

    header = _member_header(archive, name)
    if header is not None:
        shape, dtype = header
        check_allocation(float(np.prod(shape, dtype=np.float64)) * np.dtype(dtype).itemsize,
                         f"The .npz member {name!r} of shape {tuple(shape)}")


def read_npz(source: Path | io.BytesIO, tensor: str | None) -> tuple[Any, str | None, dict]:
    """A scipy `save_npz` file (returns the sparse matrix) or an `np.savez` file of named arrays."""
    import scipy.sparse as sp

    try:
        with np.load(source, allow_pickle=False) as archive:
            names = list(archive.files)
            if _SCIPY_NPZ_KEYS.issubset(names):
                for member in names:
                    _check_member_size(archive, member)
                if tensor is not None:
                    raise ValueError(f"tensor={tensor!r} was given, but this is a single scipy sparse matrix "
                                     f"file (keys {names}); leave tensor unset.")
                if hasattr(source, "seek"):
                    source.seek(0)
                return sp.load_npz(source), None, {"npz_kind": "scipy_sparse"}
            entries = _npz_entries(archive)
            chosen = select_name(entries, tensor, ".npz file")
            _check_member_size(archive, chosen)
            return archive[chosen], chosen, {"npz_kind": "arrays"}
    except zipfile.BadZipFile as exc:
        raise ValueError(f"not a valid .npz (zip) archive: {exc}.") from None


# ---- .pt / .pth ---------------------------------------------------------------------------------
def _flatten_tensors(obj, prefix: str = "") -> dict:
    """Tensors inside nested dicts/lists (state_dict, {'model': state_dict}, ...) by dotted name."""
    import torch

    if isinstance(obj, torch.Tensor):
        return {prefix: obj}
    out: dict = {}
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            out.update(_flatten_tensors(value, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            out.update(_flatten_tensors(value, f"{prefix}.{i}" if prefix else str(i)))
    return out


def _torch_load(source: Path | io.BytesIO):
    import pickle

    import torch

    kwargs = dict(map_location="cpu", weights_only=True)
    try:
        if isinstance(source, Path):
            try:
                return torch.load(source, mmap=True, **kwargs)
            except RuntimeError as exc:  # legacy (non-zip) files cannot be memory-mapped
                if "mmap" not in str(exc).lower() and "zip" not in str(exc).lower():
                    raise
        return torch.load(source, **kwargs)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"torch.load(weights_only=True) refused the file ({first}). Save a tensor or a "
                         f"state_dict (model.state_dict()), not a pickled module or custom object.") from None


def read_torch(source: Path | io.BytesIO, tensor: str | None) -> tuple[Any, str | None, dict]:
    """A `torch.save` file holding one tensor, or a dict/state_dict (possibly nested) of tensors."""
    import torch

    obj = _torch_load(source)
    if isinstance(obj, torch.Tensor):
        if tensor is not None:
            raise ValueError(f"tensor={tensor!r} was given, but the file holds a single unnamed tensor of "
                             f"shape {tuple(obj.shape)}; leave tensor unset.")
        return obj, None, {"container": "tensor"}
    flat = _flatten_tensors(obj)
    if not flat:
        raise ValueError(f"the .pt file holds a {type(obj).__name__} with no tensors in it.")
    entries = {name: _shape_dtype(t.shape, t.dtype) for name, t in flat.items()}
    chosen = select_name(entries, tensor, ".pt file")
    return flat[chosen], chosen, {"container": type(obj).__name__}


# ---- .safetensors -----------------------------------------------------------------------------
def read_safetensors(source: Path | bytes, tensor: str | None) -> tuple[Any, str | None, dict]:
    """A safetensors file; only the selected tensor is read when the file is on disk."""
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load as load_bytes

    try:
        if isinstance(source, Path):
            with safe_open(str(source), framework="pt") as handle:
                entries = {}
                for name in handle.keys():
                    view = handle.get_slice(name)
                    entries[name] = _shape_dtype(view.get_shape(), view.get_dtype())
                chosen = select_name(entries, tensor, ".safetensors file")
                return handle.get_tensor(chosen), chosen, {}
        tensors = load_bytes(source)
    except SafetensorError as exc:
        raise ValueError(f"not a valid safetensors file: {exc}.") from None
    entries = {name: _shape_dtype(t.shape, t.dtype) for name, t in tensors.items()}
    chosen = select_name(entries, tensor, ".safetensors file")
    return tensors[chosen], chosen, {}


def list_container(kind: str, source: Path | io.BytesIO | bytes) -> dict[str, str]:
    """Name -> 'shape dtype' of every tensor/array in a container file (for batch selection)."""
    if kind == "npz":
        with np.load(source, allow_pickle=False) as archive:
            if _SCIPY_NPZ_KEYS.issubset(archive.files):
                return {"": f"{tuple(int(s) for s in archive['shape'])} {archive['data'].dtype}"}
            return _npz_entries(archive)
    if kind == "pt":
        import torch

        obj = _torch_load(source)
        if isinstance(obj, torch.Tensor):
            return {"": _shape_dtype(obj.shape, obj.dtype)}
        return {name: _shape_dtype(t.shape, t.dtype) for name, t in _flatten_tensors(obj).items()}
    if kind == "safetensors":
        from safetensors import safe_open
        from safetensors.torch import load as load_bytes

        if isinstance(source, Path):
            with safe_open(str(source), framework="pt") as handle:
                return {name: _shape_dtype(handle.get_slice(name).get_shape(), handle.get_slice(name).get_dtype())
                        for name in handle.keys()}
        return {name: _shape_dtype(t.shape, t.dtype) for name, t in load_bytes(source).items()}
    raise ValueError(f"{kind!r} files hold a single matrix; there are no tensor names to list.")
