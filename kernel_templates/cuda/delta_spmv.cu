// Delta-coded SpMV / skinny SpMM for decode (N <= 8) on the CUDA cores (SparseDitto, CUDA C++).
//
// C[M, N] = A[M, K] @ B[K, N], A in delta slices (sparseditto/delta_format.py): each row split over
// L lanes, each lane a contiguous run of entries in groups of 8; per group one 16-byte piece of 8
// fp16/bf16 values and one delta word (8 x 4-bit in a u32, or 8 x 8-bit in a u64); the column of
// entry i is the lane's start plus the running sum of its deltas. Pieces of a row are interleaved
// lane-fastest, so a warp's load of one group is 32 consecutive 16-byte pieces (512 bytes) and 32
// consecutive delta words: every load is coalesced and streams past L1 (ld.global.nc.no_allocate).
//
// Why it is fast at decode sizes: the work per nonzero is a bit-field extract, an add, one shared
// load of B's row and NV fused multiply-adds, so a 50% fp16 weight (2.5 bytes per nonzero) costs
// about 5 instructions per 2.5 bytes, under what the CUDA cores issue at the HBM rate; B (K x NV,
// fp32) sits in shared memory, staged once per persistent CTA while its first loads of A are
// already in flight.
//
// Thread layout: a sub-warp of L lanes streams one contiguous range of rows (a host-made split,
// balanced by pieces, one range per sub-warp of a single resident wave: spmm's plan); lane q of a
// row owns its run; PIPE groups of loads are in flight per lane (register buffers with
// compile-time indices) and stay in flight across row ends; at a row's end its L lanes reduce
// with shuffles (fixed order: deterministic) and lane 0 stores. Needs dtypes.cuh in front (the
// registry inlines it): F16, BF16.

typedef unsigned int u32;

__device__ __forceinline__ uint4 delta_ldg16(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

template <int DB>
struct DeltaWord;

template <>
struct DeltaWord<4> {
    typedef u32 type;
    static __device__ __forceinline__ type load(const void* base, long long i) {
        u32 v;
        asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(static_cast<const u32*>(base) + i));
        return v;
    }
    static __device__ __forceinline__ type zero() { return 0u; }
    static __device__ __forceinline__ int field(const type& w, int i) { return (w >> (4 * i)) & 15; }
};

template <>
struct DeltaWord<8> {
    typedef uint2 type;
    static __device__ __forceinline__ type load(const void* base, long long i) {
        uint2 v;
        asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];"
                     : "=r"(v.x), "=r"(v.y) : "l"(static_cast<const uint2*>(base) + i));
        return v;
    }
    static __device__ __forceinline__ type zero() { return make_uint2(0u, 0u); }
    static __device__ __forceinline__ int field(const type& w, int i) {
        return ((i < 4 ? w.x : w.y) >> (8 * (i & 3))) & 255;
    }
};

// value i (0..7) of a 16-byte piece as fp32
template <typename T>
__device__ __forceinline__ float piece_value(const uint4& v, int i) {
    const u32 w = i < 2 ? v.x : i < 4 ? v.y : i < 6 ? v.z : v.w;
    return T::to_float(static_cast<u16>((i & 1) ? (w >> 16) : (w & 0xffffu)));
}

