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

// vec_ok bit 0: B's vector loads are aligned; bit 1: C's vector stores are. Partial rows are
// pstride (a multiple of 8) floats apart and always aligned.
template <typename T, int VEC, int LANES, int UNROLL>
__global__ void csr_rowdecomp_items(const int4* __restrict__ items, int n_items, const int* __restrict__ indices,
                                    const typename T::storage* __restrict__ values, float* __restrict__ partials,
                                    int pstride, const typename T::storage* __restrict__ B,
                                    typename T::storage* __restrict__ C, int N, long long ldb, long long ldc,
                                    int vec_ok) {
    static_assert(LANES >= 1 && LANES <= 32 && (LANES & (LANES - 1)) == 0, "LANES: power of two <= 32");
    static_assert(VEC == 1 || VEC == 2 || VEC == 4 || VEC == 8, "VEC: 1, 2, 4 or 8");
    const int lane = threadIdx.x & 31;
    const int sub = threadIdx.x & (LANES - 1);
    const unsigned group = LANES == 32 ? 0xffffffffu : (((1u << LANES) - 1u) << (lane & ~(LANES - 1)));
    const int item = blockIdx.x * (blockDim.x / LANES) + threadIdx.x / LANES;
    if (item >= n_items) return;  // the whole group leaves: no shuffle ever names it
    const int4 it = items[item];  // row, start, end, slot
    const int n0 = (blockIdx.y * LANES + sub) * VEC;
    const bool cols = n0 < N;
    const bool b_vec = (vec_ok & 1) != 0;
    float acc[VEC];
#pragma unroll
    for (int t = 0; t < VEC; ++t) acc[t] = 0.0f;
    for (int base = it.y; base < it.z; base += LANES) {
        const int k = base + sub;
        const int my_col = k < it.z ? indices[k] : 0;
        const float my_val = k < it.z ? T::to_float(values[k]) : 0.0f;
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
    if (!cols) return;
    if (it.w < 0) {
        store_row_strip<T, VEC>(C + static_cast<long long>(it.x) * ldc, n0, N, (vec_ok & 2) != 0, acc);
    } else {
        Pack<float, VEC> pk;
#pragma unroll
        for (int t = 0; t < VEC; ++t) pk.v[t] = acc[t];
        *reinterpret_cast<Pack<float, VEC>*>(partials + static_cast<long long>(it.w) * pstride + n0) = pk;
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
#define SD_RD_L(T, V, U) SD_RD_ITEMS(T, V, 1, U) SD_RD_ITEMS(T, V, 2, U) SD_RD_ITEMS(T, V, 4, U) \
    SD_RD_ITEMS(T, V, 8, U) SD_RD_ITEMS(T, V, 16, U) SD_RD_ITEMS(T, V, 32, U)
#define SD_RD_V(T, U) SD_RD_L(T, 1, U) SD_RD_L(T, 2, U) SD_RD_L(T, 4, U) SD_RD_L(T, 8, U)
#define SD_RD_FIX(T, V) template __global__ void csr_rowdecomp_fixup<T, V>( \
    const int*, const int*, int, const float*, int, T::storage*, int, long long, int);
#define SD_RD_ALL(T) SD_RD_V(T, 2) SD_RD_V(T, 4) SD_RD_V(T, 8) \
    SD_RD_FIX(T, 1) SD_RD_FIX(T, 2) SD_RD_FIX(T, 4) SD_RD_FIX(T, 8)
#ifdef SPARSEDITTO_INSTANTIATE_ALL
SD_RD_ALL(F32) SD_RD_ALL(F16) SD_RD_ALL(BF16)
#endif
