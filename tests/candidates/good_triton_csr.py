"""Correct test candidate: CSR SpMM in Triton, one program per (row, N-tile); the program loops over
its row's nonzeros in chunks of BLOCK_NNZ, gathers the matching rows of B and accumulates in fp32.
Deliberately simple; it exists to exercise the harness."""
import torch
import triton
import triton.language as tl


@triton.jit
def _csr_row_kernel(indptr_ptr, indices_ptr, values_ptr, b_ptr, out_ptr, N,
                    stride_bk, stride_bn, stride_om, stride_on,
                    BLOCK_N: tl.constexpr, BLOCK_NNZ: tl.constexpr):
    row = tl.program_id(0)
    pid_n = tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    lanes = tl.arange(0, BLOCK_NNZ)
    start = tl.load(indptr_ptr + row)
    end = tl.load(indptr_ptr + row + 1)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j0 in range(start, end, BLOCK_NNZ):
        offs = j0 + lanes
        live = offs < end
        k = tl.load(indices_ptr + offs, mask=live, other=0).to(tl.int64)
        a = tl.load(values_ptr + offs, mask=live, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + k[:, None] * stride_bk + cols[None, :] * stride_bn,
                    mask=live[:, None] & col_ok[None, :], other=0.0)
        acc += tl.sum(a[:, None] * b.to(tl.float32), axis=0)
    tl.store(out_ptr + row * stride_om + cols * stride_on,
             acc.to(out_ptr.dtype.element_ty), mask=col_ok)


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
                          B.stride(0), B.stride(1), out.stride(0), out.stride(1),
                          BLOCK_N=block_n, BLOCK_NNZ=16)