// B's row at byte offset `off` of the shared copy (off = physical column * bytes per column): the
// kernel carries the running column pre-scaled, so each entry costs one add and no address
// arithmetic. BH: the copy holds B's own 16-bit values (half the shared-memory words per gather
// and half the space, one convert per value); else fp32.
template <typename T, int NV, bool BH>
__device__ __forceinline__ void b_row(const float* bs, int off, float (&b)[NV]) {
    const char* at = reinterpret_cast<const char*>(bs) + off;
    if (BH) {
        if (NV == 1) {
            b[0] = T::to_float(*reinterpret_cast<const u16*>(at));
        } else if (NV == 2) {
            const u32 w = *reinterpret_cast<const u32*>(at);
            b[0] = T::to_float(static_cast<u16>(w & 0xffffu)); b[NV > 1 ? 1 : 0] = T::to_float(static_cast<u16>(w >> 16));
        } else if (NV == 4) {
            const uint2 w = *reinterpret_cast<const uint2*>(at);
            const uint4 v = make_uint4(w.x, w.y, 0u, 0u);
#pragma unroll
            for (int t = 0; t < (NV < 4 ? NV : 4); ++t) b[t] = piece_value<T>(v, t);
        } else {
            const uint4 v = *reinterpret_cast<const uint4*>(at);
#pragma unroll
            for (int t = 0; t < NV; ++t) b[t] = piece_value<T>(v, t);
        }
    } else if (NV == 1) {
        b[0] = *reinterpret_cast<const float*>(at);
    } else if (NV == 2) {
        const float2 x = *reinterpret_cast<const float2*>(at);
        b[0] = x.x; b[NV > 1 ? 1 : 0] = x.y;
    } else {
#pragma unroll
        for (int t = 0; t < NV; t += 4) {
            const float4 x = reinterpret_cast<const float4*>(at)[t / 4];
            b[t] = x.x; b[t + 1 < NV ? t + 1 : 0] = x.y; b[t + 2 < NV ? t + 2 : 0] = x.z; b[t + 3 < NV ? t + 3 : 0] = x.w;
        }
    }
}

// One element of the shared copy: B's 16-bit value (BH) or its fp32 conversion.
template <typename T, bool BH>
__device__ __forceinline__ void put_b(float* bs, int i, typename T::storage v) {
    if (BH) reinterpret_cast<typename T::storage*>(bs)[i] = v;
    else bs[i] = T::to_float(v);
}

// B[:, n0 : n0 + NV] -> bs (fp32, K x NV, zeros past N), any layout of B. Every load of a batch of
// SB elements per thread is issued before the first store, so staging costs a few memory latencies
// instead of one per element: measured on the H200, a plain loop (16 dependent rounds per thread at
// K = 4096) was a ~12 us floor under every shape. SB = 8, not 16: at 16 the batch spilled under the
// register cap of MIN_WARPS = 24.
// The copy is skewed: column k sits at physical row p = k + (k >> skew), so each block of 2^skew
// columns is followed by one hole (zeroed: a gap filler's column may land there).
template <typename T, int NV, int WARPS, bool BH>
__device__ __forceinline__ void stage_b_general(float* bs, const typename T::storage* __restrict__ B, int K, int KP,
                                                int skew, int N, int n0, long long ldb) {
    constexpr int SB = 8;
    constexpr int THREADS = WARPS * 32;
    const int total = KP * NV;
    const int block = skew ? (1 << skew) + 1 : 0x7fffffff;
    for (int i0 = threadIdx.x; i0 < total; i0 += SB * THREADS) {
        typename T::storage v[SB];
        bool real[SB];
#pragma unroll
        for (int u = 0; u < SB; ++u) {
            const int i = i0 + u * THREADS;
            const int p = i / NV, t = i - p * NV;
            const int j = p / block, r = p - j * block;
            const int k = skew ? (j << skew) + r : p;
            real[u] = i < total && r < (skew ? (1 << skew) : block) && k < K && n0 + t < N;
            v[u] = real[u] ? B[static_cast<long long>(k) * ldb + n0 + t] : typename T::storage(0);
        }
#pragma unroll
        for (int u = 0; u < SB; ++u) {
            const int i = i0 + u * THREADS;
            if (i < total) put_b<T, BH>(bs, i, real[u] ? v[u] : typename T::storage(0));
        }
    }
}

