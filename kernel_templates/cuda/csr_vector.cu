// CSR "vector" SpMM kernels for SparseDitto (CUDA C++, compiled through CuPy/NVRTC or nvcc).
//
// C[M, N] = A[M, K] @ B[K, N]; A in CSR (int32 indptr, int32 column ids), B and C dense with a row
// stride (ldb, ldc) and unit column stride; values in fp32, fp16 or bf16; fp32 accumulation.
//
// Two thread layouts, because the best one depends on N:
//   csr_vector_nnz<T, GROUP, TILE_N>   small N (SpMV, decode): a group of GROUP lanes of one warp
//       shares a row; each lane takes every GROUP-th nonzero of the row and accumulates TILE_N
//       columns of C in registers; a shuffle reduction inside the group combines the lanes. The
//       row's nonzeros are read with coalesced loads across the group; the loop is unrolled 4
//       deep so a lane has several (column id -> B row) load chains in flight at once.
//   csr_vector_cols<T, VEC>            larger N: a warp per row and a strip of 32*VEC columns; the
//       warp loads 32 nonzeros at a time (one per lane, coalesced), broadcasts each (column, value)
//       with __shfl_sync, and every lane multiplies it into its VEC consecutive columns of B,
//       loaded as one 8/16-byte vector when B is aligned (checked by the host: vec_ok).
// The value types (F32, F16, BF16) and load_row_strip come from dtypes.cuh, inlined in front of
// this file (the candidate's CUDA_SRC is the two texts, in that order).

template <typename T, int GROUP, int TILE_N>
__global__ void csr_vector_nnz(const int* __restrict__ indptr, const int* __restrict__ indices,
                               const typename T::storage* __restrict__ values,
                               const typename T::storage* __restrict__ B, typename T::storage* __restrict__ C,
                               int M, int N, long long ldb, long long ldc, int vec_ok) {
    static_assert(GROUP >= 1 && GROUP <= 32 && (GROUP & (GROUP - 1)) == 0, "GROUP: power of two <= 32");
    const int lane = threadIdx.x % GROUP;
    const int row = blockIdx.x * (blockDim.x / GROUP) + threadIdx.x / GROUP;
    const int n0 = blockIdx.y * TILE_N;
    float acc[TILE_N];
#pragma unroll
    for (int t = 0; t < TILE_N; ++t) acc[t] = 0.0f;
    // Rows past M do no work but stay for the shuffles (the whole warp must take part).
    if (row < M) {
        const int start = indptr[row];
        const int end = indptr[row + 1];
#pragma unroll 4
        for (int k = start + lane; k < end; k += GROUP) {
            const float v = T::to_float(values[k]);
            float b[TILE_N];
            load_row_strip<T, TILE_N>(B + static_cast<long long>(indices[k]) * ldb, n0, N, vec_ok != 0, b);
#pragma unroll
            for (int t = 0; t < TILE_N; ++t) acc[t] = fmaf(v, b[t], acc[t]);
        }
    }
#pragma unroll
    for (int offset = GROUP / 2; offset > 0; offset /= 2) {
#pragma unroll
        for (int t = 0; t < TILE_N; ++t) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], offset, GROUP);
    }
    if (row < M) {
        typename T::storage* c = C + static_cast<long long>(row) * ldc;
#pragma unroll
        for (int t = 0; t < TILE_N; ++t) {
            if (t % GROUP == lane && n0 + t < N) c[n0 + t] = T::from_float(acc[t]);
        }
    }
}

template <typename T, int VEC>
__global__ void csr_vector_cols(const int* __restrict__ indptr, const int* __restrict__ indices,
                                const typename T::storage* __restrict__ values,
                                const typename T::storage* __restrict__ B, typename T::storage* __restrict__ C,
                                int M, int N, long long ldb, long long ldc, int vec_ok) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= M) return;  // uniform per warp: every lane of a warp has the same row
    const int n0 = blockIdx.y * (32 * VEC) + lane * VEC;
    const int start = indptr[row];
    const int end = indptr[row + 1];
    float acc[VEC];
#pragma unroll
    for (int t = 0; t < VEC; ++t) acc[t] = 0.0f;
    for (int base = start; base < end; base += 32) {
        const int k = base + lane;
        const int my_col = (k < end) ? indices[k] : 0;
        const float my_val = (k < end) ? T::to_float(values[k]) : 0.0f;
        const int count = (end - base) < 32 ? (end - base) : 32;
        for (int j = 0; j < count; ++j) {
            const int col = __shfl_sync(0xffffffffu, my_col, j);
            const float v = __shfl_sync(0xffffffffu, my_val, j);
            if (n0 < N) {
                float b[VEC];
                load_row_strip<T, VEC>(B + static_cast<long long>(col) * ldb, n0, N, vec_ok != 0, b);
#pragma unroll
                for (int t = 0; t < VEC; ++t) acc[t] = fmaf(v, b[t], acc[t]);
            }
        }
    }
    typename T::storage* c = C + static_cast<long long>(row) * ldc;
#pragma unroll
    for (int t = 0; t < VEC; ++t) {
        if (n0 + t < N) c[n0 + t] = T::from_float(acc[t]);
    }
}

// Explicit instantiations: nvcc -c / -ptx then compiles every kernel the Python side can launch
// (CuPy's name_expressions instantiate the same set through NVRTC).
#define SD_NNZ(T, G, TN) template __global__ void csr_vector_nnz<T, G, TN>( \
    const int*, const int*, const T::storage*, const T::storage*, T::storage*, int, int, long long, long long, int);
#define SD_NNZ_G(T, G) SD_NNZ(T, G, 1) SD_NNZ(T, G, 2) SD_NNZ(T, G, 4) SD_NNZ(T, G, 8) SD_NNZ(T, G, 16)
#define SD_NNZ_ALL(T) SD_NNZ_G(T, 2) SD_NNZ_G(T, 4) SD_NNZ_G(T, 8) SD_NNZ_G(T, 16) SD_NNZ_G(T, 32)
#define SD_COLS(T, V) template __global__ void csr_vector_cols<T, V>( \
    const int*, const int*, const T::storage*, const T::storage*, T::storage*, int, int, long long, long long, int);
#ifdef SPARSEDITTO_INSTANTIATE_ALL
SD_NNZ_ALL(F32) SD_NNZ_ALL(F16) SD_NNZ_ALL(BF16)
SD_COLS(F32, 1) SD_COLS(F32, 2) SD_COLS(F32, 4)
SD_COLS(F16, 1) SD_COLS(F16, 2) SD_COLS(F16, 4) SD_COLS(F16, 8)
SD_COLS(BF16, 1) SD_COLS(BF16, 2) SD_COLS(BF16, 4) SD_COLS(BF16, 8)
#endif
