"""Broken: an off-by-one in the row loop of a Triton CSR kernel drops each row's last nonzero."""
import torch
import triton
import triton.language as tl


@triton.jit
def _kernel(indptr_ptr, indices_ptr, values_ptr, b_ptr, out_ptr, N,
            stride_bk, stride_om, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    start = tl.load(indptr_ptr + row)
    end = tl.load(indptr_ptr + row + 1)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j in range(start, end - 1):
        k = tl.load(indices_ptr + j).to(tl.int64)
        a = tl.load(values_ptr + j).to(tl.float32)
        acc += a * tl.load(b_ptr + k * stride_bk + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_om + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


def prepare(A, dtype, device):
    return {
        "indptr": torch.from_numpy(A.indptr).to(device),
        "indices": torch.from_numpy(A.indices).to(device),
        "values": torch.from_numpy(A.data).to(device=device, dtype=dtype),
        "rows": A.shape[0],
    }


def spmm(packed, B, out):
    n = B.shape[1]
    block_n = max(16, triton.next_power_of_2(n))
    _kernel[(packed["rows"],)](packed["indptr"], packed["indices"], packed["values"], B, out, n,
                              B.stride(0), out.stride(0), BLOCK_N=block_n)