// The common decode case, B's strip contiguous (N == NV, B [K, N] row-major, 16-byte aligned):
// 16-byte loads of 8 values, all of a thread's loads issued before its first store (K = 4096, NV = 1:
// two loads per thread instead of the general path's sixteen element loads and index divisions);
// then the skew's holes are zeroed.
template <typename T, int NV, int WARPS, bool BH>
__device__ __forceinline__ void stage_b_contiguous(float* bs, const typename T::storage* __restrict__ B, int K, int KP,
                                                   int skew) {
    constexpr int SB = 4;
    constexpr int THREADS = WARPS * 32;
    const int chunks = K * NV / 8;                     // K * NV is a multiple of 8 (checked by the caller)
    const uint4* src = reinterpret_cast<const uint4*>(B);
    for (int c0 = threadIdx.x; c0 < chunks; c0 += SB * THREADS) {
        uint4 v[SB];
#pragma unroll
        for (int u = 0; u < SB; ++u) {
            const int c = c0 + u * THREADS;
            v[u] = c < chunks ? src[c] : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int u = 0; u < SB; ++u) {
            const int c = c0 + u * THREADS;
            if (c < chunks) {
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    const int e = c * 8 + i, k = e / NV, t = e % NV;       // NV is a power of two
                    const u32 w = i < 2 ? v[u].x : i < 4 ? v[u].y : i < 6 ? v[u].z : v[u].w;
                    put_b<T, BH>(bs, (skew ? k + (k >> skew) : k) * NV + t,
                                 static_cast<typename T::storage>((i & 1) ? (w >> 16) : (w & 0xffffu)));
                }
            }
        }
    }
    if (skew) {
        const int period = (1 << skew) + 1;
        for (int h = threadIdx.x; h < (KP / period) * NV; h += THREADS) {
            put_b<T, BH>(bs, ((h / NV) * period + (1 << skew)) * NV + h % NV, typename T::storage(0));
        }
    }
}

template <typename T, int NV, int WARPS, bool BH>
__device__ __forceinline__ void stage_b(float* bs, const typename T::storage* __restrict__ B, int K, int KP, int skew,
                                        int N, int n0, long long ldb) {
    if (n0 == 0 && N == NV && ldb == NV && (K * NV) % 8 == 0 && (reinterpret_cast<unsigned long long>(B) & 15) == 0) {
        stage_b_contiguous<T, NV, WARPS, BH>(bs, B, K, KP, skew);
    } else {
        stage_b_general<T, NV, WARPS, BH>(bs, B, K, KP, skew, N, n0, ldb);
    }
}

// Group j of lane q's run into (v, d), or an empty group (value 0, delta 0) past the row's end.
template <int DB, int L>
__device__ __forceinline__ void load_group(const uint4* __restrict__ vals, const void* __restrict__ deltas, int base,
                                           int j, int groups, int q, uint4& v, typename DeltaWord<DB>::type& d) {
    if (j < groups) {
        const long long at = static_cast<long long>(base) + j * L + q;
        v = delta_ldg16(vals + at);
        d = DeltaWord<DB>::load(deltas, at);
    } else {
        v = make_uint4(0u, 0u, 0u, 0u);
        d = DeltaWord<DB>::zero();
    }
}

// One group of a lane's run: 8 entries, each a delta step of the running column (a byte offset
// into B's shared copy), a value, and an FMA per column into the even / odd accumulators (two
// chains: half the dependent FMA latency per group).
template <typename T, int NV, int DB, bool BH>
__device__ __forceinline__ void accumulate_group(const uint4& v, const typename DeltaWord<DB>::type& d, const float* bs,
                                                 int& col, float (&acc)[NV], float (&acc2)[NV]) {
    constexpr int SCALE = (BH ? 2 : 4) * NV;          // bytes per physical column of the B copy
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        col += DeltaWord<DB>::field(d, i) * SCALE;
        const float a = piece_value<T>(v, i);
        float b[NV];
        b_row<T, NV, BH>(bs, col, b);
#pragma unroll
        for (int t = 0; t < NV; ++t) {
            if (i & 1) acc2[t] = fmaf(a, b[t], acc2[t]);
            else acc[t] = fmaf(a, b[t], acc[t]);
        }
    }
}

// A row's sum over its L lanes into acc (acc2 folded in first; a fixed shuffle order: deterministic).
template <int NV, int L>
__device__ __forceinline__ void reduce_lanes(float (&acc)[NV], const float (&acc2)[NV], unsigned mask) {
#pragma unroll
    for (int t = 0; t < NV; ++t) acc[t] += acc2[t];
#pragma unroll
    for (int off = L / 2; off > 0; off >>= 1) {
#pragma unroll
        for (int t = 0; t < NV; ++t) acc[t] += __shfl_xor_sync(mask, acc[t], off, L);
    }
}

