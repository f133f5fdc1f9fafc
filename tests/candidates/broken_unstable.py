"""Broken: correct to within the fp16 tolerance on every single run, but adds fresh random noise
(0.6 x the verifier's rtol, times |A| @ |B|) on each call, so two runs on the same inputs disagree."""
import numpy as np
import torch


def prepare(A, dtype, device):
    return {
        "rows": torch.from_numpy(A.row_ids()).to(device),
        "cols": torch.from_numpy(A.indices.astype(np.int64)).to(device),
        "values": torch.from_numpy(A.data).to(device=device, dtype=dtype).float(),
        "m": A.shape[0],
    }


def spmm(packed, B, out):
    shape = (packed["m"], B.shape[1])
    gathered = B[packed["cols"]].float()
    acc = torch.zeros(shape, dtype=torch.float32, device=B.device)
    acc.index_add_(0, packed["rows"], packed["values"][:, None] * gathered)
    bound = torch.zeros(shape, dtype=torch.float32, device=B.device)
    bound.index_add_(0, packed["rows"], packed["values"].abs()[:, None] * gathered.abs())
    sign = torch.randint(0, 2, shape, device=B.device).float() * 2.0 - 1.0
    out.copy_(acc + sign * (0.6 * 2.0 ** -9) * bound)
