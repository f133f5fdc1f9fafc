"""The tensor-core streaming formats (sparseditto.tc_formats): exact round trips through the bytes the
kernels read, on odd shapes, in fp16 and bf16; the 2:4 refusal; the bitmap header fields; and the
quad-decode table against the bitmap semantics it implements.

The decoders walk the packed bytes the way the kernels do (fragment order, header ranks, the mma.sp
metadata layout), so these are tests of the layout contract with tc_stream.cu, not of numpy."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparseditto import tc_formats as tf
from sparseditto.matrix import SparseMatrix


def _matrix(m: int, k: int, density: float, seed: int, dtype: str = "float16", nm: tuple | None = None):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((m, k)).astype(np.float32)
    if nm:
        n_keep, group = nm
        kk = k // group * group
        g = np.abs(w[:, :kk]).reshape(m, -1, group)
        drop = np.argsort(-g, axis=2)[:, :, n_keep:]
        mask = np.ones_like(g, dtype=bool)
        np.put_along_axis(mask, drop, False, axis=2)
        w[:, :kk] *= mask.reshape(m, kk)
        w[:, kk:] = 0
    else:
        w *= rng.random((m, k)) < density
    return SparseMatrix.from_scipy(sp.csr_array(w), dtype=dtype), w


def _rounded(w: np.ndarray, dtype: str) -> np.ndarray:
    t = torch.from_numpy(w).to(torch.float16 if dtype == "float16" else torch.bfloat16)
    return t.to(torch.float64).numpy()


SHAPES = [(1, 1, 1.0), (16, 64, 0.5), (37, 130, 0.3), (50, 200, 0.05), (33, 64, 1.0), (17, 65, 0.02),
          (100, 300, 0.9), (3, 129, 0.7)]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("m,k,density", SHAPES)
def test_dense_and_bitmap_round_trip_exactly(m, k, density, dtype):
    A, w = _matrix(m, k, density, seed=m * 1000 + k, dtype=dtype)
    ref = _rounded(w, dtype)
    assert np.array_equal(tf.TCDense.from_matrix(A, dtype).to_dense(), ref)
    assert np.array_equal(tf.TCBitmap.from_matrix(A, dtype).to_dense(), ref)
    assert np.array_equal(tf.TCLaneMask.from_matrix(A, dtype).to_dense(), ref)


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 70), k=st.integers(1, 200), density=st.floats(0.02, 1.0), seed=st.integers(0, 10_000))
def test_bitmap_round_trip_on_random_shapes(m, k, density, seed):
    A, w = _matrix(m, k, density, seed)
    if A.nnz == 0:
        return
    fmt = tf.TCBitmap.from_matrix(A, "float16")
    assert np.array_equal(fmt.to_dense(), _rounded(w, "float16"))
    assert fmt.nbytes() == fmt.blobs.nbytes + fmt.offsets.nbytes
    assert fmt.blobs.nbytes % 16 == 0 and np.all(np.diff(fmt.offsets.reshape(-1)) >= 0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("m,k,nm", [(16, 64, (2, 4)), (37, 130, (2, 4)), (64, 64, (1, 2)), (5, 8, (1, 4)),
                                     (33, 200, (2, 4))])
def test_sp24_round_trip_through_hardware_metadata(m, k, nm, dtype):
    A, w = _matrix(m, k, 0.0, seed=k, dtype=dtype, nm=nm)
    fmt = tf.TCSparse24.from_matrix(A, dtype)
    assert np.array_equal(fmt.to_dense(), _rounded(w, dtype))
    # every 4-bit group selects two distinct, ascending positions (0b0000/0101/1010/1111 are illegal)
    words = fmt.meta.reshape(-1)
    for shift in range(0, 32, 4):
        nib = (words >> np.uint32(shift)) & np.uint32(15)
        assert np.all((nib & 3) < (nib >> 2))
    assert fmt.nbytes() == fmt.values.nbytes + fmt.meta.nbytes
    mp, kp = tf.padded_shape((m, k))
    assert fmt.values.nbytes == mp * kp // 2 * 2


def test_sp24_refuses_a_group_with_three_values():
    w = np.zeros((2, 8), dtype=np.float32)
    w[1, 4:7] = 1.0
    A = SparseMatrix.from_scipy(sp.csr_array(w), dtype="float16")
    with pytest.raises(ValueError, match=r"row 1, columns 4..7 hold 3 nonzeros"):
        tf.TCSparse24.from_matrix(A, "float16")


def test_fragment_key_orders_lanes_and_steps():
    """Lane (g, t) of step s owns row g's columns 16t+4s..+3, then row g+8's, in the value order."""
    rows = np.array([0, 0, 8, 1, 0, 0])
    cols = np.array([0, 3, 0, 0, 16, 4])
    keys = tf.fragment_key(rows, cols, chunks=1)
    assert list(keys) == [0, 3, 4, 32, 8, 256]


def test_bitmap_header_fields():
    A, _ = _matrix(16, 128, 0.5, seed=3)
    fmt = tf.TCBitmap.from_matrix(A, "float16")
    for c in range(2):
        base = int(fmt.offsets[0, c]) * 16
        hdr = fmt.blobs[base:base + tf.BITMAP_HEADER]
        W = hdr[:128].view(np.uint32).reshape(8, 4)
        P = hdr[128:160].reshape(8, 4)
        cum = hdr[160:168].view(np.uint16)
        size = int(hdr[168:172].view(np.uint32)[0])
        counts = np.array([[bin(int(W[g, s])).count("1") for g in range(8)] for s in range(4)])
        assert np.array_equal(P[1:, :].T, np.cumsum(counts, axis=1)[:, :-1])
        assert np.all(P[0] == 0)
        assert list(cum) == [0, *np.cumsum(counts.sum(axis=1))[:-1]]
        assert size == (int(fmt.offsets[0, c + 1]) - int(fmt.offsets[0, c])) * 16
        assert size == -(-(tf.BITMAP_HEADER + 2 * counts.sum()) // 16) * 16


def test_quad_table_decodes_every_nibble_at_every_alignment():
    stream = np.arange(1000, 1024, dtype=np.uint16)
    for start in range(0, 8):
        for n in range(16):
            lo, hi, nxt = tf.decode_quad_model(stream, start, n)
            slots, r = [0, 0, 0, 0], start
            for j in range(4):
                if n >> j & 1:
                    slots[j] = int(stream[r])
                    r += 1
            assert (lo, hi, nxt) == (slots[0] | slots[1] << 16, slots[2] | slots[3] << 16, r), (start, n)


def test_prmt_model_matches_ptx_byte_select():
    assert tf.prmt(0x44332211, 0x88776655, 0x3210) == 0x44332211
    assert tf.prmt(0x44332211, 0x88776655, 0x7654) == 0x88776655
    assert tf.prmt(0x0000BBAA, 0x0000DDCC, 0x5410) == 0xDDCCBBAA
    with pytest.raises(ValueError):
        tf.prmt(0, 0, 0x8)


def test_value_dtypes_are_checked():
    A, _ = _matrix(4, 8, 0.5, seed=1)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        tf.TCDense.from_matrix(A, "float32")
    with pytest.raises(ValueError, match="SparseMatrix"):
        tf.TCBitmap.from_matrix(np.zeros((2, 2)), "float16")


# ---- tc_lanemask ----------------------------------------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 70), k=st.integers(1, 200), density=st.floats(0.02, 1.0), seed=st.integers(0, 10_000))
def test_lanemask_round_trip_on_random_shapes(m, k, density, seed):
    A, w = _matrix(m, k, density, seed)
    fmt = tf.TCLaneMask.from_matrix(A, "float16")
    assert np.array_equal(fmt.to_dense(), _rounded(w, "float16"))
    assert fmt.blobs.nbytes % 16 == 0 and fmt.nbytes() == fmt.blobs.nbytes + fmt.offsets.nbytes
    sizes = np.diff(fmt.offsets.astype(np.int64), axis=1) * 16
    kept = np.bincount(tf.lanemask_slots(*(np.asarray(x) for x in np.nonzero(w)), fmt.offsets.shape[1] - 1)[0],
                       minlength=sizes.size)
    assert np.array_equal(sizes.reshape(-1), (tf.LANEMASK_WORDS + 2 * kept + 15) // 16 * 16)


def test_lanemask_words_hold_each_lanes_32_elements():
    """Lane (g, t)'s word: bit i = row g, chunk column 16t + i; bit 16 + i = row g + 8's (what it
    feeds the four m16n8k16 steps under tc_dense's K permutation)."""
    w = np.zeros((16, 64), dtype=np.float32)
    w[3, 16 * 2 + 5] = 1.0        # g 3, t 2, bit 5
    w[8 + 3, 16 * 2 + 9] = 2.0    # g 3, t 2, bit 16 + 9
    w[0, 63] = 3.0                # g 0, t 3, bit 15
    A = SparseMatrix.from_scipy(sp.csr_array(w), dtype="float16")
    fmt = tf.TCLaneMask.from_matrix(A, "float16")
    words = fmt.blobs[:tf.LANEMASK_WORDS].view(np.uint32)
    expect = np.zeros(32, dtype=np.uint32)
    expect[4 * 3 + 2] = (1 << 5) | (1 << 25)
    expect[4 * 0 + 3] = 1 << 15
    assert np.array_equal(words, expect)
    # step-major values: step 1 (lane 14's bit 5 = column 16*2 + 4 + 1) before step 2 (its bit 25 =
    # column 16*2 + 8 + 1 of row 11) and step 3 (lane 3's bit 15)
    vals = fmt.blobs[tf.LANEMASK_WORDS:].view(np.uint16)[:3].view(np.float16)
    assert vals.tolist() == [1.0, 2.0, 3.0]


@settings(max_examples=200, deadline=None)
@given(words=st.lists(st.integers(0, 2 ** 32 - 1), min_size=32, max_size=32))
def test_lanemask_packed_scan_is_exact_even_when_a_step_is_full(words):
    """The kernel scans one byte per step across the warp: an exclusive prefix is at most 31 * 8, so
    it never overflows its byte; lane 31's inclusive sum may carry into the next byte (a full step:
    256 values), and incl - own is still exact mod 2^32. Checked against plain popcounts."""
    excl, bases = tf.lanemask_ranks(np.array(words, dtype=np.uint32))
    per_step = np.array([[bin((w >> (4 * s)) & 0xF).count("1") + bin((w >> (16 + 4 * s)) & 0xF).count("1")
                          for s in range(4)] for w in words])
    before = np.cumsum(per_step, axis=0) - per_step
    for ln in range(32):
        assert [(excl[ln] >> (8 * s)) & 0xFF for s in range(4)] == before[ln].tolist()
    totals = per_step.sum(axis=0)
    assert bases == [0, totals[0], totals[0] + totals[1], totals[0] + totals[1] + totals[2]]


def test_lanemask_full_steps_carry_and_decode():
    """Every element kept (each step 256 values: the byte carry of the scan's lane 31) still decodes."""
    A, w = _matrix(32, 128, 1.0, seed=3)
    assert np.array_equal(tf.TCLaneMask.from_matrix(A, "float16").to_dense(), _rounded(w, "float16"))
    excl, bases = tf.lanemask_ranks(np.full(32, 0xFFFFFFFF, dtype=np.uint32))
    assert bases == [0, 256, 512, 768] and excl[31] == 0xF8F8F8F8


# ---- tc_scatter -----------------------------------------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 70), k=st.integers(1, 200), density=st.floats(0.0, 1.0), seed=st.integers(0, 10_000),
       dtype=st.sampled_from(["float16", "bfloat16"]))