// C[row, n0 : n0 + NV] (the columns below N) from a finished row's sums.
template <typename T, int NV>
__device__ __forceinline__ void store_row(const float (&acc)[NV], int row, typename T::storage* __restrict__ C, int N,
                                          int n0, long long ldc) {
#pragma unroll
    for (int t = 0; t < NV; ++t) {
        if (n0 + t < N) C[static_cast<long long>(row) * ldc + n0 + t] = T::from_float(acc[t]);
    }
}

// B's strip into shared memory (while the first loads of A are in flight) and the two accumulators
// per column zeroed (even and odd entries: half the dependent FMA chain per group).
template <typename T, int NV, int WARPS, bool BH>
__device__ __forceinline__ void stage_and_zero(float* bs, const typename T::storage* __restrict__ B, int K, int KP,
                                               int skew, int N, int n0, long long ldb, float (&acc)[NV],
                                               float (&acc2)[NV]) {
    stage_b<T, NV, WARPS, BH>(bs, B, K, KP, skew, N, n0, ldb);
    __syncthreads();
#pragma unroll
    for (int t = 0; t < NV; ++t) acc[t] = acc2[t] = 0.0f;
}

// The first PIPE groups of a lane's stream in flight (empty past its end).
template <int DB, int L, int PIPE>
__device__ __forceinline__ void prime_groups(const uint4* __restrict__ vals, const void* __restrict__ deltas, int base,
                                             int steps, int q, uint4 (&v)[PIPE],
                                             typename DeltaWord<DB>::type (&d)[PIPE]) {
#pragma unroll
    for (int p = 0; p < PIPE; ++p) load_group<DB, L>(vals, deltas, base, p, steps, q, v[p], d[p]);
}

// Row `row`'s end (in pieces) and lane q's start column as a byte offset of B's copy, when the
// row is before `stop` (else end and col stay as they are): the kernels load it one row ahead, so a
// row change does not wait on its metadata.
template <int L, int SCALE>
__device__ __forceinline__ void row_meta(int row, int stop, const int* __restrict__ group_base,
                                         const int* __restrict__ starts, int q, int& end, int& col) {
    if (row < stop) {
        end = group_base[row + 1];
        col = starts[static_cast<long long>(row) * L + q] * SCALE;
    }
}

// A stream's groups through a ring of PIPE loads in flight (the next load issued as soon as its
// slot is consumed); `finish()` runs whenever a row's pieces are all consumed (pos == cur_end).
template <typename T, int NV, int L, int DB, int PIPE, bool BH, typename Finish>
__device__ __forceinline__ void stream_groups(const uint4* __restrict__ vals, const void* __restrict__ deltas, int base,
                                              int steps, int q, uint4 (&v)[PIPE],
                                              typename DeltaWord<DB>::type (&d)[PIPE], const float* bs, int& col,
                                              float (&acc)[NV], float (&acc2)[NV], int& pos, const int& cur_end,
                                              Finish& finish) {
    for (int s0 = 0; s0 < steps; s0 += PIPE) {
#pragma unroll
        for (int p = 0; p < PIPE; ++p) {
            if (s0 + p < steps) {
                accumulate_group<T, NV, DB, BH>(v[p], d[p], bs, col, acc, acc2);
                load_group<DB, L>(vals, deltas, base, s0 + p + PIPE, steps, q, v[p], d[p]);
                pos += L;
                if (pos == cur_end) finish();
            }
        }
    }
}

