"""Storage formats of the tensor-core streaming kernels (kernel_templates/cuda/tc_stream.cu).

Why separate formats: these kernels read A straight into mma.sync / mma.sp fragments, so the
layout is dictated by the fragment a lane owns, not by rows and columns. Inside every 64-column
chunk the K dimension is permuted so that lane (g, t) of a warp owns rows g and g+8 of a 16-row tile
and the 16 consecutive columns 16t..16t+15 of the chunk; the kernels apply the same permutation to
B's rows. The packers below build exactly the bytes the kernels read, vectorized over all nonzeros
(O(nnz log nnz) for the bitmap's reorder, O(nnz) otherwise), and the `to_dense` decoders walk the
packed bytes the way the kernels do (header fields, ranks, the hardware's 2:4 metadata layout), so
a CPU round trip proves the layout, not just the numpy that built it.

  TCDense   the weight padded to [Mp, Kp] (Mp a multiple of 16, Kp of 64), 2 bytes per element,
            in fragment order: per (tile, chunk) 2 KiB, lane L's 16-byte piece i at i*512 + 16L.
  TCSparse24  2:4 values (positions ascending within each group of 4), fragment order, and metadata
            words in the mma.sp.m16n8k32 layout, ordered [tile][chunk][g][t][s] so a lane reads its
            two words with one 8-byte load.
  TCBitmap  per (16-row tile, 64-column chunk) a blob: a 176-byte header (the octet masks W[g][s],
            the lane ranks P[g][s], the step value offsets cum[s], the blob's size) and the kept
            values in fragment order; 2 bytes per kept value + 1.375 bits per element.
  TCLaneMask  per (tile, chunk) a blob: lane L's u32 mask of its 32 elements (128 bytes) and the
            kept values in TCBitmap's order (step, lane, row half, column); 2 bytes per kept value +
            1 bit per element (+ 16-byte padding).
  TCScatter per (tile, chunk) a blob: 4 step counts (8 bytes), the kept values and one position
            byte per value (its half in the step's fragment region); 3 bytes per kept value.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sparseditto.matrix import SparseMatrix

TILE_M = 16
CHUNK_K = 64
BITMAP_HEADER = 176          # W: 128 bytes, P: 32 bytes, cum: 4 x u16, the blob's size: u32, 4 spare
LANEMASK_WORDS = 128         # tc_lanemask: 32 lanes x one u32 mask word per blob
LANEMASK_OVERREAD = 4        # bytes a lane's last quad may read past the blob's last value
SP24_META_BYTES_PER_CHUNK = 8 * 2 * 2 * 4   # [g][t][s] u32 words per (tile, chunk)
VALUE_DTYPES = ("float16", "bfloat16")


def _check(A) -> SparseMatrix:
    if not isinstance(A, SparseMatrix):
        raise ValueError(f"Expected a sparseditto.matrix.SparseMatrix, got {type(A).__name__}; "
                         "convert with sparseditto.io.load_matrix first.")
    return A


def padded_shape(shape) -> tuple[int, int]:
    """(Mp, Kp): rows rounded up to a 16-row tile, columns to a 64-column chunk."""
    m, k = (int(x) for x in shape)
    return -(-m // TILE_M) * TILE_M, -(-k // CHUNK_K) * CHUNK_K


def value_bits(values: np.ndarray, dtype: str) -> np.ndarray:
    """fp32/fp64 values -> their fp16 or bf16 bit patterns as uint16 (round to nearest even)."""
    if dtype == "float16":
        return np.asarray(values, dtype=np.float32).astype(np.float16).view(np.uint16)
    if dtype == "bfloat16":
        import torch

        t = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).to(torch.bfloat16)
        return t.view(torch.int16).numpy().view(np.uint16)
    raise ValueError(f"The tensor-core formats hold float16 or bfloat16 values, got {dtype!r}.")


def bits_to_float(bits: np.ndarray, dtype: str) -> np.ndarray:
    """uint16 fp16/bf16 bit patterns -> float64 (the inverse of `value_bits`)."""
    bits = np.asarray(bits, dtype=np.uint16)
    if dtype == "float16":
        return bits.view(np.float16).astype(np.float64)
    if dtype == "bfloat16":
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    raise ValueError(f"The tensor-core formats hold float16 or bfloat16 values, got {dtype!r}.")


def _coords(A: SparseMatrix) -> tuple[np.ndarray, np.ndarray]:
    return A.row_ids().astype(np.int64), A.indices.astype(np.int64)


# ---- dense ------------------------------------------------------------------------------------

def _fragment_order(block: np.ndarray, tiles: int, chunks: int, cols: int) -> np.ndarray:
    """[Mp, chunks*cols] -> [tiles, chunks, piece, lane, 8]: piece i = 2*h + q holds row 8h + g of the
    tile and the lane's q-th 8 columns (lane (g, t) owns columns t*2*8 .. of each chunk); each
    kernel load of 16 bytes by 32 lanes then reads 512 contiguous bytes."""
    q = cols // 32                     # 16-byte pieces per lane and row: 2 (dense), 1 (2:4 values)
    v = block.reshape(tiles, 2, 8, chunks, 4, q, 8)          # tile, h, g, chunk, t, q, e
    v = v.transpose(0, 3, 1, 5, 2, 4, 6)                      # tile, chunk, h, q, g, t, e
    return np.ascontiguousarray(v).reshape(tiles, chunks, 2 * q, 32, 8)


def _natural_order(frag: np.ndarray, cols: int) -> np.ndarray:
    """The inverse of `_fragment_order`: [tiles, chunks, piece, lane, 8] -> [Mp, chunks*cols]."""
    tiles, chunks = frag.shape[:2]
    q = cols // 32
    v = frag.reshape(tiles, chunks, 2, q, 8, 4, 8).transpose(0, 2, 4, 1, 5, 3, 6)   # tile, h, g, chunk, t, q, e
    return v.reshape(tiles * 16, chunks * cols)


@dataclass(frozen=True, eq=False)
class TCDense:
    """The weight padded to [Mp, Kp] and stored in fragment order, 2 KiB per (tile, chunk)."""

    shape: tuple[int, int]
    frag: np.ndarray          # uint16 [tiles, chunks, 4, 32, 8]
    dtype: str

    @classmethod
    def from_matrix(cls, A: SparseMatrix, dtype: str = "float16") -> "TCDense":
        A = _check(A)
        mp, kp = padded_shape(A.shape)
        out = np.zeros((mp, kp), dtype=np.uint16)
        rows, cols = _coords(A)
        out[rows, cols] = value_bits(A.data, dtype)
        return cls(tuple(A.shape), _fragment_order(out, mp // TILE_M, kp // CHUNK_K, CHUNK_K), dtype)

    def to_dense(self) -> np.ndarray:
        m, k = self.shape
        return bits_to_float(_natural_order(self.frag, CHUNK_K), self.dtype)[:m, :k]

    def nbytes(self) -> int:
        return int(self.frag.nbytes)

    def kernel_arrays(self) -> tuple[int, int, dict]:
        """(row tiles, K chunks, the arrays tc_dense reads, flat, in its argument order)."""
        return self.frag.shape[0], self.frag.shape[1], {"a": self.frag.reshape(-1).view("int16")}


# ---- 2:4 on the sparse tensor cores -------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class TCSparse24:
    """Exact 2:4 storage for mma.sp: every group of 4 columns (along K) keeps at most 2 values."""

    shape: tuple[int, int]
    values: np.ndarray        # uint16 [tiles, chunks, 2, 32, 8]: kept values in fragment order
    meta: np.ndarray          # uint32 [tiles, chunks, 8, 2, 2]
    dtype: str

    @classmethod
    def from_matrix(cls, A: SparseMatrix, dtype: str = "float16") -> "TCSparse24":
        A = _check(A)
        mp, kp = padded_shape(A.shape)
        groups_per_row = kp // 4
        rows, cols = _coords(A)
        gid = rows * groups_per_row + cols // 4
        counts = np.bincount(gid, minlength=mp * groups_per_row)
        if counts.size and counts.max() > 2:
            worst = int(np.argmax(counts))
            r, g = divmod(worst, groups_per_row)
            raise ValueError(f"Not 2:4 structured: row {r}, columns {4 * g}..{4 * g + 3} hold {int(counts[worst])} "
                             "nonzeros (at most 2 of every 4 consecutive columns may be kept).")
        # Rank of each entry within its group: CSR order is ascending within a row, so gid never
        # decreases and an entry is its group's second exactly when its predecessor shares the group.
        rank = np.zeros(gid.size, dtype=np.int64)
        if gid.size > 1:
            rank[1:] = gid[1:] == gid[:-1]
        vbits = value_bits(A.data, dtype)
        idx = np.empty((counts.size, 2), dtype=np.uint32)
        idx[:, 0], idx[:, 1] = 0, 1                      # empty groups: positions (0, 1), zero values
        vals = np.zeros((counts.size, 2), dtype=np.uint16)
        # Every entry to slot `rank` of its group (one flat scatter, no masks over all nonzeros: on
        # an 11008x4096 2:4 weight the masked form took 1.1 of the pack's 1.6 s), then the groups
        # that kept one value are fixed up: a lone value at position p is stored as (p, 3) with a
        # zero second slot, or as (2, 3) with the value second when p == 3.
        slot = 2 * gid + rank
        idx.reshape(-1)[slot] = cols % 4
        vals.reshape(-1)[slot] = vbits
        g1 = np.flatnonzero(counts == 1)
        if g1.size:
            p1, v1 = idx[g1, 0].copy(), vals[g1, 0].copy()
            last = p1 == 3
            idx[g1, 0] = np.where(last, 2, p1)
            idx[g1, 1] = 3
            vals[g1, 0] = np.where(last, 0, v1)
            vals[g1, 1] = np.where(last, v1, 0)
        nib = (idx[:, 0] | (idx[:, 1] << 2)).reshape(mp // TILE_M, 2, 8, kp // CHUNK_K, 4, 2, 2)
        # axes: tile, h (row g or g+8), g, chunk, tt (4-bit field), s (k32 step), t (lane half)
        shifts = (4 * np.arange(4, dtype=np.uint32)).reshape(1, 1, 1, 1, 4, 1, 1)
        half_words = np.bitwise_or.reduce(nib << shifts, axis=4)          # tile, h, g, chunk, s, t
        words = half_words[:, 0] | (half_words[:, 1] << np.uint32(16))    # tile, g, chunk, s, t
        meta = np.ascontiguousarray(words.transpose(0, 2, 1, 4, 3))        # tile, chunk, g, t, s
        frag = _fragment_order(vals.reshape(mp, kp // 2), mp // TILE_M, kp // CHUNK_K, CHUNK_K // 2)
        return cls(tuple(A.shape), frag, meta.astype(np.uint32), dtype)

    def nbytes(self) -> int:
        return int(self.values.nbytes + self.meta.nbytes)

    def kernel_arrays(self) -> tuple[int, int, dict]:
        """(row tiles, K chunks, the arrays tc_sp24 reads, flat, in its argument order)."""
        return self.meta.shape[0], self.meta.shape[1], {"values": self.values.reshape(-1).view("int16"),
                                                        "meta": self.meta.reshape(-1).view("int32")}

    def to_dense(self) -> np.ndarray:
        """Decode through the mma.sp.m16n8k32 metadata layout, the way the tensor cores read it."""
        tiles, chunks = self.meta.shape[:2]
        mp, kp = tiles * TILE_M, chunks * CHUNK_K
        out = np.zeros((mp, kp), dtype=np.float64)
        vals = bits_to_float(_natural_order(self.values, CHUNK_K // 2), self.dtype)
        for tile in range(tiles):
            for c in range(chunks):
                for g in range(8):
                    for t in range(2):
                        for s in range(2):
                            word = int(self.meta[tile, c, g, t, s])
                            for h in range(2):
                                row = tile * 16 + 8 * h + g
                                for tt in range(4):
                                    nib = (word >> (16 * h + 4 * tt)) & 15
                                    group = c * 16 + 4 * tt + 2 * s + t       # logical group of 4
                                    for q, p in enumerate((nib & 3, nib >> 2)):
                                        out[row, 4 * group + p] += vals[row, 2 * group + q]
        m, k = self.shape
        return out[:m, :k]


# ---- bitmap in fragment order -----------------------------------------------------------------

def fragment_key(rows: np.ndarray, cols: np.ndarray, chunks: int) -> np.ndarray:
    """Position of element (row, col) in the bitmap kernels' value order: blob (tile, chunk), then
    step s, lane (g, t), row half h, column j within the lane's quad."""
    # shifts and masks, not divmod: the tile sizes are powers of two and this runs over every nonzero
    rows, cols = np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)
    h, g = (rows >> 3) & 1, rows & 7
    t, s, j = (cols >> 4) & 3, (cols >> 2) & 3, cols & 3
    within = (s << 8) | (g << 5) | (t << 3) | (h << 2) | j
    return (((rows >> 4) * chunks + (cols >> 6)) << 10) | within


