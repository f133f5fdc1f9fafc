"""B's tensor map for tc_sp24tma: the descriptor Hopper's copy engine (TMA) reads to copy a box of B
into shared memory already swizzled for the tensor cores.

Why its own module: the map is made on the host by the CUDA driver (cuTensorMapEncodeTiled, reached
through ctypes: CuPy does not wrap it), from a layout that is pure arithmetic. The arithmetic
(`b_map_layout`) is tested on the CPU against the kernel's row permutation; `encode` only hands it
to the driver. A map holds B's address, so it is made per B buffer (tc_launch caches a few).

The layout views B [K, N] (row stride ldb elements) as a 3-D tensor {N, 16, K / 16}: element
(n, r, t) is B[16 t + r, n]. A box {W, 4, 4} at (n0, 4q, k0 / 16) then copies rows k0 + 16 tt + 4q + p
(tt, p < 4) into 16 consecutive rows of W columns, in (tt, p) order: the physical rows 16q .. 16q + 15
that tc_stream.cu's phys_row_sp gives those logical rows of a 64-row chunk. Four boxes fill a chunk's
64-column block; the swizzle mode is the one WgB's descriptor names for W columns (128 bytes: 128B).
"""
from __future__ import annotations

import ctypes
from functools import lru_cache

import numpy as np

MAP_BYTES = 128
BOX_ROWS = 4                      # rows per 4-row group of the K permutation
BOX_GROUPS = 4                    # 16-row periods per box
SWIZZLE_BY_ROW_BYTES = {64: 2, 128: 3}     # CU_TENSOR_MAP_SWIZZLE_64B / _128B
DATA_TYPE_UINT16 = 1              # CU_TENSOR_MAP_DATA_TYPE_UINT16 (fp16 and bf16 move as 16-bit words)
INTERLEAVE_NONE = 0
L2_PROMOTION_128B = 2
OOB_FILL_ZEROS = 0                # CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE: rows past K, columns past N read 0


def k_fits(k: int) -> bool:
    """K a multiple of 16: the map's 16-row periods must not run past B (what prepare can know)."""
    return k % 16 == 0


def tma_ready(k: int, ldb: int, b_ptr: int, col_stride: int = 1) -> bool:
    """Whether a B of K rows at `b_ptr` with row stride `ldb` elements can be read by the tensor map:
    `k_fits`, rows 16-byte aligned (ldb a multiple of 8, the pointer of 16), unit column stride."""
    return k_fits(k) and ldb % 8 == 0 and b_ptr % 16 == 0 and col_stride == 1


def b_map_layout(n: int, k: int, ldb: int, box_cols: int) -> dict:
    """globalDim, globalStrides (bytes, dims 1 and 2), boxDim and swizzle of B's 3-D view."""
    if not k_fits(k) or ldb % 8:
        raise ValueError(f"B's tensor map needs K a multiple of 16 and ldb a multiple of 8, got K = {k}, ldb = {ldb}.")
    row_bytes = 2 * box_cols
    if row_bytes not in SWIZZLE_BY_ROW_BYTES:
        raise ValueError(f"B's tensor map boxes are 32 or 64 columns wide, got {box_cols}.")
    return {"dims": (n, 16, k // 16), "strides": (2 * ldb, 32 * ldb),
            "box": (box_cols, BOX_ROWS, BOX_GROUPS), "swizzle": SWIZZLE_BY_ROW_BYTES[row_bytes]}


def logical_rows(layout: dict, k0: int, q: int) -> list[int]:
    """The B rows, in shared-memory order, that the box at (0, 4q, k0 / 16) copies (for tests)."""
    _, rows, groups = layout["box"]
    return [k0 + 16 * tt + 4 * q + p for tt in range(groups) for p in range(rows)]


@lru_cache(maxsize=1)
def _encoder():
    lib = ctypes.CDLL("libcuda.so.1")
    fn = lib.cuTensorMapEncodeTiled
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                   ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                   ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
                   ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return fn


def encode(b_ptr: int, n: int, k: int, ldb: int, box_cols: int) -> np.ndarray:
    """The 128-byte CUtensorMap for B at `b_ptr`, as a one-element NumPy array of 128-byte voids,
    which a CuPy launch passes by value (the kernel's `const __grid_constant__ TensorMap`).
    RuntimeError with the driver's code when it refuses the layout."""
    lay = b_map_layout(n, k, ldb, box_cols)
    buf = np.zeros(MAP_BYTES + 64, dtype=np.uint8)            # the driver wants 64-byte alignment
    at = (-buf.ctypes.data) % 64
    dims = (ctypes.c_uint64 * 3)(*lay["dims"])
    strides = (ctypes.c_uint64 * 2)(*lay["strides"])
    box = (ctypes.c_uint32 * 3)(*lay["box"])
    ones = (ctypes.c_uint32 * 3)(1, 1, 1)
    err = _encoder()(ctypes.c_void_p(buf.ctypes.data + at), DATA_TYPE_UINT16, 3, ctypes.c_void_p(b_ptr),
                     dims, strides, box, ones, INTERLEAVE_NONE, lay["swizzle"], L2_PROMOTION_128B, OOB_FILL_ZEROS)
    if err:
        raise RuntimeError(f"cuTensorMapEncodeTiled refused B's map (CUresult {err}): N = {n}, K = {k}, "
                           f"ldb = {ldb}, box {lay['box']}.")
    return np.frombuffer(buf[at:at + MAP_BYTES].tobytes(), dtype=np.dtype((np.void, MAP_BYTES))).copy()