def test_scatter_round_trip_on_random_shapes(m, k, density, seed, dtype):
    A, w = _matrix(m, k, density, seed, dtype)
    fmt = tf.TCScatter.from_matrix(A, dtype)
    assert np.array_equal(fmt.to_dense(), _rounded(w, dtype))
    sizes = np.diff(fmt.offsets.astype(np.int64), axis=1) * 16
    blob, step, _ = tf.scatter_slots(*(np.asarray(x) for x in np.nonzero(w)), fmt.offsets.shape[1] - 1)
    kept = np.bincount(blob * 4 + step, minlength=sizes.size * 4).reshape(-1, 4)
    padded = (kept + 7) // 8 * 8                                        # each step: whole groups of 8
    assert np.array_equal(sizes.reshape(-1), (tf.SCATTER_HEADER + 3 * padded.sum(axis=1) + 15) // 16 * 16)
    assert fmt.slot_bytes() == max(16, int(sizes.max(initial=0)))


def test_scatter_positions_address_the_mma_fragment_registers():
    """Position 8 * lane + 2 * reg + half: lane (g, t), register a0 / a2 = row g, columns 16t + 4s +
    {0, 1} / {2, 3}; a1 / a3 = row g + 8 (the A fragment of m16n8k16 under tc_dense's K permutation)."""
    rows = np.array([3, 11, 0, 15])
    cols = np.array([16 * 2 + 4 * 1 + 1, 16 * 2 + 4 * 1 + 2, 63, 0])
    blob, step, pos = tf.scatter_slots(rows, cols, 1)
    assert blob.tolist() == [0, 0, 0, 0] and step.tolist() == [1, 1, 3, 0]
    # (g 3, t 2) a0 half 1; (g 3, t 2) a3 half 0; (g 0, t 3) a2 half 1; (g 7, t 0) a1 half 0
    assert pos.tolist() == [8 * 14 + 1, 8 * 14 + 6, 8 * 3 + 5, 8 * 28 + 2]


def _scatter_blobs(fmt):
    """Per blob: (padded step counts, values, positions) in stream order, read from the packed bytes."""
    for _, _, base, _ in fmt._walk()[1]:
        counts = fmt.blobs[base:base + 8].view(np.uint16).astype(int)
        n = int(counts.sum())
        vals = fmt.blobs[base + tf.SCATTER_HEADER:base + tf.SCATTER_HEADER + 2 * n].view(np.uint16)
        pos = fmt.blobs[base + tf.SCATTER_HEADER + 2 * n:base + tf.SCATTER_HEADER + 3 * n].astype(int)
        yield counts, vals, pos


def _store_instructions(counts, pos):
    """The kernel's stores of one blob: lane L loads groups L, L + 32, ... of 8 values; store r of a
    round takes value r of each lane's group. Per instruction: (slot indices, step of each)."""
    bounds = np.cumsum(counts)
    groups = int(bounds[-1]) // 8 if len(bounds) else 0
    for round_ in range(0, groups, 32):
        g = np.arange(round_, min(round_ + 32, groups))
        for r in range(8):
            idx = 8 * g + r
            yield idx, np.searchsorted(bounds, idx, side="right")


def _store_wavefronts(words: np.ndarray) -> int:
    """Shared-memory wavefronts of one warp's 16-bit stores to these 32-bit words of the fragment
    regions: the most distinct words any bank is asked for (halves of one word are one access)."""
    words = np.unique(words)
    return int(np.bincount(words & 31).max(initial=0))


def test_scatter_steps_pad_to_whole_groups_with_zeros_on_free_positions():
    """A lane's group of 8 never straddles two steps (the kernel takes one step per group): each
    step is padded to a multiple of 8 with value 0 stored at a position no kept value of the step uses."""
    A, w = _matrix(48, 200, 0.37, 11)
    fmt = tf.TCScatter.from_matrix(A, "float16")
    rows, cols = (np.asarray(x) for x in np.nonzero(w))
    blob, step, _ = tf.scatter_slots(rows, cols, fmt.offsets.shape[1] - 1)
    kept = np.bincount(blob * 4 + step, minlength=fmt.offsets.shape[0] * (fmt.offsets.shape[1] - 1) * 4)
    pads = 0
    for b, (counts, vals, pos) in enumerate(_scatter_blobs(fmt)):
        assert np.all(counts % 8 == 0) and np.all(counts - kept[4 * b:4 * b + 4] < 8)
        first = np.concatenate([[0], np.cumsum(counts)])
        for s in range(4):
            v, p = vals[first[s]:first[s + 1]], pos[first[s]:first[s + 1]]
            real = v != 0
            assert len(set(p[real])) == real.sum() == kept[4 * b + s]      # kept values: distinct positions
            assert not set(p[~real]) & set(p[real])                     # padding only where nothing is kept
            pads += int((~real).sum())
    assert pads > 0


def test_scatter_store_instructions_take_the_step_sequence_in_rank_bank_half_order():
    """Read in the kernel's store order (round, store r, lane), each step's slots give its kept values
    ordered by (rank of their word in its bank, bank counted from the step's first lane, half), then
    the padding: consecutive values of that order land in one store instruction, and two steps that
    share an instruction start in different banks."""
    A, _ = _matrix(64, 256, 0.5, 3)
    for counts, vals, pos in _scatter_blobs(tf.TCScatter.from_matrix(A, "float16")):
        first = np.concatenate([[0], np.cumsum(counts)])
        per_step = [[] for _ in range(4)]
        for idx, steps in _store_instructions(counts, pos):
            for i, s in zip(idx, steps):
                per_step[s].append(i)
        for s, slots in enumerate(per_step):
            real = [i for i in slots if vals[i] != 0]
            assert real == slots[:len(real)]                            # padding last
            p = pos[real]
            word, bank = p >> 1, (p >> 1) & 31
            rank = np.array([len({x for x in word[bank == b] if x < y}) for y, b in zip(word, bank)])
            turn = (bank - first[s] // 8) % 32
            assert np.all(np.diff((rank * 32 + turn) * 2 + (p & 1)) > 0)


@pytest.mark.parametrize("density,bound", [(0.7, 1.7), (0.5, 1.7), (0.3, 1.8)])
def test_scatter_store_instructions_spread_over_the_banks(density, bound):
    """The order above keeps the mean wavefronts per store instruction at ~1.6 (30-70% dense blobs;
    one is ideal), where the same blobs shuffled within each step take 2.5-3.1."""
    A, _ = _matrix(128, 512, density, 5)
    fmt = tf.TCScatter.from_matrix(A, "float16")
    waves, shuffled = [], []
    rng = np.random.default_rng(0)
    for counts, vals, pos in _scatter_blobs(fmt):
        mixed = pos.copy()
        first = np.concatenate([[0], np.cumsum(counts)])
        for s in range(4):
            rng.shuffle(mixed[first[s]:first[s + 1]])
        for idx, steps in _store_instructions(counts, pos):
            waves.append(_store_wavefronts(steps * 128 + (pos[idx] >> 1)))
            shuffled.append(_store_wavefronts(steps * 128 + (mixed[idx] >> 1)))
    assert np.mean(waves) <= bound < np.mean(shuffled)


@pytest.mark.parametrize("density,within", [(0.5, 0.01), (0.3, 0.01), (0.1, 0.01), (0.01, 0.03)])
def test_scatter_cost_bytes_match_the_packed_format(density, within):
    """The planner's byte count (cost.tc_bytes) for tc_scatter, each step's padding in expectation,
    is within 1% of what the format packs on 50-90% sparse random weights, 3% at 99% (where the
    blobs' rounding to 16 bytes, counted at its mean, weighs more)."""
    from sparseditto.kernel_templates.cost import tc_bytes

    A, _ = _matrix(256, 1024, density, 9)
    packed = tf.TCScatter.from_matrix(A, "float16").nbytes()
    assert abs(tc_bytes("tc_scatter", 256, 1024, A.nnz, 2) / packed - 1.0) < within


@pytest.mark.parametrize("density", [0.0, 1.0])
def test_scatter_empty_and_full_chunks_decode(density):
    """Every element kept (256 values per step: no padding, no free position needed) or none (a
    16-byte header per blob and nothing else) still round-trips."""
    A, w = _matrix(40, 150, density, 2)
    fmt = tf.TCScatter.from_matrix(A, "float16")
    assert np.array_equal(fmt.to_dense(), _rounded(w, "float16"))
    if density == 0.0:
        assert fmt.slot_bytes() == 16 and not fmt.blobs.any()


# ---- tc_words -------------------------------------------------------------------------------------

@pytest.mark.parametrize("unit", [1, 2])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("m,k,density,nm", [(37, 130, 0.5, None), (300, 1000, 0.3, None), (16, 64, 1.0, None),
                                            (129, 4160, 0.1, None), (64, 200, 0.5, (2, 4)), (33, 70, 0.02, None)])
def test_words_round_trip_through_the_kernels_addressing(m, k, density, nm, dtype, unit):
    """TCWords decoded as tc_words's lanes address it (mask u's bit L, the unit's stored base plus
    popc(mask_u & lanes below)) gives back the matrix exactly, odd shapes included, both unit sizes."""
    A, w = _matrix(m, k, density, 3, dtype, nm)
    fmt = tf.TCWords.from_matrix(A, dtype, unit)
    np.testing.assert_array_equal(fmt.to_dense(), _rounded(w, dtype))
    tiles, chunks = -(-m // 16), -(-k // 64)
    assert fmt.offsets.shape == (tiles, chunks + 1) and fmt.blobs.size == int(fmt.offsets[-1, -1]) * 16


@pytest.mark.parametrize("group", [2, 3, 8])
@pytest.mark.parametrize("m,k,density,nm,unit", [(37, 130, 0.5, None, 1), (300, 1000, 0.3, None, 2),
                                                 (129, 4160, 0.1, None, 1), (64, 200, 0.5, (2, 4), 2),
                                                 (40, 130, 0.0, None, 1)])
def test_words_group_order_stores_each_ctas_chunk_as_one_run(m, k, density, nm, unit, group):
    """group > 1 (tc_words LOAD="group"): the same blobs, stored group by group and chunk-major inside a
    group, so chunk c of a CTA's `group` tiles is one contiguous run [offsets[g, c*group], offsets[g,
    (c+1)*group]); tiles past the matrix have empty blobs; the decode through those offsets is exact;
    slot_bytes is the largest run (one bulk copy)."""
    A, w = _matrix(m, k, density, 3, "float16", nm)
    plain = tf.TCWords.from_matrix(A, "float16", unit)
    fmt = tf.TCWords.from_matrix(A, "float16", unit, group)
    np.testing.assert_array_equal(fmt.to_dense(), _rounded(w, "float16"))
    tiles, chunks = -(-m // 16), -(-k // 64)
    groups = -(-tiles // group)
    assert fmt.group == group and fmt.offsets.shape == (groups, chunks * group + 1)
    assert fmt.blobs.size == plain.blobs.size == int(fmt.offsets[-1, -1]) * 16
    assert fmt.kernel_arrays()[:2] == (tiles, chunks)
    runs = []
    for g in range(groups):
        assert g == 0 or fmt.offsets[g, 0] == fmt.offsets[g - 1, -1]            # groups back to back
        for c in range(chunks):
            for j in range(group):
                tile = g * group + j
                start, end = (int(x) * 16 for x in fmt.offsets[g, c * group + j:c * group + j + 2])
                if tile >= tiles:
                    assert start == end                                          # padding tile: empty
                    continue
                p0, p1 = (int(x) * 16 for x in plain.offsets[tile, c:c + 2])
                assert fmt.blobs[start:end].tobytes() == plain.blobs[p0:p1].tobytes()
            runs.append(int(fmt.offsets[g, (c + 1) * group] - fmt.offsets[g, c * group]) * 16)
    assert fmt.slot_bytes() == max(runs)
    starts = fmt.offsets[:, ::group].astype(np.int64)                  # each chunk's run start, per group
    for ch in (2, 4):                                                   # stages of ch chunks, any first chunk
        span = max(int(starts[g, min(c + ch, chunks)] - starts[g, c]) for g in range(groups) for c in range(chunks))
        assert fmt.slot_bytes(ch) == span * 16 >= fmt.slot_bytes()
    with pytest.raises(ValueError, match="group=0"):
        tf.TCWords.from_matrix(A, "float16", unit, 0)


def test_words_blob_holds_lane_masks_bases_then_the_nonzero_words_register_major():
    """Only words with a nonzero half are stored; inside a blob, after the 16 masks and 16 u16 bases
    (96 bytes), they come register by register, lanes ascending, so a warp's read of one register is
    one contiguous run starting at the register's base."""
    A, _ = _matrix(16, 64, 0.3, 5)
    fmt = tf.TCWords.from_matrix(A, "float16")
    regs = tf.fragment_words(tf.TCDense.from_matrix(A, "float16").frag)[0, 0]     # [16 registers, 32 lanes]
    expect = [int(regs[j, lane]) for j in range(16) for lane in range(32) if regs[j, lane]]
    words = fmt.blobs.view(np.uint32)
    assert tf.words_header_bytes(1) == 96 and tf.words_header_bytes(2) == 48
    assert words[24:24 + len(expect)].tolist() == expect and all(expect)
    assert not words[24 + len(expect):].any() and fmt.blobs.size == -(-(96 + 4 * len(expect)) // 16) * 16
    bases = fmt.blobs[64:96].view(np.uint16)
    for j in range(16):
        assert int(words[j]) == sum(1 << lane for lane in range(32) if regs[j, lane])
        assert int(bases[j]) == int((regs[:j] != 0).sum())


def test_words_two_register_units_hold_four_neighbouring_values_of_a_row():
    """UNIT 2 keeps registers 2u and 2u + 1 of a lane (values 4s..4s+3 of row g or g + 8 in the permuted
    chunk) as one 8-byte unit, the low word first, wherever either is nonzero."""
    A, _ = _matrix(16, 64, 0.2, 6)
    fmt = tf.TCWords.from_matrix(A, "float16", 2)
    regs = tf.fragment_words(tf.TCDense.from_matrix(A, "float16").frag)[0, 0]
    expect = [(int(regs[2 * u, lane]), int(regs[2 * u + 1, lane])) for u in range(8) for lane in range(32)
              if regs[2 * u, lane] or regs[2 * u + 1, lane]]
    units = fmt.blobs[48:48 + 8 * len(expect)].view(np.uint32).reshape(-1, 2)
    assert [tuple(int(x) for x in pair) for pair in units] == expect
    with pytest.raises(ValueError, match="UNIT=3"):
        tf.TCWords.from_matrix(A, "float16", 3)


@pytest.mark.parametrize("unit", [1, 2])
@pytest.mark.parametrize("density,within", [(0.5, 0.01), (0.3, 0.01), (0.1, 0.02)])
def test_words_cost_bytes_match_the_packed_format(density, within, unit):
    """cost.words_bytes (kept units at random placement, mean blob padding) is within 1-2% of what the
    format packs, for both unit sizes; tc_bytes("tc_words") is the one-register case."""
    from sparseditto.kernel_templates.cost import tc_bytes, words_bytes

    A, _ = _matrix(256, 1024, density, 9)
    packed = tf.TCWords.from_matrix(A, "float16", unit).nbytes()
    assert abs(words_bytes(256, 1024, A.nnz, unit) / packed - 1.0) < within
    assert tc_bytes("tc_words", 256, 1024, A.nnz, 2) == words_bytes(256, 1024, A.nnz, 1)
