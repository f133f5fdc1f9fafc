// Block-sparse (BSR) weight times a skinny B on the CUDA cores (CUDA C++, compiled through CuPy/NVRTC or nvcc).
//
// C[M, N] = A @ B; A as BS x BS blocks of fp16 / bf16 values (row-major within a block, zeros past M
// and K), int32 block-row pointers and block-column ids; B and C dense with row strides ldb / ldc and
// unit column stride.
//
//   bsr_spmv<T, BS, NN, WARPS, UNROLL>: a CTA owns one block row and NN columns of C (grid.y walks
//       the strips of NN columns). Its WARPS warps split the block row's blocks (warp w takes blocks
//       w, w + WARPS, ...), UNROLL blocks in flight per warp. In a block, lane l loads the 16-byte
//       vectors l, l + 32, ...: 8 values of the same 8 columns (column group l % VPR, VPR = BS / 8
//       vectors per row) in RPL rows (l / VPR, then every 32 / VPR rows). The warp first stages the
//       block's BS rows of B (NN columns, zeros past K and N) in shared memory as fp32, one coalesced
//       pass, then each lane multiplies its 8 x RPL values by its 8 rows of that slice into RPL x NN
//       fp32 sums. The VPR lanes of a row add their sums with a butterfly of shuffles, and the warps'
//       partial rows are summed in warp order through shared memory: the same bits whatever order
//       the warps ran in. Every row of C in the block row is written (zeros for an empty one).
//
// Why: a block keeps one index per BS x BS values, so at decode N the kernel can read the weight at
// close to its bytes (fp16 values + 4 bytes per block). On the H200 (session 39's llm suite), on
// 4096x4096 block-32 75% at N = 1 the tensor-core BSR kernel (bsr_tc, tiles of 16 columns) took
// 16.4 us against cuBLAS's 16.0, and the per-nonzero delta_spmv 22.4 us, for 8.4 MB of values.
// The value types come from dtypes.cuh, inlined in front of this file.

template <typename T, int BS, int NN, int WARPS, int UNROLL>
__global__ void __launch_bounds__(WARPS * 32, 1)
bsr_spmv(const int* __restrict__ brow_ptr, const int* __restrict__ bcol,
         const typename T::storage* __restrict__ blocks, int M, int K,
         const typename T::storage* __restrict__ B, typename T::storage* __restrict__ C, int N,
         long long ldb, long long ldc) {
    typedef typename T::storage S;
    constexpr int EPV = 16 / sizeof(S);       // values in a 16-byte vector
    constexpr int VPR = BS / EPV;             // vectors in a block's row
    constexpr int STEP = 32 / VPR;            // rows between a lane's vectors
    constexpr int RPL = BS / STEP;            // a lane's rows in a block
    constexpr int XS = BS + 1;                // a staged column of B: BS rows, one float of padding
    static_assert(sizeof(S) == 2, "bsr_spmv: fp16 or bf16 values");
    static_assert((BS == 16 || BS == 32) && 32 % VPR == 0 && RPL >= 1, "bsr_spmv: BS 16 or 32");
    static_assert(NN == 1 || NN == 2 || NN == 4 || NN == 8, "bsr_spmv: NN 1, 2, 4 or 8");
    static_assert(WARPS * BS * NN <= WARPS * UNROLL * NN * XS, "the partial rows fit the staging area");
    // per warp and block in flight: B's slice, [NN][BS + 1] floats (the padding spreads the column
    // groups of one row over distinct banks); after the loop the same memory holds the partial rows
    __shared__ float smem[WARPS][UNROLL][NN * XS];

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int br = blockIdx.x;
    const int n0 = blockIdx.y * NN;
    const int cg = lane % VPR;                // this lane's column group within a block
    const int r0 = lane / VPR;                // its first row; then r0 + STEP, ...
    float acc[RPL][NN];
#pragma unroll
    for (int v = 0; v < RPL; ++v) {
#pragma unroll
        for (int n = 0; n < NN; ++n) acc[v][n] = 0.0f;
    }
    const int lo = brow_ptr[br];
    const int hi = brow_ptr[br + 1];
    for (int b = lo + warp; b < hi; b += WARPS * UNROLL) {
        Pack<S, EPV> a[UNROLL][RPL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int bb = b + u * WARPS;
            if (bb < hi) {   // warp-uniform
                const S* blk = blocks + static_cast<long long>(bb) * (BS * BS) + r0 * BS + cg * EPV;
#pragma unroll
                for (int v = 0; v < RPL; ++v) a[u][v] = *reinterpret_cast<const Pack<S, EPV>*>(blk + v * STEP * BS);
                const int k0 = bcol[bb] * BS;
                float* xs = smem[warp][u];
#pragma unroll
                for (int t = lane; t < BS * NN; t += 32) {   // coalesced: consecutive lanes, consecutive columns
                    const int j = t / NN, n = t % NN;
                    const int k = k0 + j, c = n0 + n;
                    xs[n * XS + j] = (k < K && c < N) ? T::to_float(B[static_cast<long long>(k) * ldb + c]) : 0.0f;
                }
            }
        }
        __syncwarp();
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (b + u * WARPS < hi) {
                const float* xs = smem[warp][u] + cg * EPV;
#pragma unroll
                for (int e = 0; e < EPV; ++e) {
                    float x[NN];
#pragma unroll
                    for (int n = 0; n < NN; ++n) x[n] = xs[n * XS + e];
#pragma unroll
                    for (int v = 0; v < RPL; ++v) {
                        const float w = T::to_float(a[u][v].v[e]);
#pragma unroll
                        for (int n = 0; n < NN; ++n) acc[v][n] = fmaf(w, x[n], acc[v][n]);
                    }
                }
            }
        }
        __syncwarp();   // the slices are read before the next blocks overwrite them
    }
    // the VPR lanes of a row: a butterfly over the low lane bits (every lane takes part)
