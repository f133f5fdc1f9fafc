"""The weights of a model, whatever it arrives as: a safetensors file, a folder of safetensors
shards (with its ``*.index.json``), a torch ``state_dict`` file (.pt/.pth) or an ``nn.Module``.

A batch over a 7B checkpoint must not hold every tensor at once, so this module only lists what
is there (name, shape, dtype, which file) and loads one tensor when asked. Conv weights
[out, in, kh, kw] are offered as their im2col matrix [out, in*kh*kw]: that is the matrix the conv
multiplies by.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable


@dataclass(frozen=True)
class WeightRef:
    """One tensor of the model: its name, its shape as stored, and how to read it."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    load: Callable[[], Any]        # -> torch.Tensor (CPU), read only when called

    @property
    def matrix_shape(self) -> tuple[int, int] | None:
        """The 2-D matrix a kernel multiplies by (im2col for 4-D conv weights); None otherwise."""
        if len(self.shape) == 2:
            return int(self.shape[0]), int(self.shape[1])
        if len(self.shape) == 4:
            out, rest = int(self.shape[0]), int(self.shape[1]) * int(self.shape[2]) * int(self.shape[3])
            return out, rest
        return None


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


_ST_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64"}


def _safetensors_refs(path: Path) -> list[WeightRef]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            names = list(handle.keys())
            metas = {n: (tuple(handle.get_slice(n).get_shape()), handle.get_slice(n).get_dtype()) for n in names}
    except (SafetensorError, OSError) as exc:
        raise ValueError(f"Cannot read safetensors file {path}: {exc}") from None

    def loader(name: str):
        def load():
            with safe_open(str(path), framework="pt") as handle:
                return handle.get_tensor(name)
        return load

    return [WeightRef(n, s, _ST_DTYPES.get(d, str(d).lower()), loader(n)) for n, (s, d) in metas.items()]


def _shard_folder_refs(folder: Path) -> list[WeightRef]:
    """A folder of shards: the index json names each tensor's shard; without one, every
    ``*.safetensors`` file in the folder."""
    indexes = sorted(folder.glob("*.safetensors.index.json"))
    if len(indexes) > 1:
        raise ValueError(f"Folder {folder} holds {len(indexes)} index files ({', '.join(p.name for p in indexes)}); "
                         "pass the one to use's folder alone.")
    if indexes:
        try:
            weight_map = json.loads(indexes[0].read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"Index {indexes[0]} is not a safetensors index (needs a 'weight_map'): {exc}") from None
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            raise ValueError(f"Index {indexes[0].name} names shard(s) missing from {folder}: {', '.join(missing)}.")
        refs = {r.name: r for s in shards for r in _safetensors_refs(folder / s)}
        absent = [n for n in weight_map if n not in refs]
        if absent:
            raise ValueError(f"Index {indexes[0].name} lists tensors not found in their shards: {absent[:5]}.")
        return [refs[n] for n in weight_map]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"Folder {folder} holds no *.safetensors shards (and no *.safetensors.index.json).")
    return [r for f in files for r in _safetensors_refs(f)]


def _tensor_refs(tensors: dict) -> list[WeightRef]:
    return [WeightRef(n, tuple(t.shape), _dtype_name(t.dtype), (lambda t=t: t.detach().cpu()))
            for n, t in tensors.items()]


def _torch_file_refs(path: Path) -> list[WeightRef]:
    import torch

    from sparseditto.io_containers import _flatten_tensors, _torch_load

    obj = _torch_load(path)
    if isinstance(obj, torch.Tensor):
        raise ValueError(f"{path} holds one unnamed tensor; a batch needs a state_dict (name -> tensor). "
                         "Use `sparseditto run` for a single matrix.")
    flat = _flatten_tensors(obj)
    if not flat:
        raise ValueError(f"{path} holds a {type(obj).__name__} with no tensors in it.")
    return _tensor_refs(flat)


def list_weights(model: Any) -> list[WeightRef]:
    """Every tensor of ``model`` (a path or an nn.Module), in the model's order."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        torch = None
    if torch is not None and isinstance(model, torch.nn.Module):
        return _tensor_refs(dict(model.state_dict()))
    if isinstance(model, dict):
        bad = [k for k, v in model.items() if torch is None or not isinstance(v, torch.Tensor)]
        if bad:
            raise ValueError(f"A state_dict maps names to tensors; {bad[:3]} are not tensors.")
        return _tensor_refs(model)
    if not isinstance(model, (str, os.PathLike)):
        raise ValueError(f"Expected a model as a safetensors file, a folder of shards, a .pt state_dict or an "
                         f"nn.Module, got {type(model).__name__}.")
    path = Path(model).expanduser()
    if not path.exists():
        raise ValueError(f"Model path {path} does not exist.")
    if path.is_dir():
        return _shard_folder_refs(path)
    lower = path.name.lower()
    if lower.endswith(".safetensors"):
        return _safetensors_refs(path)
    if lower.endswith((".pt", ".pth", ".bin")):
        return _torch_file_refs(path)
    raise ValueError(f"Model file {path.name}: expected .safetensors, a shard folder, or a .pt/.pth state_dict.")


def as_matrix_tensor(ref: WeightRef):
    """The weight as the 2-D tensor the kernel multiplies by (a conv's im2col view)."""
    t = ref.load()
    shape = ref.matrix_shape
    if shape is None:
        raise ValueError(f"{ref.name} has shape {ref.shape}: not a 2-D weight or a 4-D conv weight.")
    return t.reshape(shape)