// A row cut between streams (ROW_SPLIT): each of its contributors a..b writes its partial sum to
// ws and counts itself in counters[a]; the last to arrive adds the partials in stream order (fixed:
// deterministic, whoever arrives last), stores the row, and resets the counter for the next launch.
// Stream a wrote its part as its tail (slot 1), the later streams as their head (slot 0).
template <typename T, int NV>
__device__ __forceinline__ void combine_part(const float (&acc)[NV], int row, int a, int b, int slot, int sw, int streams,
                                             float* __restrict__ ws, int* __restrict__ counters,
                                             typename T::storage* __restrict__ C, int N, int n0, long long ldc) {
    float* base = ws + static_cast<long long>(blockIdx.y) * streams * 16;
#pragma unroll
    for (int t = 0; t < NV; ++t) base[(sw * 2 + slot) * 8 + t] = acc[t];
    __threadfence();
    int* count = counters + static_cast<long long>(blockIdx.y) * streams + a;
    if (atomicAdd(count, 1) == b - a) {
        __threadfence();
        float sum[NV];
#pragma unroll
        for (int t = 0; t < NV; ++t) sum[t] = 0.0f;
        for (int c = a; c <= b; ++c) {
#pragma unroll
            for (int t = 0; t < NV; ++t) sum[t] += __ldcg(base + (c * 2 + (c == a ? 1 : 0)) * 8 + t);
        }
#pragma unroll
        for (int t = 0; t < NV; ++t) {
            if (n0 + t < N) C[static_cast<long long>(row) * ldc + n0 + t] = T::from_float(sum[t]);
        }
        *count = 0;
    }
}

// Two kernels share the helpers above. delta_spmv cuts streams at row ends only (the default); its
// body is session 19's measured kernel plus the 16-bit B copy. delta_spmv_rs (ROW_SPLIT) also cuts
// inside rows and has four more arguments. They were one kernel with ROW_SPLIT as a template flag
// until session 20, when the H200 showed the flag-off instantiation 1.15-1.4x slower at N = 1 than
// the kernel it was written from (same grid, registers and bytes, instructions within 2%; ncu:
// 9.6 vs 6.9 us on 4096x4096 90%); the cause was not found, a separate kernel removes it.
template <typename T, int NV, int L, int DB, int WARPS, int PIPE, int MINB, bool BH>
__global__ void __launch_bounds__(WARPS * 32, MINB)
delta_spmv(const uint4* __restrict__ vals, const void* __restrict__ deltas, const int* __restrict__ starts,
           const int* __restrict__ group_base, const int2* __restrict__ split,
           const typename T::storage* __restrict__ B, typename T::storage* __restrict__ C, int M, int K, int KP,
           int skew, int N, long long ldb, long long ldc) {
    static_assert(NV == 1 || NV == 2 || NV == 4 || NV == 8, "NV in 1, 2, 4, 8");
    static_assert(L == 4 || L == 8 || L == 16 || L == 32, "L in 4, 8, 16, 32");
    typedef DeltaWord<DB> DW;
    constexpr int SUBS = 32 / L;                      // sub-warps (one row at a time each) per warp
    extern __shared__ __align__(16) float bs[];      // B[:, n0 : n0 + NV], KP x NV (skewed rows): fp32, or BH 16-bit
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int q = lane % L, sub = lane / L;
    const unsigned mask = L == 32 ? 0xffffffffu : (((1u << L) - 1u) << (sub * L));
    const int n0 = blockIdx.y * NV;
    // This sub-warp's stream: rows [split[sw].x, split[sw + 1].x), whose pieces are contiguous,
    // [split[sw].y, split[sw + 1].y). One stream per sub-warp instead of a grid-stride loop over
    // rows: the PIPE loads in flight carry on across row ends, so a row no longer pays the
    // pipeline's fill and drain (two memory latencies per row at 8 groups per lane).
    const int sw = (blockIdx.x * WARPS + warp) * SUBS + sub;
    const int2 lo = split[sw], hi = split[sw + 1];
    int row = lo.x;
    const int row_end = hi.x;
    const int steps = (hi.y - lo.y) / L;
    uint4 v[PIPE];
    typename DW::type d[PIPE];
    prime_groups<DB, L, PIPE>(vals, deltas, lo.y, steps, q, v, d);
    // The current row's end (in pieces) and lane start, and the next row's: loaded one row ahead,
    // so a row change does not wait on its metadata.
    constexpr int SCALE = (BH ? 2 : 4) * NV;          // bytes per physical column of the B copy
    int cur_end = 0, col = 0, nxt_end = 0, nxt_col = 0;   // col: the running column, as a byte offset
    row_meta<L, SCALE>(row, row_end, group_base, starts, q, cur_end, col);
    row_meta<L, SCALE>(row + 1, row_end, group_base, starts, q, nxt_end, nxt_col);
    float acc[NV], acc2[NV];                          // even / odd entries' sums per column
    stage_and_zero<T, NV, WARPS, BH>(bs, B, K, KP, skew, N, n0, ldb, acc, acc2);
    int pos = lo.y;                                   // pieces of the stream consumed (uniform in the sub-warp)
    // Every row whose pieces are all consumed: reduce its L lanes (fixed order: deterministic),
    // store, move to the next row. Empty rows store zeros.
    auto finish_rows = [&]() {
        while (row < row_end && pos == cur_end) {
            reduce_lanes<NV, L>(acc, acc2, mask);
            if (q == 0) store_row<T, NV>(acc, row, C, N, n0, ldc);
#pragma unroll
            for (int t = 0; t < NV; ++t) acc[t] = acc2[t] = 0.0f;
            ++row;
            col = nxt_col;
            cur_end = nxt_end;
            row_meta<L, SCALE>(row + 1, row_end, group_base, starts, q, nxt_end, nxt_col);
        }
    };
    finish_rows();
    stream_groups<T, NV, L, DB, PIPE, BH>(vals, deltas, lo.y, steps, q, v, d, bs, col, acc, acc2, pos, cur_end,
                                          finish_rows);
}