def largest_run(starts: np.ndarray, k: int) -> int:
    """The largest span, in the offsets' units, of `k` consecutive blobs of one row of `starts` [rows,
    blobs + 1] (each entry a blob's start, the last the row's end), from any first blob (fewer at a
    row's end), 0 for none: what a ring slot, a bulk copy or a stage must hold wherever a K slice starts."""
    starts = np.asarray(starts, dtype=np.int64)
    n = starts.shape[1] - 1
    ends = np.minimum(np.arange(n) + k, n)
    return int((starts[:, ends] - starts[:, :n]).max(initial=0))


@dataclass(frozen=True, eq=False)
class _BlobFormat:
    """A blob per (16-row tile, 64-column chunk), each 16-byte aligned, back to back, and their
    offsets: what the bitmap kernels (tc_bitmap, tc_lanemask) stream."""

    shape: tuple[int, int]
    blobs: np.ndarray         # uint8, all blobs back to back, each 16-byte aligned
    offsets: np.ndarray       # uint32 [tiles, chunks + 1], blob starts in 16-byte units
    dtype: str

    def nbytes(self) -> int:
        return int(self.blobs.nbytes + self.offsets.nbytes)

    def slot_bytes(self) -> int:
        """Bytes of one ring slot: the largest blob (16-byte units, as the kernel copies them)."""
        return max(1, largest_run(self.offsets, 1)) * 16

    def kernel_arrays(self) -> tuple[int, int, dict]:
        """(row tiles, K chunks, the arrays the kernel reads, flat, in its argument order)."""
        tiles, chunks1 = self.offsets.shape
        return tiles, chunks1 - 1, {"blobs": self.blobs, "offsets": self.offsets.reshape(-1).view("int32")}

    def _walk(self):
        """(a zero [Mp, Kp] float64 array, and per blob (tile, chunk, first byte, end byte)): what
        every decoder walks."""
        mp, kp = padded_shape(self.shape)
        return np.zeros((mp, kp), dtype=np.float64), self._spans(mp // TILE_M, kp // CHUNK_K)

    def _spans(self, tiles: int, chunks: int) -> list:
        """Per blob (tile, chunk, first byte, end byte), from the [tiles, chunks + 1] offsets."""
        flat = self.offsets.reshape(-1).astype(np.int64) * 16
        return [(tile, c, int(flat[tile * (chunks + 1) + c]), int(flat[tile * (chunks + 1) + c + 1]))
                for tile in range(tiles) for c in range(chunks)]


def blob_grid(A: SparseMatrix) -> tuple[SparseMatrix, int, int, np.ndarray, np.ndarray]:
    """(the checked matrix, row tiles, K chunks, its rows and columns): where every blob format's
    packing starts."""
    A = _check(A)
    mp, kp = padded_shape(A.shape)
    rows, cols = _coords(A)
    return A, mp // TILE_M, kp // CHUNK_K, rows, cols


def blob_offsets(starts: np.ndarray, tiles: int, chunks: int) -> np.ndarray:
    """[tiles, chunks + 1] uint32 from the blobs' starts (16-byte units, one past the last at the
    end): entry chunks of a tile is the end of its last blob. ValueError past 32-bit offsets."""
    if starts[-1] > np.iinfo(np.uint32).max:
        raise ValueError("The bitmap blobs exceed 64 GiB; the kernels address them with 32-bit offsets.")
    offsets = np.empty((tiles, chunks + 1), dtype=np.int64)
    offsets[:, :chunks] = starts[:-1].reshape(tiles, chunks)
    offsets[:, chunks] = starts[1:].reshape(tiles, chunks)[:, -1]
    return offsets.astype(np.uint32)


@dataclass(frozen=True, eq=False)
class TCBitmap(_BlobFormat):
    """Blobs per (tile, chunk): header + kept values in fragment order (see the module docstring)."""

    @classmethod
    def from_matrix(cls, A: SparseMatrix, dtype: str = "float16") -> "TCBitmap":
        A, tiles, chunks, rows, cols = blob_grid(A)
        key = fragment_key(rows, cols, chunks)
        order = np.argsort(key, kind="stable")
        key = key[order]
        vbits = value_bits(A.data, dtype)[order]
        blob = key >> 10                                  # tile * chunks + chunk
        within = key & 1023
        octet_id = blob * 128 + (within >> 3)             # (blob, s, g, t): 4 * 32 octets per blob
        nb = tiles * chunks
        octets = np.bincount(octet_id, weights=(1 << (within & 7)).astype(np.float64),
                             minlength=nb * 128).astype(np.uint32).reshape(nb, 4, 8, 4)   # blob, s, g, t
        counts = np.bincount(octet_id, minlength=nb * 128).reshape(nb, 4, 8, 4)
        W = np.zeros((nb, 8, 4), dtype=np.uint32)                                      # blob, g, s
        for t in range(4):
            W |= octets[:, :, :, t].transpose(0, 2, 1) << np.uint32(8 * t)
        per_g = counts.sum(axis=3)                                                     # blob, s, g
        P = np.zeros((nb, 8, 4), dtype=np.uint8)
        P[:, 1:, :] = np.cumsum(per_g, axis=2)[:, :, :-1].transpose(0, 2, 1)
        totals = per_g.sum(axis=2)                                                     # blob, s
        cum = np.zeros((nb, 4), dtype=np.uint16)
        cum[:, 1:] = np.cumsum(totals, axis=1)[:, :-1]
        nvals = totals.sum(axis=1)
        sizes = (BITMAP_HEADER + 2 * nvals + 15) // 16                                 # 16-byte units
        starts = np.zeros(nb + 1, dtype=np.int64)
        np.cumsum(sizes, out=starts[1:])
        buf = np.zeros(int(starts[-1]) * 16, dtype=np.uint8)
        header = np.zeros((nb, BITMAP_HEADER), dtype=np.uint8)
        header[:, :128] = W.reshape(nb, 32).view(np.uint8).reshape(nb, 128)
        header[:, 128:160] = P.reshape(nb, 32)
        header[:, 160:168] = cum.view(np.uint8).reshape(nb, 8)
        header[:, 168:172] = (sizes * 16).astype(np.uint32).view(np.uint8).reshape(nb, 4)
        buf[(starts[:-1, None] * 16 + np.arange(BITMAP_HEADER)).ravel()] = header.ravel()
        first = np.zeros(nb + 1, dtype=np.int64)
        np.cumsum(nvals, out=first[1:])
        k = np.arange(key.size, dtype=np.int64)
        buf16 = buf.view(np.uint16)
        buf16[(starts[blob] * 16 + BITMAP_HEADER) // 2 + (k - first[blob])] = vbits
        return cls(tuple(A.shape), buf, blob_offsets(starts, tiles, chunks), dtype)

    def to_dense(self) -> np.ndarray:
        """Decode blob by blob through the header fields, exactly as tc_bitmap's lanes do."""
        out, blobs = self._walk()
        u16 = self.blobs.view(np.uint16)
        for tile, c, base, end in blobs:
            hdr = self.blobs[base:base + BITMAP_HEADER]
            W = hdr[:128].view(np.uint32).reshape(8, 4)
            P = hdr[128:160].reshape(8, 4)
            cum = hdr[160:168].view(np.uint16)
            size = int(hdr[168:172].view(np.uint32)[0])
            assert size == end - base, "header size field disagrees with the blob offsets"
            for s in range(4):
                vbase = (base + BITMAP_HEADER) // 2 + int(cum[s])
                for g in range(8):
                    for t in range(4):
                        octet = (int(W[g, s]) >> (8 * t)) & 0xFF
                        rank = (int(P[g, s]) if g else 0) + bin(int(W[g, s]) & ((1 << (8 * t)) - 1)).count("1")
                        for bit in range(8):
                            if octet >> bit & 1:
                                h, j = divmod(bit, 4)
                                row = tile * 16 + 8 * h + g
                                col = c * 64 + 16 * t + 4 * s + j
                                out[row, col] = bits_to_float(u16[vbase + rank], self.dtype)
                                rank += 1
        m, k = self.shape
        return out[:m, :k]


# The 16-entry table tc_bitmap decodes a quad with, and a model of that decode. `decode_quad_model`
# mirrors decode_quad() in tc_stream.cu (two zero-extended 16-bit loads per slot pair, PRMT with the
# table's selectors), so CPU tests check the table against the bitmap semantics.

def prmt(a: int, b: int, sel: int) -> int:
    """PTX prmt.b32 (default mode) on Python ints: result byte i = byte (sel nibble i) of b:a."""
    src = (a & 0xFFFFFFFF) | ((b & 0xFFFFFFFF) << 32)
    out = 0
    for i in range(4):
        nib = (sel >> (4 * i)) & 0xF
        if nib & 8:
            raise ValueError("sign-replicating selectors are not used by the tables")
        out |= ((src >> (8 * nib)) & 0xFF) << (8 * i)
    return out


def quad_table() -> np.ndarray:
    """[16, 2] uint32: (selA | offB << 16, selB | bytes << 16) per nibble, as lut_entry_x/y build it."""
    table = np.zeros((16, 2), dtype=np.uint32)
    for n in range(16):
        b = [(n >> i) & 1 for i in range(4)]
        s0 = 0x10 if b[0] else 0x32
        s1 = (0x54 if b[0] else 0x10) if b[1] else 0x32
        table[n, 0] = (s0 | (s1 << 8)) | ((2 * (b[0] + b[1])) << 16)
        s2 = 0x10 if b[2] else 0x32
        s3 = (0x54 if b[2] else 0x10) if b[3] else 0x32
        table[n, 1] = (s2 | (s3 << 8)) | ((2 * sum(b)) << 16)
    return table


def decode_quad_model(stream: np.ndarray, start: int, nibble: int) -> tuple[int, int, int]:
    """(register of slots 0/1, register of slots 2/3, next start) for a quad at half index `start`."""
    x, y = (int(v) for v in quad_table()[nibble])
    at = lambda i: int(stream[i]) if i < stream.size else 0xDEAD   # past the end: garbage, never selected
    lo = prmt(at(start), at(start + 1), x & 0xFFFF)
    mid = start + (x >> 16) // 2
    hi = prmt(at(mid), at(mid + 1), y & 0xFFFF)
    return lo, hi, start + (y >> 16) // 2


# ---- one mask word per lane (tc_lanemask) -----------------------------------------------------------

def lanemask_slots(rows: np.ndarray, cols: np.ndarray, chunks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(blob, lane, bit) of elements (row, col) in tc_lanemask's layout: lane (g, t) of blob
    (tile, chunk) owns rows g and g+8 of the tile and columns 16t..16t+15 of the chunk; bit i is row
    g's column 16t + i, bit 16 + i row g+8's."""
    rows, cols = np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)
    return (rows >> 4) * chunks + (cols >> 6), ((rows & 7) << 2) | ((cols >> 4) & 3), \
        (((rows >> 3) & 1) << 4) | (cols & 15)


def lanemask_counts(w: int) -> tuple[int, int]:
    """(y, own) as tc_lanemask computes them from a lane's mask word: y holds the kept values of each
    nibble (a SWAR popcount; nibble s = row g's quad of step s, nibble 4 + s = row g+8's), own one
    byte per step with the lane's kept values at that step (both row halves). A model of the
    kernel's arithmetic, so CPU tests check it."""
    w &= 0xFFFFFFFF
    x = (w - ((w >> 1) & 0x55555555)) & 0xFFFFFFFF
    y = (x & 0x33333333) + ((x >> 2) & 0x33333333)
    z = (y & 0xFFFF) + (y >> 16)
    own = (z & 0xF) | ((z & 0xF0) << 4) | ((z & 0xF00) << 8) | ((z & 0xF000) << 12)
    return y, own


def lanemask_ranks(words) -> tuple[list[int], list[int]]:
    """(excl, bases) as the kernel's warp scan leaves them: excl[L] = lane L's exclusive prefix of
    the packed per-step bytes, summed mod 2^32 in the kernel's order (Hillis-Steele, 5 rounds), and
    the steps' first values from lane 31's totals."""
    own = [lanemask_counts(int(w))[1] for w in words]
    incl = list(own)
    d = 1
    while d < 32:
        incl = [(incl[ln] + (incl[ln - d] if ln >= d else 0)) & 0xFFFFFFFF for ln in range(32)]
        d <<= 1
    excl = [(incl[ln] - own[ln]) & 0xFFFFFFFF for ln in range(32)]
    t = [((excl[31] >> (8 * s)) & 0xFF) + ((own[31] >> (8 * s)) & 0xFF) for s in range(3)]
    return excl, [0, t[0], t[0] + t[1], t[0] + t[1] + t[2]]


@dataclass(frozen=True, eq=False)
class TCLaneMask(_BlobFormat):
    """Blobs per (tile, chunk): 32 lane mask words + the kept values (module docstring).

    Why this layout: a lane's 32 elements (what it feeds the chunk's four m16n8k16 steps) are one
    mask word, so one warp scan of its per-step counts (a byte each) gives every lane its start in
    every step: no per-step headers (tc_bitmap's 176 bytes) and no chain between a chunk's quads.
    The values stay in tc_bitmap's step-major order: lane-major runs put a warp's gathers ~32 bytes
    apart per lane, 8-way shared-memory bank conflicts on the H200."""

    @classmethod
    def from_matrix(cls, A: SparseMatrix, dtype: str = "float16") -> "TCLaneMask":
        A, tiles, chunks, rows, cols = blob_grid(A)
        nb = tiles * chunks
        blob, lane, bit = lanemask_slots(rows, cols, chunks)
        # distinct powers of two up to 2^31 sum exactly in float64: the OR of each lane's bits
        words = np.bincount(blob * 32 + lane, weights=np.ldexp(1.0, bit), minlength=nb * 32).astype(np.uint32)
        nvals = np.bincount(blob, minlength=nb)
        # each value's place in the step, lane, half, column order: the count of nonzeros with a
        # smaller fragment key (keys are unique and dense in [0, nb * 1024): a prefix count, no sort)
        key = fragment_key(rows, cols, chunks)
        present = np.zeros(nb * 1024, dtype=np.int32)
        present[key] = 1
        np.cumsum(present, out=present)
        rank = present[key].astype(np.int64) - 1
        del present
        vbits = value_bits(A.data, dtype)
        sizes = (LANEMASK_WORDS + 2 * nvals + 15) // 16                                 # 16-byte units
        starts = np.zeros(nb + 1, dtype=np.int64)
        np.cumsum(sizes, out=starts[1:])
        offsets = blob_offsets(starts, tiles, chunks)
        buf = np.zeros(int(starts[-1]) * 16, dtype=np.uint8)
        buf32 = buf.view(np.uint32)
        buf32[(starts[:-1, None] * 4 + np.arange(32)).ravel()] = words
        first = np.zeros(nb + 1, dtype=np.int64)
        np.cumsum(nvals, out=first[1:])
        buf.view(np.uint16)[(starts[blob] * 16 + LANEMASK_WORDS) // 2 + (rank - first[blob])] = vbits
        return cls(tuple(A.shape), buf, offsets, dtype)

    def slot_bytes(self) -> int:
        """Bytes of one ring slot of the kernel: the largest blob plus room for the last quad's
        over-read, in 16-byte units (the kernel copies whole 16-byte pieces)."""
        sizes = np.diff(self.offsets.astype(np.int64), axis=1)
        return int(sizes.max(initial=LANEMASK_WORDS // 16)) * 16 + 16

    def to_dense(self) -> np.ndarray:
        """Decode blob by blob the way tc_lanemask's lanes do: the lane's word, its start in each step
        from `lanemask_ranks` (the packed scan), the row g+8 quad after the row g quad by the
        word's nibble count, and each quad's two fragment registers from `decode_quad_model` (the
        kernel's table and PRMT)."""
        out, blobs = self._walk()
        u16 = self.blobs.view(np.uint16)
        for tile, c, base, end in blobs:
            words = self.blobs[base:base + LANEMASK_WORDS].view(np.uint32)
            stream = u16[(base + LANEMASK_WORDS) // 2:end // 2]
            excl, bases = lanemask_ranks(words)
            for ln in range(32):
                w = int(words[ln])
                g, t = divmod(ln, 4)
                y, _ = lanemask_counts(w)
                for s in range(4):
                    start = bases[s] + ((excl[ln] >> (8 * s)) & 0xFF)
                    for h, start in ((0, start), (1, start + ((y >> (4 * s)) & 15))):
                        nib = (w >> (16 * h + 4 * s)) & 15
                        lo, hi, _ = decode_quad_model(stream, start, nib)
                        row = tile * 16 + 8 * h + g
                        col = c * 64 + 16 * t + 4 * s
                        for j, reg in enumerate((lo & 0xFFFF, lo >> 16, hi & 0xFFFF, hi >> 16)):
                            if reg:
                                out[row, col + j] = bits_to_float(np.array([reg], dtype=np.uint16), self.dtype)[0]
        m, k = self.shape
        return out[:m, :k]


# ---- value + position byte pairs (tc_scatter) ------------------------------------------------------

SCATTER_HEADER = 16          # tc_scatter: 4 x u16 padded step counts, 8 zero bytes (the values start 16-aligned)
SCATTER_STEP_HALVES = 256    # a step's fragment region: 32 lanes x 4 registers x 2 halves
SCATTER_GROUP = 8            # a lane's load: 8 values (16 bytes) and their 8 position bytes; steps padded to it


def scatter_slots(rows: np.ndarray, cols: np.ndarray, chunks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(blob, step, position) of elements (row, col) in tc_scatter's layout: position = 8 * lane +
    2 * reg + half, where lane (g, t) feeds register a<reg> of step s's m16n8k16 (a0 / a2: row g,
    columns 16t + 4s + {0, 1} / {2, 3} of the chunk; a1 / a3: row g + 8, the same columns)."""
    rows, cols = np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)
    h, g = (rows >> 3) & 1, rows & 7
    t, s, j = (cols >> 4) & 3, (cols >> 2) & 3, cols & 3
    reg = h | ((j >> 1) << 1)
    pos = (((g << 2) | t) << 3) | (reg << 1) | (j & 1)
    return (rows >> 4) * chunks + (cols >> 6), s, pos


def scatter_store_slots(step_start: np.ndarray, padded: np.ndarray, steps: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Index in its blob of value t of step `steps` (into the per-step arrays `step_start`, where the
    step's padded run starts in its blob, a multiple of SCATTER_GROUP, and `padded`, its length): the
    kernel's lane L loads groups L, L + 32, ... of 8 values and stores them with 8 instructions, the
    r-th storing value r of each lane's group; so the step's sequence (bank-spread order) fills its
    slots ordered by (round of 32 groups, r, lane), and each store instruction gets consecutive
    values of the sequence. A step of at most 256 values spans at most two rounds."""
    g0 = step_start // SCATTER_GROUP
    gend = (step_start + padded) // SCATTER_GROUP
    gs = np.minimum(gend, (g0 // 32 + 1) * 32)                      # where the step's second round starts
    first_len = (SCATTER_GROUP * (gs - g0)).astype(np.int32)          # values in the step's first round
    n_a, n_b = np.maximum(gs - g0, 1).astype(np.int32), np.maximum(gend - gs, 1).astype(np.int32)
    t = t.astype(np.int32)
    second = t >= first_len[steps]
    base = np.where(second, gs[steps], g0[steps])
    r, lane = np.divmod(t - np.where(second, first_len[steps], 0), np.where(second, n_b[steps], n_a[steps]))
    return (base + lane) * SCATTER_GROUP + r


def _dense_rank(keys: np.ndarray, size: int) -> np.ndarray:
    """Rank of each of `keys` (unique, in [0, size)) among all of them: a prefix count, no sort."""
    present = np.zeros(size, dtype=np.int32)
    present[keys] = 1
    np.cumsum(present, out=present)
    return present[keys].astype(np.int64) - 1


@dataclass(frozen=True, eq=False)
class TCScatter(_BlobFormat):
    """Blobs per (tile, chunk): per-step counts padded to groups of 8, the values, one position byte
    per value (module docstring of tc_stream.cu's tc_scatter).

    Why this layout: ~3 bytes per kept value and no per-element bits, so the bytes and the kernel's
    work both fall with the sparsity (the bitmap costs 1 bit and a decode per element at any
    sparsity). Steps are padded to whole groups of 8 (a 0 at a position the step leaves free) so a
    lane loads 8 values and their positions with two loads and never straddles two steps. Each
    value's 32-bit word of the step region is ranked among the kept words of its bank, the step's
    values are ordered by (rank, bank counted from the step's first lane, half), and
    `scatter_store_slots` puts consecutive values of that order into one store instruction: each
    touches each bank about once."""

    @classmethod
    def from_matrix(cls, A: SparseMatrix, dtype: str = "float16") -> "TCScatter":
        A, tiles, chunks, rows, cols = blob_grid(A)
        nb = tiles * chunks
        blob, step, pos = scatter_slots(rows, cols, chunks)
        bs = blob * 4 + step                                            # (blob, step), dense in [0, 4 nb)
        bank = (pos >> 1) & 31                                          # 4 words per bank and step
        word_key = (bs * 32 + bank) * 4 + (pos >> 6)                    # both halves of a word: one key
        present = np.zeros(nb * 512 + 1, dtype=np.int32)
        present[word_key + 1] = 1
        np.cumsum(present, out=present)                                 # present words before each key
        rank = present[word_key] - present[(bs * 32 + bank) * 4]         # 0..3 among its bank's words
        del present
        counts = np.bincount(bs, minlength=nb * 4)
        padded = (counts + SCATTER_GROUP - 1) // SCATTER_GROUP * SCATTER_GROUP
        step_start = (np.cumsum(padded.reshape(nb, 4), axis=1) - padded.reshape(nb, 4)).ravel()   # within its blob
        # the step's banks in order from its first lane's (steps that share a store instruction sit
        # in different lanes, so their values start in different banks)
        turn = (bank - step_start[bs] // SCATTER_GROUP) & 31
        seq = _dense_rank(((bs * 4 + rank) * 32 + turn) * 2 + (pos & 1), nb * 1024)   # blob, step, rank, bank, half
        nvals = padded.reshape(nb, 4).sum(axis=1)
        sizes = (SCATTER_HEADER + 3 * nvals + 15) // 16                  # 16-byte units
        starts = np.zeros(nb + 1, dtype=np.int64)
        np.cumsum(sizes, out=starts[1:])
        offsets = blob_offsets(starts, tiles, chunks)
        first = np.zeros(nb * 4 + 1, dtype=np.int64)
        np.cumsum(counts, out=first[1:])
        slot = scatter_store_slots(step_start, padded, bs, seq - first[bs])         # index within the blob
        buf = np.zeros(int(starts[-1]) * 16, dtype=np.uint8)
        buf.view(np.uint16)[(starts[:-1, None] * 8 + np.arange(4)).ravel()] = padded.astype(np.uint16)
        values_at = starts[:-1] * 16 + SCATTER_HEADER                   # per blob: its values, then its positions
        positions_at = values_at + 2 * nvals
        buf.view(np.uint16)[values_at[blob] // 2 + slot] = value_bits(A.data, dtype)
        buf[positions_at[blob] + slot] = pos.astype(np.uint8)
        # padding: value 0 (already there) stored at a position no kept value of the step uses
        occupied = np.zeros((nb * 4, SCATTER_STEP_HALVES), dtype=bool)
        occupied[bs, pos] = True
        empty = np.argmin(occupied, axis=1)                             # each step's first free position
        del occupied
        pads = padded - counts
        pad_bs = np.repeat(np.arange(nb * 4), pads)
        pad_t = counts[pad_bs] + np.arange(pad_bs.size) - np.repeat(np.cumsum(pads) - pads, pads)
        pad_slot = scatter_store_slots(step_start, padded, pad_bs, pad_t)
        buf[positions_at[pad_bs // 4] + pad_slot] = empty[pad_bs].astype(np.uint8)
        return cls(tuple(A.shape), buf, offsets, dtype)

    def to_dense(self) -> np.ndarray:
        """Decode blob by blob the way tc_scatter's warps do: the header's step counts, each value
        stored at its position in the step's fragment region, the region read back lane by lane as
        registers a0..a3 (`scatter_slots` inverted)."""
        out, blobs = self._walk()
        for tile, c, base, _ in blobs:
            counts = self.blobs[base:base + 8].view(np.uint16).astype(np.int64)          # padded
            n = int(counts.sum())
            vals = self.blobs[base + SCATTER_HEADER:base + SCATTER_HEADER + 2 * n].view(np.uint16)
            pos = self.blobs[base + SCATTER_HEADER + 2 * n:base + SCATTER_HEADER + 3 * n].astype(np.int64)
            first = 0
            for s in range(4):
                region = np.zeros(SCATTER_STEP_HALVES, dtype=np.uint16)
                region[pos[first:first + counts[s]]] = vals[first:first + counts[s]]
                first += int(counts[s])
                p = np.arange(SCATTER_STEP_HALVES)
                lane, reg, half = p >> 3, (p >> 1) & 3, p & 1
                g, t = lane >> 2, lane & 3
                row = tile * 16 + 8 * (reg & 1) + g
                col = c * 64 + 16 * t + 4 * s + 2 * (reg >> 1) + half
                out[row, col] = bits_to_float(region, self.dtype)
        m, k = self.shape
        return out[:m, :k]


# ---- kept fragment units (tc_words) --------------------------------------------------------------

WORDS_PER_LANE = 16          # tc_words: a lane's fragment registers per (tile, chunk), as tc_dense's
WORDS_UNITS = (1, 2)         # tc_words' UNIT: fragment registers per kept-or-dropped unit
WORDS_MAX_GROUP = 32         # tc_words LOAD="group": row tiles (consumer warps) per CTA stream


def words_header_bytes(unit: int) -> int:
    """tc_words' blob header (WordsLayout<UNIT>::HEAD): 16 / unit u32 lane masks and as many u16 bases,
    rounded up to 16 bytes."""
    return (16 // unit * 6 + 15) // 16 * 16


def fragment_words(frag: np.ndarray) -> np.ndarray:
    """TCDense's fragment array [tiles, chunks, 4, 32, 8] (uint16) -> [tiles, chunks, 16, 32] uint32:
    register j = 4 * piece + word of lane L, the 32-bit word tc_dense's lane holds in x[j]."""
    tiles, chunks = frag.shape[:2]
    w = np.ascontiguousarray(frag).view(np.uint32).reshape(tiles, chunks, 4, 32, 4)
    return np.ascontiguousarray(w.transpose(0, 1, 2, 4, 3)).reshape(tiles, chunks, WORDS_PER_LANE, 32)


def _words_placement(sizes: np.ndarray, tiles: int, chunks: int, group: int) -> tuple[np.ndarray, np.ndarray]:
    """(each blob's start, indexed tile * chunks + chunk; the offsets array), both in 16-byte units, for
    blobs of `sizes` stored tile by tile (group 1: [tiles, chunks + 1] offsets) or, with `group` > 1,
    group by group and chunk by chunk inside a group ([groups, chunks * group + 1]; a padding tile's
    blobs are empty)."""
    if group == 1:
        starts = np.zeros(sizes.size + 1, dtype=np.int64)
        np.cumsum(sizes, out=starts[1:])
        return starts[:-1], blob_offsets(starts, tiles, chunks)
    groups = -(-tiles // group)
    g, c, w = np.meshgrid(np.arange(groups), np.arange(chunks), np.arange(group), indexing="ij")
    tile = (g * group + w).ravel()
    live = tile < tiles
    blob = np.where(live, tile * chunks + c.ravel(), 0)              # storage order -> blob index
    starts = np.zeros(tile.size + 1, dtype=np.int64)
    np.cumsum(np.where(live, sizes[blob], 0), out=starts[1:])
    start = np.empty(sizes.size, dtype=np.int64)
    start[blob[live]] = starts[:-1][live]
    return start, blob_offsets(starts, groups, chunks * group)


@dataclass(frozen=True, eq=False)
class TCWords(_BlobFormat):
    """Blobs per (tile, chunk): per fragment unit u (one register, or registers 2u and 2u+1) a lane mask
    (bit L: lane L keeps its unit u) and the unit's base, then the kept units unit-major (module
    docstring of tc_stream.cu's tc_words).

    Why this layout: a unit is what a lane feeds the tensor cores, so keeping or dropping whole units
    needs no expansion inside a register, and storing the kept units unit-major makes the warp's read
    of one unit a contiguous run. One-register units cost 4 bytes per kept word: at 50% unstructured
    sparsity 3 of 4 words survive (1.28x fewer bytes than dense), at 70% half (1.84x), at 90% a fifth
    (4.5x); two-register units halve the decode for more bytes (1.06 / 1.3 / 2.9x).

    `group` > 1 (tc_words LOAD="group", a CTA of `group` warps): the blobs of each group of `group` row
    tiles are stored chunk by chunk (chunk c's blobs of the group's tiles in order, then chunk c + 1's),
    so a CTA's whole chunk is one contiguous run that one bulk copy moves; the offsets are then
    [groups, chunks * group + 1] (each blob's start, chunk-major, and the group's end), and the tiles
    past the last of the matrix have empty blobs."""

    unit: int = 1
    group: int = 1

    @classmethod
    def from_matrix(cls, A: SparseMatrix, dtype: str = "float16", unit: int = 1, group: int = 1) -> "TCWords":
        if unit not in WORDS_UNITS:
            raise ValueError(f"tc_words keeps units of {WORDS_UNITS} fragment registers, got UNIT={unit!r}.")
        if not isinstance(group, (int, np.integer)) or not 1 <= group <= WORDS_MAX_GROUP:
            raise ValueError(f"tc_words groups 1 to {WORDS_MAX_GROUP} row tiles per CTA stream, got group={group!r}.")
        regs = fragment_words(TCDense.from_matrix(A, dtype).frag)      # [tiles, chunks, 16, 32]
        tiles, chunks = regs.shape[:2]
        nb, nu, head = tiles * chunks, WORDS_PER_LANE // unit, words_header_bytes(unit)
        if unit == 2:   # registers 2u (low word) and 2u + 1 as one little-endian 8-byte unit
            regs = regs[:, :, 0::2].astype(np.uint64) | (regs[:, :, 1::2].astype(np.uint64) << np.uint64(32))
        kept = regs != 0                                                # [tiles, chunks, nu, 32]
        lane_masks = (kept.astype(np.uint64) << np.arange(32, dtype=np.uint64)).sum(axis=3, dtype=np.uint64)
        per_unit = kept.sum(axis=3, dtype=np.int64).reshape(nb, nu)
        bases = np.cumsum(per_unit, axis=1) - per_unit
        counts = per_unit.sum(axis=1)
        sizes = (head + 4 * unit * counts + 15) // 16                  # 16-byte units
        start, offsets = _words_placement(sizes, tiles, chunks, group)
        buf = np.zeros(int(offsets.reshape(-1)[-1]) * 16, dtype=np.uint8)
        buf.view(np.uint32)[(start[:, None] * 4 + np.arange(nu)).ravel()] = lane_masks.reshape(-1).astype(np.uint32)
        buf.view(np.uint16)[(start[:, None] * 8 + 2 * nu + np.arange(nu)).ravel()] = bases.reshape(-1).astype(np.uint16)
        within = np.flatnonzero(kept.reshape(nb, -1))                   # [nb, nu * 32], C order: unit-major
        blob = within // (nu * 32)
        rank = np.arange(within.size) - (np.cumsum(counts) - counts)[blob]
        store = buf.view(np.uint32 if unit == 1 else np.uint64)
        store[start[blob] * 16 // (4 * unit) + head // (4 * unit) + rank] = regs.reshape(-1)[within]
        return cls(tuple(A.shape), buf, offsets, dtype, unit, int(group))

    def _spans(self, tiles: int, chunks: int) -> list:
        if self.group == 1:
            return super()._spans(tiles, chunks)
        g = self.group
        flat = self.offsets.astype(np.int64) * 16                      # [groups, chunks * g + 1]
        return [(tile, c, int(flat[tile // g, c * g + tile % g]), int(flat[tile // g, c * g + tile % g + 1]))
                for tile in range(tiles) for c in range(chunks)]

    def slot_bytes(self, chunks: int = 1) -> int:
        """The ring slot (the largest blob), or with `group` > 1 a CTA stream's stage: the largest run
        of `chunks` consecutive chunks of a group, from any first chunk (what one bulk copy moves,
        wherever a K slice starts)."""
        if self.group == 1:
            return super().slot_bytes()
        return max(1, largest_run(self.offsets[:, ::self.group], chunks)) * 16   # each chunk's run start

    def kernel_arrays(self) -> tuple[int, int, dict]:
        if self.group == 1:
            return super().kernel_arrays()
        tiles = padded_shape(self.shape)[0] // TILE_M
        chunks = (self.offsets.shape[1] - 1) // self.group
        return tiles, chunks, {"blobs": self.blobs, "offsets": self.offsets.reshape(-1).view("int32")}

    def to_dense(self) -> np.ndarray:
        """Decode blob by blob the way tc_words's lanes do: unit u of lane L is kept when bit L of mask
        u is set, and is the unit at base_u + popc(mask_u & lanes below L) after the header."""
        out, blobs = self._walk()
        nu, head = WORDS_PER_LANE // self.unit, words_header_bytes(self.unit)
        below = np.array([(1 << lane) - 1 for lane in range(32)], dtype=np.int64)
        for tile, c, base, _ in blobs:
            masks = self.blobs[base:base + 4 * nu].view(np.uint32).astype(np.int64)
            bases = self.blobs[base + 4 * nu:base + 6 * nu].view(np.uint16).astype(np.int64)
            units = self.blobs[base + head:].view(np.uint32 if self.unit == 1 else np.uint64)
            regs = np.zeros((nu, 32), dtype=units.dtype)
            for u in range(nu):
                keep = (masks[u] >> np.arange(32)) & 1 == 1
                rank = np.array([bin(int(masks[u] & b)).count("1") for b in below])
                if keep.any():   # a blob with no kept unit may end the buffer: nothing to index then
                    regs[u] = np.where(keep, units[np.where(keep, bases[u] + rank, 0)], 0)
            frag = regs.view(np.uint32).reshape(WORDS_PER_LANE, 32) if self.unit == 1 else \
                np.stack([regs & 0xFFFFFFFF, regs >> 32], axis=1).astype(np.uint32).reshape(WORDS_PER_LANE, 32)
            pieces = frag.reshape(4, 4, 32).transpose(0, 2, 1)            # [piece, lane, word]
            block = np.ascontiguousarray(pieces).view(np.uint16).reshape(1, 1, 4, 32, 8)
            out[tile * 16:(tile + 1) * 16, c * 64:(c + 1) * 64] = bits_to_float(_natural_order(block, CHUNK_K), self.dtype)
        m, k = self.shape
        return out[:m, :k]
