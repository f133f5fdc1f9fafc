"""Broken: an unmasked Triton load far outside the buffer. On a GPU this is an illegal memory
access that poisons the CUDA context; in the interpreter it is a segfault. Passes static checks."""
import torch
import triton
import triton.language as tl


@triton.jit
def _kernel(values_ptr, out_ptr):
    v = tl.load(values_ptr + 1099511627776)
    tl.store(out_ptr, v)


def prepare(A, dtype, device):
    return {"values": torch.from_numpy(A.data).to(device=device, dtype=dtype)}


def spmm(packed, B, out):
    _kernel[(1,)](packed["values"], out)
