// Row-decomposed CSR SpMM for graphs and scientific matrices (CUDA C++, compiled through CuPy/NVRTC or nvcc).
//
// C[M, N] = A @ B; A in CSR (int32 column ids, values fp32/fp16/bf16) plus a list of work items made at
// prepare time (sparseditto/row_items.py): item = (row, start, end, slot), at most CHUNK nonzeros,
// ordered longest first or by row. B and C dense with row strides ldb / ldc and unit column stride.
//
//   csr_rowdecomp_items<T, VEC, LANES, UNROLL>: a group of LANES lanes (a warp holds 32 / LANES
//       groups) owns one item and a strip of LANES * VEC columns (grid.y walks the strips). The group
//       loads LANES of the item's (column id, value) pairs at once, one per lane, coalesced; then for
//       each pair, broadcast with a group-wide __shfl_sync, every lane loads its VEC columns of that B
//       row (one 8/16-byte vector per 4/8 values when aligned) and accumulates in fp32. UNROLL pairs are
//       broadcast before their B loads are issued, so a lane has UNROLL row loads in flight.
//       slot < 0: the item is its row's only one and writes the row of C (zeros for an empty row);
//       otherwise it writes its fp32 partial row to partials[slot].
//   csr_rowdecomp_stream<T, VEC, LANES, UNROLL>: the same sums, but a group walks several items as a
//       software pipeline: the next item's first LANES (column, value) pairs and the header of the one
//       after are loaded before this item's B rows, so only the B loads stay on a group's critical path.
//       block_items 0: group g of G in the grid takes items g, g + G, ... (a mix of long and short items
//       each, for the longest-first order); block_items > 0: block b owns items [b * block_items, ...) and
//       its P groups take every P-th of them (neighbouring rows, which on a mesh share B rows, run on one
//       SM at once, so its L1 serves the shared rows). Why: one item per group pays three dependent round trips (header, pairs,
//       B rows) per item and wave; on the H200 the 2-D Laplacian at N = 128 (32761 one-row items, 5.6
//       waves) moved its 36 MB at 1.9 TB/s (session 30).
//   csr_rowdecomp_fixup<T, VEC>: a warp per split row and 32 * VEC columns sums that row's partial rows
//       in slot order (nonzero order) and writes C: the same sum whatever order the items ran in.
// The value types and load_row_strip come from dtypes.cuh, inlined in front of this file.

template <typename T, int VEC>
__device__ __forceinline__ void store_row_strip(typename T::storage* __restrict__ p, int n0, int N, bool vec_ok,
                                                const float (&acc)[VEC]) {
    typedef typename T::storage S;
    if (vec_ok && n0 + VEC <= N) {
        Pack<S, VEC> pk;
#pragma unroll
        for (int t = 0; t < VEC; ++t) pk.v[t] = T::from_float(acc[t]);
        *reinterpret_cast<Pack<S, VEC>*>(p + n0) = pk;
    } else {
#pragma unroll
        for (int t = 0; t < VEC; ++t) {
            if (n0 + t < N) p[n0 + t] = T::from_float(acc[t]);
        }
    }
}

// The shuffle mask of this thread's group of LANES neighbouring lanes.
template <int LANES>
__device__ __forceinline__ unsigned lane_group_mask() {
    static_assert(LANES >= 1 && LANES <= 32 && (LANES & (LANES - 1)) == 0, "LANES: power of two <= 32");
    return LANES == 32 ? 0xffffffffu : (((1u << LANES) - 1u) << ((threadIdx.x & 31) & ~(LANES - 1)));
}

// One item's sum over its nonzeros into acc. Pairs come LANES at a time, one per lane, coalesced;
// UNROLL of them are broadcast before their B rows are loaded (VEC columns a lane). PRELOADED: the
// first pass's pair is the caller's (first_col, first_val), loaded ahead of time.
template <typename T, int VEC, int LANES, int UNROLL, bool PRELOADED>
__device__ __forceinline__ void item_sum(const int4 it, int first_col, float first_val,
                                         const int* __restrict__ indices,
                                         const typename T::storage* __restrict__ values,
                                         const typename T::storage* __restrict__ B, int n0, int N, long long ldb,
                                         bool cols, bool b_vec, unsigned group, int sub, float (&acc)[VEC]) {
    static_assert(VEC == 1 || VEC == 2 || VEC == 4 || VEC == 8, "VEC: 1, 2, 4 or 8");
    for (int base = it.y; base < it.z; base += LANES) {
        const int k = base + sub;
        int my_col;
        float my_val;
        if (PRELOADED && base == it.y) {
            my_col = first_col;
            my_val = first_val;
        } else {
            my_col = k < it.z ? indices[k] : 0;
            my_val = k < it.z ? T::to_float(values[k]) : 0.0f;
        }
        const int count = min(LANES, it.z - base);
        for (int j = 0; j < count; j += UNROLL) {
            int col[UNROLL];
            float v[UNROLL];
            float b[UNROLL][VEC];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                col[u] = __shfl_sync(group, my_col, (j + u) & (LANES - 1), LANES);
                v[u] = __shfl_sync(group, my_val, (j + u) & (LANES - 1), LANES);
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                if (cols && j + u < count) {
                    load_row_strip<T, VEC>(B + static_cast<long long>(col[u]) * ldb, n0, N, b_vec, b[u]);
                } else {
                    v[u] = 0.0f;
#pragma unroll
                    for (int t = 0; t < VEC; ++t) b[u][t] = 0.0f;
                }
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
                for (int t = 0; t < VEC; ++t) acc[t] = fmaf(v[u], b[u][t], acc[t]);
            }
        }
    }
}