#pragma unroll
    for (int off = VPR / 2; off >= 1; off >>= 1) {
#pragma unroll
        for (int v = 0; v < RPL; ++v) {
#pragma unroll
            for (int n = 0; n < NN; ++n) acc[v][n] += __shfl_xor_sync(0xffffffffu, acc[v][n], off);
        }
    }
    __syncthreads();   // every warp is done with its staging area
    float* part = &smem[0][0][0];   // [WARPS][BS][NN]
    if (cg == 0) {
#pragma unroll
        for (int v = 0; v < RPL; ++v) {
#pragma unroll
            for (int n = 0; n < NN; ++n) part[(warp * BS + r0 + v * STEP) * NN + n] = acc[v][n];
        }
    }
    __syncthreads();
    for (int t = threadIdx.x; t < BS * NN; t += WARPS * 32) {
        const int row = t / NN, n = t % NN;
        const int m = br * BS + row, c = n0 + n;
        if (m < M && c < N) {
            float s = 0.0f;
#pragma unroll
            for (int w = 0; w < WARPS; ++w) s += part[(w * BS + row) * NN + n];
            C[static_cast<long long>(m) * ldc + c] = T::from_float(s);
        }
    }
}

// Explicit instantiations: nvcc -c / -ptx then compiles every kernel the Python side can launch
// (CuPy's name_expressions instantiate the same set through NVRTC).
#define SD_BS_ONE(T, S, NN, W, U) template __global__ void bsr_spmv<T, S, NN, W, U>( \
    const int*, const int*, const T::storage*, int, int, const T::storage*, T::storage*, int, long long, long long);
#define SD_BS_NN(T, S, W, U) SD_BS_ONE(T, S, 1, W, U) SD_BS_ONE(T, S, 2, W, U) SD_BS_ONE(T, S, 4, W, U) \
    SD_BS_ONE(T, S, 8, W, U)
#define SD_BS_W(T, S, U) SD_BS_NN(T, S, 4, U) SD_BS_NN(T, S, 8, U) SD_BS_NN(T, S, 16, U)
#define SD_BS_ALL(T) SD_BS_W(T, 16, 1) SD_BS_W(T, 16, 2) SD_BS_W(T, 32, 1) SD_BS_W(T, 32, 2)
#ifdef SPARSEDITTO_INSTANTIATE_ALL
SD_BS_ALL(F16) SD_BS_ALL(BF16)
#endif
