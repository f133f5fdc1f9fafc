"""Unstructured SpMM at decode widths that keeps or drops whole tensor-core fragment words.

Why this template exists: the bitmap and scatter kernels (tc_lanemask, tc_scatter) expand kept
values into mma fragments through shared memory and spend 300-450 warp instructions per 16x64 block
doing it, so on the H200 they stay below cuBLAS at 50-70% sparsity (0.64-0.98x at N = 8-16) however
few bytes they read. A lane's A fragment is 16 32-bit words (tc_dense's registers), each holding two
neighbouring values of one row; at 70% unstructured sparsity half of those words are all zero. This
format stores only the nonzero words, register-major (word j of every lane that keeps it, lanes in
order), with a 16-bit mask per lane, so a warp fills register j with one coalesced, predicated load
at an address from a ballot and two popcounts: no shared memory, no scatter, no zeroing, ~12
instructions per register whatever the sparsity. Bytes: 4 per kept word, 1.28 / 1.84 / 4.5x fewer
than dense at 50 / 70 / 90% random sparsity (cost.kept_words); per-row magnitude pruning keeps
words like random placement does.

Layout (sparseditto.tc_formats.TCWords) and the kernel (tc_words in tc_stream.cu): tc_dense's
skeleton (stream_registers: a warp per 16-row tile and K slice, PIPE - 1 chunks of registers in
flight, B's K slice staged in shared memory, split-K over a thread-block cluster with the
deterministic DSMEM reduction), with a per-chunk head (the lane's mask and the block's first word)
loaded one pipeline step ahead of the words.
"""
META = {
    "name": "tc_words",
    "backend": "cuda",
    "format": "tc_words",
    "description": "kept 32-bit fragment words loaded straight into mma.sync registers (ballot + popc addressing), "
                   "split-K over a CTA cluster",
    "params": {"WARPS": [4, 8, 16], "R": [1, 2], "SPLIT": ["auto", 1, 2, 4, 8], "PIPE": [2, 3, 4],
               "BRING": ["auto", 0, 2, 3, 4], "MINB": [0, 2, 3, 4]},
    # tc_dense's defaults (the same skeleton); not yet tuned on a GPU
    "defaults": {"WARPS": 8, "R": 1, "SPLIT": "auto", "PIPE": 2, "BRING": "auto", "MINB": 0},
    "grid": [{}, {"PIPE": 3}, {"WARPS": 4}],
    "patterns": ["unstructured", "nm", "block", "row_pruned", "column_pruned", "banded"],
    "cuda_source": "tc_stream.cu",
    "dtypes": ["float16", "bfloat16"],
}
PARAMS = dict(META["defaults"])

CUDA_SRC = r"""@SPARSEDITTO_INLINE tc_stream.cu@"""

from sparseditto.kernel_templates.tc_launch import launch, prepare_format
from sparseditto.tc_formats import TCWords


def prepare(A, dtype, device) -> dict:
    """The kept fragment words, lane masks and block offsets on `device`, and the compiled kernels."""
    return prepare_format("words", TCWords, A, dtype, device, PARAMS, CUDA_SRC)


def spmm(packed: dict, B, out) -> None:
    """out = A @ B: one launch (B [K, N] fp16/bf16 on the GPU)."""
    launch(packed, B, out)
