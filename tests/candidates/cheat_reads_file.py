"""Cheat: read a precomputed answer from disk."""
import torch


def prepare(A, dtype, device):
    with open("/tmp/sparseditto_reference.bin", "rb") as fh:
        blob = fh.read()
    return {"blob": blob}


def spmm(packed, B, out):
    out.copy_(torch.frombuffer(packed["blob"], dtype=out.dtype).view_as(out))