// An item's sum to its row of C (slot < 0: the row's only item) or to its fp32 partial row.
template <typename T, int VEC>
__device__ __forceinline__ void item_store(const int4 it, float* __restrict__ partials, int pstride,
                                           typename T::storage* __restrict__ C, long long ldc, int n0, int N,
                                           bool c_vec, const float (&acc)[VEC]) {
    if (it.w < 0) {
        store_row_strip<T, VEC>(C + static_cast<long long>(it.x) * ldc, n0, N, c_vec, acc);
    } else {
        Pack<float, VEC> pk;
#pragma unroll
        for (int t = 0; t < VEC; ++t) pk.v[t] = acc[t];
        *reinterpret_cast<Pack<float, VEC>*>(partials + static_cast<long long>(it.w) * pstride + n0) = pk;
    }
}

// The arguments both item kernels take after their item list (the stream kernel adds block_items).
// vec_ok bit 0: B's vector loads are aligned; bit 1: C's vector stores are. Partial rows are
// pstride (a multiple of 8) floats apart and always aligned.
#define SD_RD_OPERANDS                                                                                  \
    const int* __restrict__ indices, const typename T::storage* __restrict__ values,                   \
        float* __restrict__ partials, int pstride, const typename T::storage* __restrict__ B,          \
        typename T::storage* __restrict__ C, int N, long long ldb, long long ldc, int vec_ok

template <typename T, int VEC, int LANES, int UNROLL>
__global__ void csr_rowdecomp_items(const int4* __restrict__ items, int n_items, SD_RD_OPERANDS) {
    const int sub = threadIdx.x & (LANES - 1);
    const unsigned group = lane_group_mask<LANES>();
    const int item = blockIdx.x * (blockDim.x / LANES) + threadIdx.x / LANES;
    if (item >= n_items) return;  // the whole group leaves: no shuffle ever names it
    const int4 it = items[item];  // row, start, end, slot
    const int n0 = (blockIdx.y * LANES + sub) * VEC;
    const bool cols = n0 < N;
    float acc[VEC];
#pragma unroll
    for (int t = 0; t < VEC; ++t) acc[t] = 0.0f;
    item_sum<T, VEC, LANES, UNROLL, false>(it, 0, 0.0f, indices, values, B, n0, N, ldb, cols, (vec_ok & 1) != 0,
                                           group, sub, acc);
    if (!cols) return;
    item_store<T, VEC>(it, partials, pstride, C, ldc, n0, N, (vec_ok & 2) != 0, acc);
}

