"""Cheat: the @ operator on tensors is cuBLAS too."""
import torch


def prepare(A, dtype, device):
    return {"dense": torch.from_numpy(A.to_dense()).to(device=device, dtype=dtype)}


def spmm(packed, B, out):
    out.copy_(packed["dense"] @ B)