template <typename T, int NV, int L, int DB, int WARPS, int PIPE, int MINB, bool BH>
__global__ void __launch_bounds__(WARPS * 32, MINB)
delta_spmv_rs(const uint4* __restrict__ vals, const void* __restrict__ deltas, const int* __restrict__ starts,
           const int* __restrict__ group_base, const int2* __restrict__ split, const int2* __restrict__ heads,
           const int* __restrict__ head_cols, float* __restrict__ ws, int* __restrict__ counters,
           const typename T::storage* __restrict__ B, typename T::storage* __restrict__ C, int M, int K, int KP,
           int skew, int N, long long ldb, long long ldc, int streams) {
    static_assert(NV == 1 || NV == 2 || NV == 4 || NV == 8, "NV in 1, 2, 4, 8");
    static_assert(L == 4 || L == 8 || L == 16 || L == 32, "L in 4, 8, 16, 32");
    typedef DeltaWord<DB> DW;
    constexpr int SUBS = 32 / L;                      // sub-warps (one row at a time each) per warp
    extern __shared__ __align__(16) float bs[];      // B[:, n0 : n0 + NV], KP x NV (skewed rows): fp32, or BH 16-bit
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int q = lane % L, sub = lane / L;
    const unsigned mask = L == 32 ? 0xffffffffu : (((1u << L) - 1u) << (sub * L));
    const int n0 = blockIdx.y * NV;
    // The stream as in delta_spmv (this set-up repeats its lines on purpose: moving them into a
    // shared helper changed delta_spmv's SASS, and delta_spmv's code is kept as measured).
    // ROW_SPLIT: the cuts are at group boundaries inside rows (balanced to a group, not to a row);
    // heads[sw] = (a, b) when this stream starts inside a row cut among streams a..b (else a < 0),
    // head_cols[sw * L + q] is lane q's running column there, and a stream whose end is inside a
    // row also works on that row (row_stop), leaving its part to combine_part.
    const int sw = (blockIdx.x * WARPS + warp) * SUBS + sub;
    const int2 lo = split[sw], hi = split[sw + 1];
    int row = lo.x;
    const int row_end = hi.x;
    const int steps = (hi.y - lo.y) / L;
    int2 head = make_int2(-1, -1), next_head = make_int2(-1, -1);
    head = heads[sw];
    next_head = heads[sw + 1];
    const int row_stop = row_end + (next_head.x >= 0 ? 1 : 0);
    uint4 v[PIPE];
    typename DW::type d[PIPE];
    prime_groups<DB, L, PIPE>(vals, deltas, lo.y, steps, q, v, d);
    // The current row's end (in pieces) and lane start, and the next row's: loaded one row ahead,
    // so a row change does not wait on its metadata.
    constexpr int SCALE = (BH ? 2 : 4) * NV;          // bytes per physical column of the B copy
    int cur_end = 0, col = 0, nxt_end = 0, nxt_col = 0;   // col: the running column, as a byte offset
    if (row < row_stop) {
        cur_end = group_base[row + 1];
        col = (head.x >= 0 ? head_cols[static_cast<long long>(sw) * L + q]
                           : starts[static_cast<long long>(row) * L + q]) * SCALE;
    }
    row_meta<L, SCALE>(row + 1, row_stop, group_base, starts, q, nxt_end, nxt_col);
    float acc[NV], acc2[NV];
    stage_and_zero<T, NV, WARPS, BH>(bs, B, K, KP, skew, N, n0, ldb, acc, acc2);
    int pos = lo.y;
    // Rows finished as in delta_spmv, the ends of cut rows through combine_part.
    auto finish_rows = [&]() {
        while (row < row_end && pos == cur_end) {
            reduce_lanes<NV, L>(acc, acc2, mask);
            if (q == 0) {
                if (head.x >= 0 && row == lo.x) {      // the end of a row begun upstream
                    combine_part<T, NV>(acc, row, head.x, head.y, 0, sw, streams, ws, counters, C, N, n0, ldc);
                } else {
                    store_row<T, NV>(acc, row, C, N, n0, ldc);
                }
            }
#pragma unroll
            for (int t = 0; t < NV; ++t) acc[t] = acc2[t] = 0.0f;
            ++row;
            col = nxt_col;
            cur_end = nxt_end;
            row_meta<L, SCALE>(row + 1, row_stop, group_base, starts, q, nxt_end, nxt_col);
        }
    };
    finish_rows();
    stream_groups<T, NV, L, DB, PIPE, BH>(vals, deltas, lo.y, steps, q, v, d, bs, col, acc, acc2, pos, cur_end,
                                          finish_rows);
    if (next_head.x >= 0) {     // the stream ends inside row hi.x: leave its part
        reduce_lanes<NV, L>(acc, acc2, mask);
        if (q == 0) {
            if (head.x >= 0 && row == lo.x) {  // the whole stream inside one row: it is a head part
                combine_part<T, NV>(acc, row, head.x, head.y, 0, sw, streams, ws, counters, C, N, n0, ldc);
            } else {
                combine_part<T, NV>(acc, row, sw, next_head.y, 1, sw, streams, ws, counters, C, N, n0, ldc);
            }
        }
    }
}