// csr_rowdecomp_items' arguments and block_items (above); the grid may hold fewer groups than items.
template <typename T, int VEC, int LANES, int UNROLL>
__global__ void csr_rowdecomp_stream(const int4* __restrict__ items, int n_items, int block_items, SD_RD_OPERANDS) {
    const int sub = threadIdx.x & (LANES - 1);
    const unsigned group = lane_group_mask<LANES>();
    const int per_block = blockDim.x / LANES;
    int first, stride, end;
    if (block_items > 0) {
        const long long lo = static_cast<long long>(blockIdx.x) * block_items;
        first = static_cast<int>(lo) + threadIdx.x / LANES;
        stride = per_block;
        end = static_cast<int>(min(lo + block_items, static_cast<long long>(n_items)));
    } else {
        first = blockIdx.x * per_block + threadIdx.x / LANES;
        stride = gridDim.x * per_block;
        end = n_items;
    }
    if (first >= end) return;  // the whole group leaves: every group-uniform loop below stays group-uniform
    const int n0 = (blockIdx.y * LANES + sub) * VEC;
    const bool cols = n0 < N;
    const bool b_vec = (vec_ok & 1) != 0;
    const bool c_vec = (vec_ok & 2) != 0;
    int4 cur = items[first];  // row, start, end, slot
    int cur_col = 0;
    float cur_val = 0.0f;
    if (cur.y + sub < cur.z) {
        cur_col = indices[cur.y + sub];
        cur_val = T::to_float(values[cur.y + sub]);
    }
    // item positions in 64 bits: item + 2 * stride may pass INT_MAX on the last steps of a large grid
    bool has_next = first + static_cast<long long>(stride) < end;
    int4 next = make_int4(0, 0, 0, -1);
    if (has_next) next = items[first + stride];
    for (long long item = first; item < end; item += stride) {
        // loads issued ahead of this item's B rows: the next item's first pairs, the header after it
        int next_col = 0;
        float next_val = 0.0f;
        int4 after = make_int4(0, 0, 0, -1);
        const long long after_at = item + 2LL * stride;
        const bool has_after = after_at < end;
        if (has_next && next.y + sub < next.z) {
            next_col = indices[next.y + sub];
            next_val = T::to_float(values[next.y + sub]);
        }
        if (has_after) after = items[after_at];
        float acc[VEC];
#pragma unroll
        for (int t = 0; t < VEC; ++t) acc[t] = 0.0f;
        item_sum<T, VEC, LANES, UNROLL, true>(cur, cur_col, cur_val, indices, values, B, n0, N, ldb, cols, b_vec,
                                              group, sub, acc);
        if (cols) item_store<T, VEC>(cur, partials, pstride, C, ldc, n0, N, c_vec, acc);
        cur = next;
        cur_col = next_col;
        cur_val = next_val;
        next = after;
        has_next = has_after;
    }
}

template <typename T, int VEC>
__global__ void csr_rowdecomp_fixup(const int* __restrict__ fix_rows, const int* __restrict__ fix_ptr, int n_fix,
                                    const float* __restrict__ partials, int pstride,
                                    typename T::storage* __restrict__ C, int N, long long ldc, int vec_ok) {
    const int f = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int n0 = (blockIdx.y * 32 + (threadIdx.x & 31)) * VEC;
    if (f >= n_fix || n0 >= N) return;
    float acc[VEC];
#pragma unroll
    for (int t = 0; t < VEC; ++t) acc[t] = 0.0f;
    const int end = fix_ptr[f + 1];
    for (int s = fix_ptr[f]; s < end; ++s) {
        const Pack<float, VEC> pk = *reinterpret_cast<const Pack<float, VEC>*>(
            partials + static_cast<long long>(s) * pstride + n0);
#pragma unroll
        for (int t = 0; t < VEC; ++t) acc[t] += pk.v[t];
    }
    store_row_strip<T, VEC>(C + static_cast<long long>(fix_rows[f]) * ldc, n0, N, (vec_ok & 2) != 0, acc);
}

// Explicit instantiations: nvcc -c / -ptx then compiles every kernel the Python side can launch
// (CuPy's name_expressions instantiate the same set through NVRTC).
#define SD_RD_ITEMS(T, V, L, U) template __global__ void csr_rowdecomp_items<T, V, L, U>( \
    const int4*, int, const int*, const T::storage*, float*, int, const T::storage*, T::storage*, int, long long, \
    long long, int);
#define SD_RD_STREAM(T, V, L, U) template __global__ void csr_rowdecomp_stream<T, V, L, U>( \
    const int4*, int, int, const int*, const T::storage*, float*, int, const T::storage*, T::storage*, int, \
    long long, long long, int);
#define SD_RD_BOTH(T, V, L, U) SD_RD_ITEMS(T, V, L, U) SD_RD_STREAM(T, V, L, U)
#define SD_RD_L(T, V, U) SD_RD_BOTH(T, V, 1, U) SD_RD_BOTH(T, V, 2, U) SD_RD_BOTH(T, V, 4, U) \
    SD_RD_BOTH(T, V, 8, U) SD_RD_BOTH(T, V, 16, U) SD_RD_BOTH(T, V, 32, U)
#define SD_RD_V(T, U) SD_RD_L(T, 1, U) SD_RD_L(T, 2, U) SD_RD_L(T, 4, U) SD_RD_L(T, 8, U)
#define SD_RD_FIX(T, V) template __global__ void csr_rowdecomp_fixup<T, V>( \
    const int*, const int*, int, const float*, int, T::storage*, int, long long, int);
#define SD_RD_ALL(T) SD_RD_V(T, 2) SD_RD_V(T, 4) SD_RD_V(T, 8) \
    SD_RD_FIX(T, 1) SD_RD_FIX(T, 2) SD_RD_FIX(T, 4) SD_RD_FIX(T, 8)
#ifdef SPARSEDITTO_INSTANTIATE_ALL
SD_RD_ALL(F32) SD_RD_ALL(F16) SD_RD_ALL(BF16)
#endif
