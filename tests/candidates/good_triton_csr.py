"""Correct test candidate: CSR SpMM in Triton, one program per (row, N-tile), a loop over the row's
nonzeros with fp32 accumulation. Deliberately simple; it exists to exercise the harness."""
import torch
import triton
import triton.language as tl


@triton.jit
def _csr_row_kernel(indptr_ptr, indices_ptr, values_ptr, b_ptr, out_ptr, N,
                    stride_bk, stride_bn, stride_om, stride_on, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    pid_n = tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    start = tl.load(indptr_ptr + row)
    end = tl.load(indptr_ptr + row + 1)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j in range(start, end):
        k = tl.load(indices_ptr + j).to(tl.int64)
        a = tl.load(values_ptr + j).to(tl.float32)
        b = tl.load(b_ptr + k * stride_bk + cols * stride_bn, mask=mask, other=0.0)
        acc += a * b.to(tl.float32)
    tl.store(out_ptr + row * stride_om + cols * stride_on,
             acc.to(out_ptr.dtype.element_ty), mask=mask)


def prepare(A, dtype, device):
    return {
        "indptr": torch.from_numpy(A.indptr).to(device),
        "indices": torch.from_numpy(A.indices).to(device),
        "values": torch.from_numpy(A.data).to(device=device, dtype=dtype),
        "rows": A.shape[0],
    }


def spmm(packed, B, out):
    n = B.shape[1]
    block_n = min(64, max(16, triton.next_power_of_2(n)))
    grid = (packed["rows"], triton.cdiv(n, block_n))
    _csr_row_kernel[grid](packed["indptr"], packed["indices"], packed["values"], B, out, n,
                          B.stride(0), B.stride(1), out.stride(0), out.stride(1), BLOCK_N=block_n)
