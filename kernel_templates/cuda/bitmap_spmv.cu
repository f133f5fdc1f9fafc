// Row-bitmap SpMV / skinny SpMM for decode (N <= 8) on the CUDA cores (SparseDitto, CUDA C++).
//
// C[M, N] = A[M, K] @ B[K, N]. A is a row bitmap (sparseditto.formats.BitmapTiles, tile_k = 32):
// one 32-bit mask per row and 32 columns (bit j of word w <-> column 32w + j), the kept values
// row-major in ascending column order plus one trailing zero (the value every empty slot reads),
// and an int32 offset per row and span of 1024 columns (32 words) saying where the span's values
// start. That is nnz*vb + M*ceil(K/32)*4 + M*ceil(K/1024)*4 bytes: 1.125 bytes per element of a 50%
// fp16 weight against 2 for the dense weight and 2 for CSR with int16 column ids, so at decode
// sizes, where the time is the bytes over the bandwidth, it is the smallest exact format from ~25%
// to ~90% sparsity.
//
// Thread layout (one CTA = SPLIT warps on the same ROWS rows; a warp takes every SPLIT-th span):
//   * lane l loads word l of the span for each row (one coalesced 128-byte load), and a warp scan
//     of the popcounts gives every word's value offset inside the span;
//   * in step j (0..31) lane l owns column 32*(32s + j) + l: word j and its offset come by
//     __shfl_sync from lane j, the lane's value is at offset + popc(word & below(l)); lanes whose bit
//     is clear read the trailing zero instead, so there is no branch and a whole batch of steps'
//     loads (values, and B's rows for those columns) is issued before the first multiply: a warp
//     keeps BATCH * (ROWS + NV) loads in flight rather than one dependent chain per step;
//   * each lane accumulates ROWS x NV fp32 sums; a shuffle reduction, then the SPLIT warps' partials
//     are added through shared memory in warp order (deterministic: no atomics).
// N wider than NV runs as more column blocks (grid.y), each re-reading A: the template is meant
// for N <= 8 (the planner's rule), correct for any N.
// Needs dtypes.cuh in front (the registry inlines it): F32 / F16 / BF16 and load_row_strip.

template <typename T, int NV, int ROWS, int SPLIT>
__global__ void __launch_bounds__(SPLIT * 32)
bitmap_spmv(const unsigned int* __restrict__ masks, const int* __restrict__ span_offsets,
            const typename T::storage* __restrict__ values, const typename T::storage* __restrict__ B,
            typename T::storage* __restrict__ C, int M, int K, int W, int S, int zero_at, int N,
            long long ldb, long long ldc, int vec_ok) {
    static_assert(NV >= 1 && NV <= 8 && ROWS >= 1 && ROWS <= 2 && SPLIT >= 1 && SPLIT <= 8, "NV 1..8, ROWS 1..2, SPLIT 1..8");
    constexpr int BATCH = ROWS * NV <= 2 ? 16 : 8;   // steps whose loads are in flight together
    const unsigned full = 0xffffffffu;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const unsigned below = (1u << lane) - 1u;
    const int first = blockIdx.x * ROWS;
    const int n0 = blockIdx.y * NV;
    const bool vec = vec_ok != 0 && n0 + NV <= N;

    int row[ROWS];
    bool live[ROWS];
    float acc[ROWS][NV];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        live[r] = first + r < M;
        row[r] = live[r] ? first + r : first;
#pragma unroll
        for (int t = 0; t < NV; ++t) acc[r][t] = 0.0f;
    }

    for (int s = warp; s < S; s += SPLIT) {
        unsigned word[ROWS];
        int start[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const int w = s * 32 + lane;
            word[r] = (w < W && live[r]) ? masks[static_cast<long long>(row[r]) * W + w] : 0u;
            const int count = __popc(word[r]);
            int incl = count;   // inclusive warp scan of the words' popcounts
#pragma unroll
            for (int d = 1; d < 32; d <<= 1) {
                const int up = __shfl_up_sync(full, incl, d);
                if (lane >= d) incl += up;
            }
            start[r] = span_offsets[static_cast<long long>(row[r]) * S + s] + incl - count;
        }
#pragma unroll
        for (int j0 = 0; j0 < 32; j0 += BATCH) {
            float v[ROWS][BATCH];
            float b[BATCH][NV];
#pragma unroll
            for (int jj = 0; jj < BATCH; ++jj) {
                const int j = j0 + jj;
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    const unsigned wd = __shfl_sync(full, word[r], j);
                    const int at = __shfl_sync(full, start[r], j) + __popc(wd & below);
                    v[r][jj] = T::to_float(values[((wd >> lane) & 1u) ? at : zero_at]);
                }
                int col = (s * 32 + j) * 32 + lane;
                col = col < K ? col : K - 1;   // words past K hold no bits; any row of B will do
                load_row_strip<T, NV>(B + static_cast<long long>(col) * ldb, n0, N, vec, b[jj]);
            }
#pragma unroll
            for (int jj = 0; jj < BATCH; ++jj) {
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
#pragma unroll
                    for (int t = 0; t < NV; ++t) acc[r][t] = fmaf(v[r][jj], b[jj][t], acc[r][t]);
                }
            }
        }
    }

#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
#pragma unroll
            for (int t = 0; t < NV; ++t) acc[r][t] += __shfl_xor_sync(full, acc[r][t], offset);
        }
    }
    __shared__ float partial[SPLIT][ROWS * NV];
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
#pragma unroll
            for (int t = 0; t < NV; ++t) partial[warp][r * NV + t] = acc[r][t];
        }
    }
    __syncthreads();
    if (warp == 0 && lane < ROWS * NV) {
        const int r = lane / NV, t = lane % NV;
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < SPLIT; ++w) sum += partial[w][lane];
        if (first + r < M && n0 + t < N) C[static_cast<long long>(first + r) * ldc + n0 + t] = T::from_float(sum);
    }
}

// Explicit instantiations for nvcc -ptx / -cubin (CuPy's name_expressions instantiate the same
// set through NVRTC).
#define SD_BITMAP(T, NV, R, SP) template __global__ void bitmap_spmv<T, NV, R, SP>(const unsigned int*, \
    const int*, const T::storage*, const T::storage*, T::storage*, int, int, int, int, int, int, long long, long long, int);
#define SD_BITMAP_NV(T, R, SP) SD_BITMAP(T, 1, R, SP) SD_BITMAP(T, 2, R, SP) SD_BITMAP(T, 4, R, SP) SD_BITMAP(T, 8, R, SP)
#define SD_BITMAP_ALL(T) SD_BITMAP_NV(T, 1, 4) SD_BITMAP_NV(T, 2, 4) SD_BITMAP_NV(T, 1, 2) SD_BITMAP_NV(T, 1, 8)
#ifdef SPARSEDITTO_INSTANTIATE_ALL
SD_BITMAP_ALL(F32) SD_BITMAP_ALL(F16) SD_BITMAP_ALL(BF16)
#endif