// Explicit instantiations for nvcc -cubin in the CPU tests (CuPy's name_expressions instantiate
// the same set through NVRTC).
#define SD_DELTA(T, NV, L, DB, MB, BH) template __global__ void delta_spmv<T, NV, L, DB, 8, 4, MB, BH>( \
    const uint4*, const void*, const int*, const int*, const int2*, const T::storage*, T::storage*, int, int, int, \
    int, int, long long, long long);
#define SD_DELTA_RS(T, NV, L, DB, MB, BH) template __global__ void delta_spmv_rs<T, NV, L, DB, 8, 4, MB, BH>( \
    const uint4*, const void*, const int*, const int*, const int2*, const int2*, const int*, float*, int*, \
    const T::storage*, T::storage*, int, int, int, int, int, long long, long long, int);
// NV = 8 runs without the register cap (delta_spmv.py, min_ctas): under it, it spills (ptxas, sm_90).
#ifdef SPARSEDITTO_INSTANTIATE_ALL   // every NV, L and delta width at least once, both value types, both kernels
SD_DELTA(F16, 1, 32, 4, 3, false) SD_DELTA_RS(F16, 2, 16, 8, 3, true) SD_DELTA_RS(F16, 4, 8, 4, 3, false)
SD_DELTA(F16, 8, 4, 8, 1, true) SD_DELTA_RS(BF16, 1, 4, 4, 3, false) SD_DELTA_RS(BF16, 8, 32, 8, 1, false)
SD_DELTA(BF16, 4, 32, 4, 3, true)
#endif
