"""Small synthetic checkpoints for the batch tests (seconds on the Triton interpreter).

The block-sparse 256 x 1024 weights are the smallest shape where the cost model lets a kernel
beat dense on an A100 at N = 16, so the batch has a real kernel to search, reuse, share, bundle
and patch in. 95% of their 32 x 32 tiles are empty: the interpreter's time grows with the tiles
that are not (12-13 here), and every verification runs the kernel eight times.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from sparseditto import generate

UP = (256, 1024)


def _dense(A) -> torch.Tensor:
    return torch.tensor(A.to_dense(), dtype=torch.float16)


def block_weight(seed: int) -> torch.Tensor:
    return _dense(generate.block_sparse(*UP, (32, 32), 0.05, seed=seed, dtype="float16"))


def small_unstructured(m: int, k: int, seed: int) -> torch.Tensor:
    return _dense(generate.magnitude_pruned(m, k, 0.7, seed=seed, dtype="float32"))


def llama_like(up_seeds=(0, 1)) -> dict[str, torch.Tensor]:
    """layers.{0,1}.mlp.up (block-sparse, one group), layers.2.mlp.up (layer 0's structure, other
    values), layers.0.attn.q (small: dense wins), a norm (1-D) and a dense embedding."""
    t = {f"layers.{i}.mlp.up.weight": block_weight(s) for i, s in enumerate(up_seeds)}
    t["layers.2.mlp.up.weight"] = t["layers.0.mlp.up.weight"] * 0.5
    t["layers.0.attn.q.weight"] = small_unstructured(64, 64, 3)
    t["norm.weight"] = torch.ones(64, dtype=torch.float16)
    t["embed.weight"] = torch.randn(32, 64, generator=torch.Generator().manual_seed(0)).half()
    return t


def save_shards(tensors: dict[str, torch.Tensor], folder: Path) -> Path:
    """Two safetensors shards and their index json, as Hugging Face writes them."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    names = list(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    weight_map = {}
    for shard, keys in shards.items():
        save_file({k: tensors[k].contiguous() for k in keys}, str(folder / shard))
        weight_map.update({k: shard for k in keys})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(UP[1], UP[0], bias=True)


class Attn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(64, 64, bias=False)


class Layer(torch.nn.Module):
    def __init__(self, attn: bool):
        super().__init__()
        self.mlp = Block()
        if attn:
            self.attn = Attn()


class TinyModel(torch.nn.Module):
    """Module names that match `llama_like`'s tensor names; forward runs every up projection."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([Layer(attn=i == 0) for i in range(3)])

    def forward(self, x):
        return torch.stack([layer.mlp.up(x) for layer in self.layers])


def tiny_model(tensors: dict[str, torch.Tensor]) -> TinyModel:
    model = TinyModel().half()
    state = model.state_dict()
    state.update({k: v for k, v in tensors.items() if k in state})
    for i in range(3):
        state[f"layers.{i}.mlp.up.bias"] = torch.linspace(-0.1, 0.1, UP[0]).half()
    model.load_state_dict(state)
    return model.eval()


def sleepy_group_task(model_path, *args, **kwargs):
    """A stand-in for workers.group_task that takes a minute: the interrupted-driver test (it touches
    ``model_path`` first, so the test knows the job is running)."""
    import time

    Path(model_path).touch()
    time.sleep(60)
    return [], {}
