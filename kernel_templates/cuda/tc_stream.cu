// Tensor-core SpMM kernels that stream a (compressed) weight at near copy bandwidth (Hopper, sm_90).
//
// C[M, N] = A[M, K] @ B[K, N] for a pruned weight A and a skinny activation B (decode: N <= 64 per
// launch; wider N loops over blocks of 64 columns in grid.z). At these sizes the product is memory
// bound: its time is the bytes of A over HBM bandwidth, so every kernel here is built around one
// question, how few bytes per weight element it reads and how few instructions it spends per byte.
//
//   tc_dense   the dense fp16/bf16 weight in fragment order, read straight into mma.sync A
//              fragments with coalesced 16-byte loads (2 bytes per element). Beats cuBLAS at N <= 32, which reads a decode-size weight
//              at ~60% of the bandwidth a streaming kernel reaches.
//   tc_sp24    2:4 sparsity on the sparse tensor cores (mma.sp): the kept values are the A fragment
//              as stored, the 2-bit positions go to the hardware as metadata; 2.25 bytes per kept
//              value and no decode instructions at all.
//   tc_bitmap  unstructured sparsity: one bit per element plus the kept values, decoded in
//              registers into mma.sync fragments (a popc rank per 8 elements, a 16-entry lookup
//              table per 4, PRMT byte selects); 2 bytes per kept value + 1.25 bits per element.
//   tc_words   unstructured sparsity kept per fragment unit (one or two 32-bit registers: 2 or 4
//              neighbouring values of a row): the nonzero units unit-major behind per-unit lane masks,
//              streamed through a cp.async ring, each unit a popcount and a predicated shared load.
//   tc_sp24wg / tc_sp24tma  tc_sp24's format on Hopper's warpgroup MMA (wgmma.mma_async.sp, sm_90a)
//              for N >= 32: B read by the tensor cores from shared memory; staged by every thread
//              with cp.async (wg) or by the copy engine through a tensor map, A by per-warp bulk
//              copies, mbarrier stages instead of CTA barriers (tma, the default where B allows).
//
// Shared design (all three):
//   * The K dimension is permuted inside every 64-wide chunk so that a lane owns 16 consecutive
//     columns of its two rows (rows g and g+8 of a 16-row tile, columns 16t..16t+15 of the chunk)
//     and reads them with one or two 16-byte loads, fully coalesced. The same permutation is applied
//     to B's rows when the CTA stages its K slice of B in shared memory: ldmatrix.trans then reads
//     8 consecutive physical rows per matrix, XOR-swizzled across bank quads, free of conflicts.
//   * A CTA owns WARPS*R row tiles and one K slice (one chunk range), so every warp streams a
//     contiguous run of blobs with PIPE-1 chunks in flight and no synchronisation until the end;
//     SPLIT CTAs of a thread-block cluster split K and reduce their fp32 partial tiles through
//     distributed shared memory in a fixed rank order (deterministic, no workspace, one launch).
//     (A persistent variant that pulled 4-chunk units dynamically and reduced through an L2
//     workspace measured 1.3-1.6x slower on the H200: the release fence of every unit drained the
//     warp's prefetched loads.)
//   * fp32 accumulation; fp16 or bf16 operands (BF16 template flag); rows are padded to 16 and K to
//     64 by the Python side's prepare(), B rows past K and columns past N read as zeros.
// Self-contained (no CUDA headers), so NVRTC compiles it without include paths.

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define SD_CHUNK 64           // K columns per chunk (one permutation block)

__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 r;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
    return r;
}

__device__ __forceinline__ uint4 ldg_stream16(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ uint2 ldg_stream8(const void* p) {
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

__device__ __forceinline__ u32 lds_u16(u32 addr) {
    u16 v;
    asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(addr));
    return (u32)v;
}

__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
    u32 r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}

__device__ __forceinline__ void ldsm_x4_t(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

__device__ __forceinline__ void ldsm_x2_t(u32 addr, u32& r0, u32& r1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
                 : "=r"(r0), "=r"(r1) : "r"(addr));
}

template <int BF16>
__device__ __forceinline__ void mma16816(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    if (BF16) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    } else {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
}

template <int BF16>
__device__ __forceinline__ void mma_sp16832(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1,
                                            u32 b2, u32 b3, u32 e) {
    if (BF16) {
        asm volatile("mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.bf16.bf16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9, %10, %11}, {%0, %1, %2, %3}, %12, 0x0;"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(b2), "r"(b3), "r"(e));
    } else {
        asm volatile("mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9, %10, %11}, {%0, %1, %2, %3}, %12, 0x0;"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(b2), "r"(b3), "r"(e));
    }
}

template <int BF16>
__device__ __forceinline__ u16 to_storage(float f) {
    u16 h;
    if (BF16) asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    else asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// Zero R row tiles' fp32 accumulators of NT n8 tiles (every streaming kernel's start, and a stream-K
// range's next group).
template <int R, int NT>
__device__ __forceinline__ void zero_acc(float (&acc)[R][NT][4]) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int j = 0; j < NT; ++j) acc[r][j][0] = acc[r][j][1] = acc[r][j][2] = acc[r][j][3] = 0.f;
}

// ---- bulk copies (TMA, 1-D) ---------------------------------------------------------------------

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}

// Publishes the initialised barriers to the copy engine (and the cluster) before any copy uses them.
__device__ __forceinline__ void fence_barrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// This thread's arrival on `bar`, announcing `bytes` more to come from the copy engine.
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}

// A 1-D copy of `bytes` (a multiple of 16, both ends 16-byte aligned) that completes on `bar`.
__device__ __forceinline__ void bulk_copy(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// One copy that is the barrier's whole transaction for this phase (tc_bitmap's units).
__device__ __forceinline__ void bulk_load(u32 dst, const void* src, u32 bytes, u32 bar) {
    mbar_expect_tx(bar, bytes);
    bulk_copy(dst, src, bytes, bar);
}

// This thread's arrival on the barrier at `bar`'s offset in cluster CTA `rank` (its own included):
// how a consumer releases a stage that a multicast copy from another CTA refills.
__device__ __forceinline__ void mbar_arrive_cluster(u32 bar, u32 rank) {
    asm volatile("{ .reg .b32 r; mapa.shared::cluster.u32 r, %0, %1; mbarrier.arrive.shared::cluster.b64 _, [r]; }"
                 :: "r"(bar), "r"(rank) : "memory");
}

__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    u32 done = 0;
    while (!done) {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    }
}

// ---- the K permutation ------------------------------------------------------------------------
// Physical shared-memory row (within a 64-row chunk of B) of logical row k for each format, chosen
// so that the rows one ldmatrix matrix reads are 8 consecutive physical rows (see the header).

__device__ __forceinline__ int phys_row_mma(int k) {
    // k = 16t + 4s + 2hi + e  ->  16s + 8hi + 2t + e
    const int t = k >> 4, s = (k >> 2) & 3, hi = (k >> 1) & 1, e = k & 1;
    return 16 * s + 8 * hi + 2 * t + e;
}

__device__ __forceinline__ int phys_row_sp(int k) {
    // k = 16tt + 8s + 4h + p  ->  32s + 8(2h + tt/2) + 4(tt%2) + p
    const int tt = k >> 4, s = (k >> 3) & 1, h = (k >> 2) & 1, p = k & 3;
    return 32 * s + 8 * (2 * h + (tt >> 1)) + 4 * (tt & 1) + p;
}

// The staged B slice: rows of NT 16-byte units, unit j of physical row r stored at unit
// j ^ swz(r), swz(r) = (r / (8 / NT)) % NT. The 8 consecutive rows one ldmatrix matrix reads then
// fall into 8 different bank quads for every NT in {1, 2, 4, 8}, with no padding.
template <int NT>
struct BStride {
    static constexpr int bytes = NT * 16;
    static __device__ __forceinline__ int unit(int r, int j) { return j ^ ((r / (8 / NT)) & (NT - 1)); }
};

// Stage B[k0 : k0 + kc, n0 : n0 + 8*NT] into shared memory with rows permuted per chunk. Zeros past
// K and N. `vec` says B rows can be read as aligned 16-byte vectors (ldb and the pointer allow it):
// those pieces go through cp.async (no register round trip, all in flight at once); the others are
// gathered four pieces per thread at a time so their loads overlap too. The caller waits
// (cp_async_wait_all + __syncthreads) after issuing its first A loads, so both streams overlap.
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, u32 src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// A hint to pull `bytes` (a multiple of 16, 16-byte aligned) of global memory into L2, nothing waited for:
// the copy engine fetches them while the SM works, so a later cp.async finds them in L2.
__device__ __forceinline__ void prefetch_l2(const void* src, u32 bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(src), "r"(bytes) : "memory");
}

__device__ __forceinline__ void cp_async_wait_all() {
    asm volatile("cp.async.commit_group;\n\tcp.async.wait_all;" ::: "memory");
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}

// Wait until at most PENDING of this thread's committed groups are still in flight.
template <int PENDING>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" :: "n"(PENDING) : "memory");
}

// A staged B block is made of 16-byte pieces: piece (kl, j) holds rows k0 + kl of B, columns
// n0 + 8j .. n0 + 8j + 7, at byte b_piece_offset(prow, j) of the block, prow being its physical row
// (rows permuted per chunk, units swizzled). Aligned pieces go through cp.async (a source size of 0
// past K zero-fills); the others are gathered by b_piece_gather, zeros past K and N.
template <int NT>
__device__ __forceinline__ int b_piece_offset(int prow, int j) {
    return prow * BStride<NT>::bytes + 16 * BStride<NT>::unit(prow, j);
}

__device__ __forceinline__ uint4 b_piece_gather(const u16* __restrict__ src, int k, int K, int n, int N) {
    u32 w[4] = {0u, 0u, 0u, 0u};
    if (k < K) {
#pragma unroll
        for (int q = 0; q < 8; ++q) {
            if (n + q < N) w[q >> 1] |= (u32)src[q] << (16 * (q & 1));
        }
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

template <int NT, int SP>
__device__ void stage_b(unsigned char* bs, const u16* __restrict__ B, int k0, int kc, int K, int n0, int N,
                        long long ldb, int vec) {
    const int pieces = kc * NT;  // 16-byte pieces
    const u32 bs_addr = smem_addr(bs);
    for (int base = threadIdx.x; base < pieces; base += 4 * blockDim.x) {
        uint4 v[4];
        int dst[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int i = base + u * blockDim.x;
            dst[u] = -1;
            if (i >= pieces) continue;
            const int kl = i / NT, j = i - kl * NT;
            const int k = k0 + kl, n = n0 + 8 * j;
            const int prow = (kl & ~(SD_CHUNK - 1)) + (SP ? phys_row_sp(kl & (SD_CHUNK - 1)) : phys_row_mma(kl & (SD_CHUNK - 1)));
            const int off = b_piece_offset<NT>(prow, j);
            const u16* src = B + (long long)min(k, K - 1) * ldb + n;
            if (vec && n + 8 <= N) {
                cp_async16(bs_addr + off, src, k < K ? 16u : 0u);
                continue;
            }
            v[u] = b_piece_gather(src, k, K, n, N);
            dst[u] = off;
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            if (dst[u] >= 0) *reinterpret_cast<uint4*>(bs + dst[u]) = v[u];
        }
    }
}

// One 64-row chunk of B into a ring slot (stream_registers with BR > 0): a piece or two per thread
// stored as it comes, without stage_b's batches of four gathers, so the refill inside the stream loop
// adds few live registers (the batched loop there took tc_sp24 from 80 to 120 registers at N = 64).
template <int NT, int SP>
__device__ __forceinline__ void stage_b_chunk(unsigned char* slot, const u16* __restrict__ B, int k0, int K, int n0,
                                              int N, long long ldb, int vec) {
    const u32 slot_addr = smem_addr(slot);
    for (int i = threadIdx.x; i < SD_CHUNK * NT; i += blockDim.x) {
        const int kl = i / NT, j = i - kl * NT;
        const int k = k0 + kl, n = n0 + 8 * j;
        const int off = b_piece_offset<NT>(SP ? phys_row_sp(kl) : phys_row_mma(kl), j);
        const u16* src = B + (long long)min(k, K - 1) * ldb + n;
        if (vec && n + 8 <= N) cp_async16(slot_addr + off, src, k < K ? 16u : 0u);
        else *reinterpret_cast<uint4*>(slot + off) = b_piece_gather(src, k, K, n, N);
    }
}

// Rows kl0 .. kl1 of stage_b's slice (B[k0 + kl0 .. k0 + kl1], the mma permutation), staged by thread
// `tid` of `nthr`: tc_words_grp's consumer warps stage B part by part (B_PARTS) and start on the first
// part while the producer warp streams A. Aligned pieces via cp.async (the caller commits and waits).
// stage_b_chunk's loop over a row range and a thread subset; kept apart from it because folding
// stage_b_chunk into it changes the SASS of the shipped tc_dense / tc_sp24 B rings (nvcc 13).
template <int NT>
__device__ __forceinline__ void stage_b_rows(unsigned char* bs, const u16* __restrict__ B, int k0, int kl0, int kl1,
                                             int K, int n0, int N, long long ldb, int vec, int tid, int nthr) {
    const u32 bs_addr = smem_addr(bs);
    for (int i = kl0 * NT + tid; i < kl1 * NT; i += nthr) {
        const int kl = i / NT, j = i - kl * NT;
        const int k = k0 + kl, n = n0 + 8 * j;
        const int off = b_piece_offset<NT>((kl & ~(SD_CHUNK - 1)) + phys_row_mma(kl & (SD_CHUNK - 1)), j);
        const u16* src = B + (long long)min(k, K - 1) * ldb + n;
        if (vec && n + 8 <= N) cp_async16(bs_addr + off, src, k < K ? 16u : 0u);
        else *reinterpret_cast<uint4*>(bs + off) = b_piece_gather(src, k, K, n, N);
    }
}

// Wait until part q of P cp.async groups (committed in order) has landed for this thread.
template <int P>
__device__ __forceinline__ void cp_async_wait_part(int q) {
    if (q == 0) cp_async_wait<P - 1>();
    else if (q == 1) cp_async_wait<(P > 2 ? P - 2 : 0)>();
    else if (q == 2) cp_async_wait<(P > 3 ? P - 3 : 0)>();
    else cp_async_wait<0>();
}

// bar.sync on named barrier `id` among `threads` threads (whole warps): tc_words_grp's consumer warps
// publish each staged part of B to each other without the producer warp.
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(threads) : "memory");
}

// B fragments of one k16 step (mma.sync): tiles j, j+1 per ldmatrix.x4 (x2 for a lone tile).
template <int NT>
__device__ __forceinline__ void load_b_step(u32 bs, int row0, u32 (&b)[NT][2]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int j = 0; j + 1 < NT; j += 2) {
        const int m = lane >> 3;                        // matrix: (tile j + m/2, hi = m%2)
        const int row = row0 + 8 * (m & 1) + (lane & 7);
        const u32 addr = bs + row * BStride<NT>::bytes + 16 * BStride<NT>::unit(row, j + (m >> 1));
        ldsm_x4_t(addr, b[j][0], b[j][1], b[j + 1][0], b[j + 1][1]);
    }
    if (NT & 1) {
        const int row = row0 + (lane & 15);
        const u32 addr = bs + row * BStride<NT>::bytes + 16 * BStride<NT>::unit(row, NT - 1);
        ldsm_x2_t(addr, b[NT - 1][0], b[NT - 1][1]);
    }
}

// ---- cluster (split-K) epilogue ------------------------------------------------------------

__device__ __forceinline__ u32 cluster_rank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

__device__ __forceinline__ void cluster_sync_all() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}

__device__ __forceinline__ void cluster_wait() {
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
}

// The cluster barrier without release semantics on the arrival: a CTA leaving its split-K reduction only
// has to know that its peers' reads of its partials are done, and each peer's reads returned before it
// arrives (their sums were stored). Why: the release form compiles to MEMBAR.ALL.GPU before the arrival
// (nvcc 13, sm_90), which waits for the reduction's global stores of C to be acknowledged first.
__device__ __forceinline__ void cluster_sync_relaxed() {
    cluster_arrive_relaxed();
    cluster_wait();
}

__device__ __forceinline__ float4 ld_dsmem_f4(u32 local_addr, u32 rank) {
    u32 remote;
    float4 v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local_addr), "r"(rank));
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(remote) : "memory");
    return v;
}

template <int BF16>
__device__ __forceinline__ void store_pair(u16* __restrict__ C, long long ldc, int row, int col, int M, int N,
                                           float x, float y) {
    if (row >= M) return;
    u16* c = C + (long long)row * ldc + col;
    if (col < N) c[0] = to_storage<BF16>(x);
    if (col + 1 < N) c[1] = to_storage<BF16>(y);
}

// Four consecutive values of one row of C: one 8-byte store where all four columns exist and the address
// is 8-byte aligned (a row stride or base that is not falls back to pairs). Why: the split-K reductions
// store C four columns per thread; two-byte stores made that four store instructions and transactions.
template <int BF16>
__device__ __forceinline__ void store_quad(u16* __restrict__ C, long long ldc, int row, int col, int M, int N,
                                           float4 v) {
    if (row >= M) return;
    u16* c = C + (long long)row * ldc + col;
    if (col + 3 < N && (reinterpret_cast<unsigned long long>(c) & 7ull) == 0) {
        const u32 lo = (u32)to_storage<BF16>(v.x) | ((u32)to_storage<BF16>(v.y) << 16);
        const u32 hi = (u32)to_storage<BF16>(v.z) | ((u32)to_storage<BF16>(v.w) << 16);
        *reinterpret_cast<uint2*>(c) = make_uint2(lo, hi);
        return;
    }
    store_pair<BF16>(C, ldc, row, col, M, N, v.x, v.y);
    store_pair<BF16>(C, ldc, row, col + 2, M, N, v.z, v.w);
}

// The split-K cluster's reduction of the partial tiles every CTA wrote to `cpart` (MC rows of 8 NT
// floats): each CTA sums its share of the rows (MC / SPLIT of them, rounded down and up when SPLIT
// does not divide MC) over all ranks in rank order and stores them. Every thread of every CTA of the
// cluster takes part (a warp without accumulators too: it only helps sum). MX > 1 (tc_sp24tma's
// multicast pairs): the cluster is MX row blocks wide, rank = x + MX * (K slice), and a CTA reduces
// with the CTAs of its own row block only.
template <int BF16, int NT, int MC, int SPLIT, int MX = 1>
__device__ void split_reduce(float* cpart, u16* __restrict__ C, long long ldc, int M, int N, int n0, int tile0) {
    constexpr int W = NT * 8;
    cluster_sync_all();
    const u32 rank = cluster_rank();
    const u32 slice = rank / MX, peer0 = rank % MX;
    constexpr bool EVEN = MC % SPLIT == 0;
    const int lr0 = EVEN ? (int)slice * (MC / SPLIT) : (int)slice * MC / SPLIT;
    const int share = EVEN ? MC / SPLIT : ((int)slice + 1) * MC / SPLIT - lr0;
    const u32 base = smem_addr(cpart);
    for (int i = threadIdx.x; i < share * (W / 4); i += blockDim.x) {
        const int lr = lr0 + i / (W / 4);
        const int col = 4 * (i % (W / 4));
        float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int q = 0; q < SPLIT; ++q) {
            const float4 v = ld_dsmem_f4(base + 4u * (u32)(lr * W + col), peer0 + (u32)(q * MX));
            sum.x += v.x; sum.y += v.y; sum.z += v.z; sum.w += v.w;
        }
        store_quad<BF16>(C, ldc, tile0 * 16 + lr, n0 + col, M, N, sum);
    }
    cluster_sync_relaxed();                           // peers may still read our partials
}

// acc[rt][j][4] of warp-row-tile rt: rows (g, g+8), columns 8j + 2t + {0, 1}. With SPLIT == 1 the
// fragments go to C directly; otherwise through shared memory and the cluster reduction, each CTA
// of the cluster summing MC/SPLIT rows over all ranks in rank order.
template <int BF16, int NT, int R, int WARPS, int SPLIT, int MX = 1>
__device__ void epilogue(float (&acc)[R][NT][4], float* cpart, u16* __restrict__ C, long long ldc, int M,
                         int N, int n0, int tile0) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    constexpr int MC = WARPS * R * 16;
    constexpr int W = NT * 8;
    if (SPLIT == 1) {
#pragma unroll
        for (int rt = 0; rt < R; ++rt) {
            const int row = (tile0 + warp * R + rt) * 16 + g;
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const int col = n0 + 8 * j + 2 * t;
                store_pair<BF16>(C, ldc, row, col, M, N, acc[rt][j][0], acc[rt][j][1]);
                store_pair<BF16>(C, ldc, row + 8, col, M, N, acc[rt][j][2], acc[rt][j][3]);
            }
        }
        return;
    }
#pragma unroll
    for (int rt = 0; rt < R; ++rt) {
        const int lr = (warp * R + rt) * 16 + g;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const int col = 8 * j + 2 * t;
            *reinterpret_cast<float2*>(cpart + lr * W + col) = make_float2(acc[rt][j][0], acc[rt][j][1]);
            *reinterpret_cast<float2*>(cpart + (lr + 8) * W + col) = make_float2(acc[rt][j][2], acc[rt][j][3]);
        }
    }
    split_reduce<BF16, NT, MC, SPLIT, MX>(cpart, C, ldc, M, N, n0, tile0);
}

// ---- split-K by pushing partials (tc_words_grp with EP = 1) --------------------------------------
// Each CTA of the cluster owns MC / SPLIT of the MC partial rows (rounded as split_reduce does) and keeps
// a receive region: its mbarrier, then SPLIT slots of SHARE rows x W floats, slot q for rank q's partial
// rows of its share. A consumer warp sends each fragment row straight from its registers to the owner's
// slot with st.async, which completes bytes on the owner's mbarrier; the owner waits for all SPLIT slots
// (its own included), sums them in rank order (the pull reduction's order of additions) and stores
// its rows. Why (H200, session 37, words_stage_probe): the pull epilogue (partials to shared memory, a
// cluster barrier, DSMEM loads, C, a second cluster barrier) cost ~2 us of tc_words_grp's 23-26 us on
// 11008x4096 and its barriers alone 0.3-0.7 us; a push needs one barrier at the start (the receive
// barriers exist before any peer sends), long before the first partial is ready, and none at the end:
// an owner has everything once its barrier completes, and no CTA reads another's shared memory.
template <int NT, int MC, int SPLIT>
struct PushReduce {
    static constexpr int W = NT * 8;
    static constexpr int SHARE = (MC + SPLIT - 1) / SPLIT;     // rows per slot (the largest share)
    static constexpr int HEAD = 16;                            // the barrier, padded (tc_launch.PUSH_BARRIER_BYTES)
    static __device__ __forceinline__ int first_row(int rank) { return rank * MC / SPLIT; }
    static __device__ __forceinline__ int owner(int lr) { return ((lr + 1) * SPLIT - 1) / MC; }
    static __device__ __forceinline__ u32 share_bytes(int rank) {
        return (u32)(SPLIT * (first_row(rank + 1) - first_row(rank)) * W * 4);
    }
};

// Two floats into CTA `rank`'s shared memory at `local` (an address of this CTA's layout), completing 8
// bytes on that CTA's barrier at `bar` (likewise).
__device__ __forceinline__ void st_async_f2(u32 local, u32 bar, u32 rank, float x, float y) {
    asm volatile("{ .reg .b32 d, b;\n\tmapa.shared::cluster.u32 d, %0, %2;\n\tmapa.shared::cluster.u32 b, %1, %2;\n\t"
                 "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [d], {%3, %4}, [b]; }"
                 :: "r"(local), "r"(bar), "r"(rank), "f"(x), "f"(y) : "memory");
}

// A consumer warp's R row tiles of partials (rows (warp R + rt) 16 + g and + 8 of the CTA's MC) to their
// owners' slot `rank`.
template <int NT, int R, int WARPS, int SPLIT>
__device__ __forceinline__ void push_partials(const float (&acc)[R][NT][4], u32 recv, u32 rank, int warp, int lane) {
    using P = PushReduce<NT, WARPS * R * 16, SPLIT>;
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int rt = 0; rt < R; ++rt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int lr = (warp * R + rt) * 16 + g + 8 * h;
            const int o = P::owner(lr);
            const u32 row = recv + (u32)P::HEAD + 4u * (u32)(((int)rank * P::SHARE + lr - P::first_row(o)) * P::W);
#pragma unroll
            for (int j = 0; j < NT; ++j)
                st_async_f2(row + 4u * (u32)(8 * j + 2 * t), recv, (u32)o, acc[rt][j][2 * h], acc[rt][j][2 * h + 1]);
        }
}

// The owner's side: every slot in, summed in rank order, its rows of C stored (all threads of the CTA);
// `recv` is the receive barrier's shared address, `recv_rows` the slots after it (PushReduce::HEAD on).
template <int BF16, int NT, int MC, int SPLIT>
__device__ __forceinline__ void reduce_pushed(const float* recv_rows, u32 recv, u32 rank, u16* __restrict__ C,
                                              long long ldc, int M, int N, int n0, int tile0) {
    using P = PushReduce<NT, MC, SPLIT>;
    constexpr int W = P::W;
    mbar_wait(recv, 0);
    const int lr0 = P::first_row((int)rank), share = P::first_row((int)rank + 1) - lr0;
    for (int i = threadIdx.x; i < share * (W / 4); i += blockDim.x) {
        const int lr = i / (W / 4), col = 4 * (i % (W / 4));
        float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int q = 0; q < SPLIT; ++q) {
            const float4 v = *reinterpret_cast<const float4*>(recv_rows + (q * P::SHARE + lr) * W + col);
            sum.x += v.x; sum.y += v.y; sum.z += v.z; sum.w += v.w;
        }
        store_quad<BF16>(C, ldc, tile0 * 16 + lr0 + lr, n0 + col, M, N, sum);
    }
}

// Where a warp of the streaming kernels works: CTA (x, y, z) owns row tiles x * WARPS * R .. (its warp
// w: R of them from tile0 + w * R), K slice y (chunks [c0, c1)) and n block z (columns n0 .. n0 + 8 NT).
template <int NT, int R, int WARPS>
struct WarpWork {
    int lane, warp, nchunks, c0, c1, n0, tile0, tile;
    __device__ __forceinline__ WarpWork(int Kp, int chunks_per_cta)
        : lane(threadIdx.x & 31), warp(threadIdx.x >> 5), nchunks(Kp / SD_CHUNK), c0(blockIdx.y * chunks_per_cta),
          c1(min(Kp / SD_CHUNK, (int)blockIdx.y * chunks_per_cta + chunks_per_cta)), n0(blockIdx.z * NT * 8),
          tile0(blockIdx.x * WARPS * R), tile(blockIdx.x * WARPS * R + (threadIdx.x >> 5) * R) {}
    __device__ __forceinline__ bool active(int tiles) const { return tile < tiles && c0 < c1; }
};

template <int NT, int R, int WARPS, int SPLIT>
struct SmemPlan {
    static constexpr int cpart_bytes = SPLIT > 1 ? WARPS * R * 16 * NT * 8 * 4 : 0;
    static __device__ __forceinline__ int b_bytes(int kc) { return kc * BStride<NT>::bytes; }
};

// ---- tc_dense -------------------------------------------------------------------------------

// A in fragment order: per (tile, chunk) 2 KiB, piece i of lane L (16 bytes) at i*512 + 16L, pieces
// 0/1 = row g's columns 16t..16t+7 / 16t+8..16t+15 of the chunk, 2/3 = row g+8's. Each load
// instruction of a warp reads 512 contiguous bytes and a warp's stream is contiguous over its chunks.
__device__ __forceinline__ void dense_load(const u16* __restrict__ A, int nchunks, int tile, int c, int lane,
                                           u32 (&x)[16]) {
    const u16* p = A + ((long long)tile * nchunks + c) * 1024 + 8 * lane;
    const uint4 u0 = ldg_stream16(p), u1 = ldg_stream16(p + 256);
    const uint4 v0 = ldg_stream16(p + 512), v1 = ldg_stream16(p + 768);
    x[0] = u0.x; x[1] = u0.y; x[2] = u0.z; x[3] = u0.w;
    x[4] = u1.x; x[5] = u1.y; x[6] = u1.z; x[7] = u1.w;
    x[8] = v0.x; x[9] = v0.y; x[10] = v0.z; x[11] = v0.w;
    x[12] = v1.x; x[13] = v1.y; x[14] = v1.z; x[15] = v1.w;
}

// One chunk of R row tiles: B's fragments of each k16 step are read from shared memory once and
// feed all R tiles' mma (R > 1 halves or quarters the ldmatrix traffic per A byte, which at N = 64
// is as much shared-memory time as the HBM time of the A bytes it multiplies).
template <int BF16, int NT, int R>
__device__ __forceinline__ void dense_compute(const u32 (&x)[R][16], u32 bs, int cc, float (&acc)[R][NT][4]) {
#pragma unroll
    for (int s = 0; s < 4; ++s) {
        u32 b[NT][2];
        load_b_step<NT>(bs, cc * SD_CHUNK + 16 * s, b);
#pragma unroll
        for (int rt = 0; rt < R; ++rt)
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                // row g: words 2s (k 4s, 4s+1 of the lane's 16) and 2s+1; row g+8: words 8 + ...
                mma16816<BF16>(acc[rt][j], x[rt][2 * s], x[rt][8 + 2 * s], x[rt][2 * s + 1], x[rt][8 + 2 * s + 1],
                               b[j][0], b[j][1]);
            }
    }
}

// ---- tc_sp24 --------------------------------------------------------------------------------
// values in fragment order: per (tile, chunk) 1 KiB, piece i of lane L (16 bytes: the kept values of
// its 4 groups of 4, positions ascending) at i*512 + 16L, piece 0 = row g, piece 1 = row g+8.
// meta: [tiles][chunks][g 0..7][t 0..1][s 0..1] words in the mma.sp layout: word (g, t, s) holds,
// in bits 0..15, row g's 2-bit positions for the four groups lane t covers at step s (lane 0 the
// first half of the k32 step, lane 1 the second), and in bits 16..31 the same for row g+8.

// Where lane L = (g, t)'s part of block (tile, c) lives: its row g and row g+8 pieces at sp_values()
// and 256 values on, and (lanes t = 0, 1) its two metadata words at sp_meta_words(). tc_sp24 loads
// them into registers (sp_load), the wgmma kernel copies them into shared memory first (sp_copy_async).
__device__ __forceinline__ long long sp_block(int nchunks, int tile, int c) {
    return (long long)tile * nchunks + c;
}

__device__ __forceinline__ const u16* sp_values(const u16* __restrict__ V, long long blk, int lane) {
    return V + blk * 512 + 8 * lane;
}

__device__ __forceinline__ const u32* sp_meta_words(const u32* __restrict__ meta, long long blk, int g, int t) {
    return meta + (blk * 16 + 2 * g + t) * 2;
}

__device__ __forceinline__ void sp_load(const u16* __restrict__ V, const u32* __restrict__ meta, int nchunks,
                                        int tile, int c, int lane, u32 (&x)[10]) {
    const int g = lane >> 2, t = lane & 3;
    const long long blk = sp_block(nchunks, tile, c);
    const u16* p = sp_values(V, blk, lane);
    const uint4 u = ldg_stream16(p), v = ldg_stream16(p + 256);
    x[0] = u.x; x[1] = u.y; x[2] = u.z; x[3] = u.w;
    x[4] = v.x; x[5] = v.y; x[6] = v.z; x[7] = v.w;
    if (t < 2) {
        const uint2 m = ldg_stream8(sp_meta_words(meta, blk, g, t));
        x[8] = m.x; x[9] = m.y;
    } else {
        x[8] = 0u; x[9] = 0u;
    }
}

template <int BF16, int NT, int R>
__device__ __forceinline__ void sp_compute(const u32 (&x)[R][10], u32 bs, int cc, float (&acc)[R][NT][4]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int s = 0; s < 2; ++s) {
        const int row = cc * SD_CHUNK + 32 * s + lane;
        // One n8 tile's B fragment at a time, used by all R row tiles: with R > 1 a whole step's
        // fragments (4 NT registers) would stay live beside R * NT accumulators.
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            u32 b[4];
            ldsm_x4_t(bs + row * BStride<NT>::bytes + 16 * BStride<NT>::unit(row, j), b[0], b[1], b[2], b[3]);
#pragma unroll
            for (int rt = 0; rt < R; ++rt)
                mma_sp16832<BF16>(acc[rt][j], x[rt][2 * s], x[rt][4 + 2 * s], x[rt][2 * s + 1], x[rt][4 + 2 * s + 1],
                                  b[0], b[1], b[2], b[3], x[rt][8 + s]);
        }
    }
}

// ---- the register-pipelined kernels (tc_dense, tc_sp24) -----------------------------------------
// Warp w of CTA (x, y) streams row tiles x*WARPS*R + w*R + rt over the chunk range of K slice y; chunk
// c + p computes from buffer p while the loads of chunk c + p + PIPE - 1 are in flight (every buffer
// index is a compile-time constant).

struct DenseFmt {
    static constexpr int WORDS = 16;
    static constexpr int SP = 0;
    const u16* A;
    const u32* meta;
    __device__ __forceinline__ void load(int nchunks, int tile, int c, int lane, u32 (&x)[16]) const {
        dense_load(A, nchunks, tile, c, lane, x);
    }
    template <int BF16, int NT, int R>
    __device__ __forceinline__ void compute(const u32 (&x)[R][16], u32 bs, int cc, float (&acc)[R][NT][4]) const {
        dense_compute<BF16, NT, R>(x, bs, cc, acc);
    }
};

struct Sp24Fmt {
    static constexpr int WORDS = 10;
    static constexpr int SP = 1;
    const u16* A;
    const u32* meta;
    __device__ __forceinline__ void load(int nchunks, int tile, int c, int lane, u32 (&x)[10]) const {
        sp_load(A, meta, nchunks, tile, c, lane, x);
    }
    template <int BF16, int NT, int R>
    __device__ __forceinline__ void compute(const u32 (&x)[R][10], u32 bs, int cc, float (&acc)[R][NT][4]) const {
        sp_compute<BF16, NT, R>(x, bs, cc, acc);
    }
};

// B's K slice reaches shared memory one of two ways (BR, a template flag):
//   BR == 0  the whole slice is staged before the stream starts (N <= 16: 8-32 KiB per CTA, one
//            barrier in all);
//   BR >= 2  a ring of BR chunk slots (64 rows each) refilled while the stream runs, one CTA barrier
//            per chunk. Wide N needs it: at N = 64 a whole 16-chunk slice is 128 KiB, which leaves one
//            CTA per SM, and even an 8-chunk slice made every CTA wait for 64 KiB from L2 before its
//            first mma (11008x4096 2:4 at N = 64 ran 1.74 waves of 3 CTAs per SM, 0.67x cuBLAS).
// Every warp, active or not, takes part in the ring's barriers; only active warps load and compute.

template <class F, int BF16, int NT, int R, int WARPS, int SPLIT, int PIPE, int BR>
__device__ void stream_registers(const F& fmt, const u16* __restrict__ B, u16* __restrict__ C, int M, int N, int K,
                                 int Kp, long long ldb, long long ldc, int chunks_per_cta, int tiles, int bvec) {
    static_assert(BR == 0 || BR >= 2, "a B ring needs at least two slots");
    extern __shared__ __align__(16) unsigned char smem[];
    const WarpWork<NT, R, WARPS> ww(Kp, chunks_per_cta);
    const int lane = ww.lane, nchunks = ww.nchunks, c0 = ww.c0, c1 = ww.c1, n0 = ww.n0, tile0 = ww.tile0, tile = ww.tile;
    const bool active = ww.active(tiles);
    u32 x[PIPE][R][F::WORDS];
    if (active) {
#pragma unroll
        for (int p = 0; p + 1 < PIPE; ++p)
#pragma unroll
            for (int rt = 0; rt < R; ++rt)
                if (c0 + p < c1 && tile + rt < tiles) fmt.load(nchunks, tile + rt, c0 + p, lane, x[p][rt]);
    }
    const int nc = c1 - c0;   // the same for every warp of the CTA
    constexpr int SLOT_BYTES = SD_CHUNK * BStride<NT>::bytes;   // one ring slot: a 64-row chunk of B
    if (BR == 0) {
        stage_b<NT, F::SP>(smem, B, c0 * SD_CHUNK, chunks_per_cta * SD_CHUNK, K, n0, N, ldb, bvec);
        cp_async_wait_all();
        __syncthreads();
    } else {
#pragma unroll
        for (int i = 0; i + 1 < BR; ++i) {   // chunks 0 .. BR-2 of the slice; one commit group each
            if (i < nc) stage_b_chunk<NT, F::SP>(smem + i * SLOT_BYTES, B, (c0 + i) * SD_CHUNK, K, n0, N,
                                                 ldb, bvec);
            cp_async_commit();
        }
    }
    const u32 bs = smem_addr(smem);
    float acc[R][NT][4];
    zero_acc(acc);
    if (BR > 0 || active) {
        for (int c = c0; c < c1; c += PIPE) {
#pragma unroll
            for (int p = 0; p < PIPE; ++p) {
                if (c + p < c1) {
                    const int i = c + p - c0;
                    int cc = i;   // the chunk's 64-row block in shared memory
                    if (BR > 0) {
                        // chunk i's group is complete once at most BR-2 later groups are pending; the
                        // barrier also says every warp is done with chunk i-1, whose slot is refilled
                        cp_async_wait<(BR > 1 ? BR - 2 : 0)>();
                        __syncthreads();
                        constexpr int SLOTS = BR > 0 ? BR : 1;
                        if (i + BR - 1 < nc)
                            stage_b_chunk<NT, F::SP>(smem + ((i + BR - 1) % SLOTS) * SLOT_BYTES, B,
                                                     (c + p + BR - 1) * SD_CHUNK, K, n0, N, ldb, bvec);
                        cp_async_commit();
                        cc = i % SLOTS;
                    }
                    if (active) {
                        const int q = (p + PIPE - 1) % PIPE;
#pragma unroll
                        for (int rt = 0; rt < R; ++rt)
                            if (c + p + PIPE - 1 < c1 && tile + rt < tiles)
                                fmt.load(nchunks, tile + rt, c + p + PIPE - 1, lane, x[q][rt]);
                        fmt.template compute<BF16, NT, R>(x[p], bs, cc, acc);
                    }
                }
            }
        }
    }
    // The split-K partials go over B's shared memory (the host sizes it as the larger of the two,
    // which keeps wide-N CTAs small enough to be resident two or three at a time), so every warp
    // must be done reading B first.
    if (SPLIT > 1) __syncthreads();
    epilogue<BF16, NT, R, WARPS, SPLIT>(acc, reinterpret_cast<float*>(smem), C, ldc, M, N, n0, tile0);
}

// MINB: CTAs per SM the compiler must leave registers for (0: no cap). Measured with nvcc / NVRTC
// 13.0: an explicit 1 is not the same as none, it raised tc_sp24 from 58 to 68 registers at NT = 2
// and from 80 to 94 at NT = 8 (11008x4096 2:4, N = 64: 38.1 -> 42.6 us), so 0 is the default.
template <int BF16, int NT, int R, int WARPS, int SPLIT, int PIPE, int BR, int MINB>
__global__ void __cluster_dims__(1, SPLIT, 1) __launch_bounds__(WARPS * 32, MINB)
tc_dense(const u16* __restrict__ A, const u16* __restrict__ B, u16* __restrict__ C, int M, int N, int K, int Kp,
         long long ldb, long long ldc, int chunks_per_cta, int tiles, int bvec) {
    const DenseFmt fmt{A, nullptr};
    stream_registers<DenseFmt, BF16, NT, R, WARPS, SPLIT, PIPE, BR>(fmt, B, C, M, N, K, Kp, ldb, ldc, chunks_per_cta,
                                                                tiles, bvec);
}

template <int BF16, int NT, int R, int WARPS, int SPLIT, int PIPE, int BR, int MINB>
__global__ void __cluster_dims__(1, SPLIT, 1) __launch_bounds__(WARPS * 32, MINB)
tc_sp24(const u16* __restrict__ V, const u32* __restrict__ meta, const u16* __restrict__ B, u16* __restrict__ C,
        int M, int N, int K, int Kp, long long ldb, long long ldc, int chunks_per_cta, int tiles, int bvec) {
    const Sp24Fmt fmt{V, meta};
    stream_registers<Sp24Fmt, BF16, NT, R, WARPS, SPLIT, PIPE, BR>(fmt, B, C, M, N, K, Kp, ldb, ldc, chunks_per_cta,
                                                               tiles, bvec);
}

// ---- tc_sp24 on Hopper's warpgroup MMA (wgmma.mma_async.sp, sm_90a only) -----------------------
// The same packed 2:4 stream as tc_sp24 (values in fragment order, mma.sp metadata words): the
// A fragment and metadata of wgmma.sp.m64nNk32 are, per warp of the warpgroup, those of
// mma.sp.m16n8k32 for the warp's 16 rows, so each warp's data are its tile's tc_sp24 stream
// (staged through shared memory, see sp_copy_async).
// What changes is B: the tensor cores read it from shared memory through a matrix descriptor, for
// the warpgroup's 64 rows at once, instead of every warp pulling fragments with ldmatrix per 16
// rows. The staged B slice (rows permuted per chunk as for mma.sp, NT 16-byte units XOR-swizzled
// per BStride) is byte for byte the MN-major canonical layout with the 128/64/32-byte swizzle for
// NT = 8/4/2 and the interleaved one for NT = 1, provided it starts at a 1024-byte boundary.
// Accumulators stay in the asynchronous pipe between chunks: a warpgroup issues a chunk's two
// wgmma, commits them, and waits only for the previous chunk's group before reusing that chunk's
// A registers, so loads, MMAs and the next chunk's issue overlap.
// Compiled only for sm_90a (NVRTC -arch=sm_90a); any other target gets a body that traps, so the
// file still compiles for sm_90 / sm_80 and the host never launches it there.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SD_HAVE_WGMMA 1
#else
#define SD_HAVE_WGMMA 0
#endif

#define SD_WG_ALIGN 1024      // the 128-byte swizzle repeats every 1024 bytes

// The wgmma kernel's B chunk (64 rows, 8 NT columns) in shared memory. For NT <= 8 it is the
// BStride layout (rows of NT 16-byte units XOR-swizzled), which is byte for byte the MN-major
// canonical layout with the 128/64/32-byte swizzle for NT = 8/4/2 and the interleaved one for NT = 1,
// once it starts at a 1024-byte boundary. NT = 16 (N up to 128 in one launch block, so A is read
// once for 128 columns) is two such NT = 8 blocks of 64 columns, 8 KiB apart: the descriptor's
// leading byte offset steps from one to the other.
template <int NT>
struct WgB {
    static constexpr int SUB = NT > 8 ? NT / 8 : 1;          // 64-column blocks
    static constexpr int UNITS = NT > 8 ? 8 : NT;            // 16-byte units per row of a block
    static constexpr int ROW = 16 * UNITS;                   // bytes per row of a block
    static constexpr int BLOCK = SD_CHUNK * ROW;             // bytes per 64-column block of a chunk
    static constexpr int CHUNK = SUB * BLOCK;                // bytes per chunk
    static constexpr int STEP = 32 * ROW;                    // the second k32 step of a chunk
    static __device__ __forceinline__ int offset(int prow, int j) {
        const int h = j / UNITS, u = j - h * UNITS;
        return h * BLOCK + prow * ROW + 16 * BStride<UNITS>::unit(prow, u);
    }
    // Shared-memory matrix descriptor of one k32 step (32 rows) of a chunk at `addr`.
    static __device__ __forceinline__ u64 desc(u32 addr) {
        constexpr u64 row16 = UNITS;                          // a row in 16-byte units
        constexpr u64 mode = UNITS == 8 ? 1 : UNITS == 4 ? 2 : UNITS == 2 ? 3 : 0;   // 128B/64B/32B/none
        // swizzled: SBO = 8 rows, LBO = the next 64-column block; interleaved (NT = 1): LBO = 8 rows
        constexpr u64 lbo = UNITS == 1 ? 8 * row16 : (SUB > 1 ? BLOCK / 16 : 1);
        constexpr u64 sbo = 8 * row16;
        return (u64)((addr & 0x3FFFFu) >> 4) | (lbo << 16) | (sbo << 32) | (mode << 62);
    }
};

// This thread's share of staging one chunk of B, worked out once (the kernel stages a chunk per
// iteration): which pieces it copies and where they go in a slot. Staging piece by piece from
// scratch (stage_b_chunk, the mma.sync ring's) redoes the row permutation, the swizzle and the 64-bit
// address arithmetic for every piece of every chunk: ~45 instructions a piece, most of the issue
// slots at N = 64 (H200 ncu, session 27: 230 warp instructions per 16-row tile and chunk, 149 with
// this). With THREADS a multiple of NT a thread's pieces share their columns, so it keeps one
// column, one first row and a slot offset per piece.
template <int NT, int THREADS>
struct WgBPieces {
    static_assert(THREADS % NT == 0, "a thread's pieces share one column");
    static constexpr int P = (SD_CHUNK * NT + THREADS - 1) / THREADS;
    static constexpr int ROWS_PER = THREADS / NT;            // rows between a thread's pieces
    int dst[P];        // byte offset in a slot, -1 past the chunk's rows
    int kl0, n;        // first row within the chunk, first column
    bool vec;          // 16-byte cp.async (B rows aligned, the piece inside N)
    __device__ __forceinline__ WgBPieces(int n0, int N, int bvec) {
        const int j = threadIdx.x % NT;
        kl0 = threadIdx.x / NT;
        n = n0 + 8 * j;
        vec = bvec && n + 8 <= N;
#pragma unroll
        for (int q = 0; q < P; ++q) {
            const int r = kl0 + q * ROWS_PER;
            dst[q] = r < SD_CHUNK ? WgB<NT>::offset(phys_row_sp(r), j) : -1;
        }
    }
    __device__ __forceinline__ void stage(unsigned char* slot, const u16* __restrict__ B, int k0, int K, int N,
                                          long long ldb) const {
        const u32 slot_addr = smem_addr(slot);
#pragma unroll
        for (int q = 0; q < P; ++q) {
            if (dst[q] < 0) continue;
            const int k = k0 + kl0 + q * ROWS_PER;
            const u16* src = B + (long long)min(k, K - 1) * ldb + n;
            if (vec) cp_async16(slot_addr + dst[q], src, k < K ? 16u : 0u);
            else *reinterpret_cast<uint4*>(slot + dst[q]) = b_piece_gather(src, k, K, n, N);
        }
    }
};

__device__ __forceinline__ void wg_fence() {
#if SD_HAVE_WGMMA
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}

__device__ __forceinline__ void wg_commit() {
#if SD_HAVE_WGMMA
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}

template <int PENDING>
__device__ __forceinline__ void wg_wait() {
#if SD_HAVE_WGMMA
    asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(PENDING) : "memory");
#endif
}

__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

#define SD_WG_OPS4(a, o) "+f"(a[o][0]), "+f"(a[o][1]), "+f"(a[o][2]), "+f"(a[o][3])
// The asm operands: 4 NT accumulators first (outputs), then a0..a3, the descriptor, the metadata
// and scale-d, whose operand numbers the caller spells out (PTX inline asm has no named operands).
#define SD_WG_SP(TY, N, DREGS, A0, A1, A2, A3, DESC, E, SC, ...)                                     \
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %" #SC ", 0;\n\t"                                  \
                 "wgmma.mma_async.sp.sync.aligned.m64n" #N "k32.f32." TY "." TY " " DREGS ", "      \
                 "{%" #A0 ", %" #A1 ", %" #A2 ", %" #A3 "}, %" #DESC ", %" #E ", 0, p, 1, 1, 1; }"  \
                 : __VA_ARGS__ : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(e), "r"(scale))
#define SD_WG_D4 "{%0, %1, %2, %3}"
#define SD_WG_D8 "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define SD_WG_D16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define SD_WG_D32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define SD_WG_D64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
                  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
                  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define SD_WG_OPS8(d, o) SD_WG_OPS4(d, o), SD_WG_OPS4(d, o + 1)
#define SD_WG_OPS16(d, o) SD_WG_OPS8(d, o), SD_WG_OPS8(d, o + 2)
#define SD_WG_OPS32(d, o) SD_WG_OPS16(d, o), SD_WG_OPS16(d, o + 4)
#define SD_WG_OPS64(d) SD_WG_OPS32(d, 0), SD_WG_OPS32(d, 8)

// d[j][i] += sparse A (64 x 32: four registers per thread, metadata e) x B (32 x 8NT, descriptor
// desc); scale = 0 overwrites d instead. The accumulator order is mma.sync's m16n8 one per n8 tile j.
template <int BF16, int NT>
__device__ __forceinline__ void wgmma_sp(float (&d)[NT][4], u32 a0, u32 a1, u32 a2, u32 a3, u64 desc, u32 e, u32 scale) {
#if SD_HAVE_WGMMA
    static_assert(NT == 1 || NT == 2 || NT == 4 || NT == 8 || NT == 16, "wgmma_sp: NT must be 1, 2, 4, 8 or 16");
    if constexpr (NT == 1) {
        if (BF16) SD_WG_SP("bf16", 8, SD_WG_D4, 4, 5, 6, 7, 8, 9, 10, SD_WG_OPS4(d, 0));
        else SD_WG_SP("f16", 8, SD_WG_D4, 4, 5, 6, 7, 8, 9, 10, SD_WG_OPS4(d, 0));
    } else if constexpr (NT == 2) {
        if (BF16) SD_WG_SP("bf16", 16, SD_WG_D8, 8, 9, 10, 11, 12, 13, 14, SD_WG_OPS8(d, 0));
        else SD_WG_SP("f16", 16, SD_WG_D8, 8, 9, 10, 11, 12, 13, 14, SD_WG_OPS8(d, 0));
    } else if constexpr (NT == 4) {
        if (BF16) SD_WG_SP("bf16", 32, SD_WG_D16, 16, 17, 18, 19, 20, 21, 22, SD_WG_OPS16(d, 0));
        else SD_WG_SP("f16", 32, SD_WG_D16, 16, 17, 18, 19, 20, 21, 22, SD_WG_OPS16(d, 0));
    } else if constexpr (NT == 8) {
        if (BF16) SD_WG_SP("bf16", 64, SD_WG_D32, 32, 33, 34, 35, 36, 37, 38, SD_WG_OPS32(d, 0));
        else SD_WG_SP("f16", 64, SD_WG_D32, 32, 33, 34, 35, 36, 37, 38, SD_WG_OPS32(d, 0));
    } else {
        if (BF16) SD_WG_SP("bf16", 128, SD_WG_D64, 64, 65, 66, 67, 68, 69, 70, SD_WG_OPS64(d));
        else SD_WG_SP("f16", 128, SD_WG_D64, 64, 65, 66, 67, 68, 69, 70, SD_WG_OPS64(d));
    }
#endif
}

// One 64-column chunk of a 16-row tile: its two k32 steps, A from tc_sp24's register order x (sp_load /
// sp_lds: words 0-3 row g's, 4-7 row g+8's, 8-9 the steps' metadata), B from the chunk at `bslot`;
// accumulate = false overwrites the accumulators (scale-d = 0: a slice's first chunk).
template <int BF16, int NT>
__device__ __forceinline__ void wgmma_chunk(float (&d)[NT][4], const u32 (&x)[10], u32 bslot, bool accumulate) {
    wgmma_sp<BF16, NT>(d, x[0], x[4], x[1], x[5], WgB<NT>::desc(bslot), x[8], accumulate);
    wgmma_sp<BF16, NT>(d, x[2], x[6], x[3], x[7], WgB<NT>::desc(bslot + WgB<NT>::STEP), x[9], 1u);
}
#undef SD_WG_SP
#undef SD_WG_D4
#undef SD_WG_D8
#undef SD_WG_D16
#undef SD_WG_D32
#undef SD_WG_D64
#undef SD_WG_OPS8
#undef SD_WG_OPS16
#undef SD_WG_OPS32
#undef SD_WG_OPS64
#undef SD_WG_OPS4

// A warp whose 16-row tile lies past M inside an active warpgroup still takes part in every wgmma:
// zero values under valid metadata (positions 0 and 1 in every group, as prepare pads empty groups).
__device__ __forceinline__ void sp_zero(u32 (&x)[10]) {
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = 0u;
    x[8] = x[9] = 0x44444444u;
}

// A tile's chunk through shared memory: wgmma.fence waits for every register write the warp still
// has in flight, so loading the A fragments from global memory straight into registers (as
// tc_sp24 does) made each chunk wait for the loads of all later chunks (H200, session 27: 0.64x
// cuBLAS at N = 64, below the mma.sync kernel). Instead each lane copies its own 16-byte pieces and
// metadata words with cp.async into a per-warp slot, and reads them back with three shared loads
// just before the wgmma (no cross-lane exchange, so no warp barrier).
#define SD_WG_SLOT 1152       // per warp and chunk: 1024 bytes of values, 128 bytes of metadata

__device__ __forceinline__ void cp_async8(u32 dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" :: "r"(dst), "l"(src) : "memory");
}

__device__ __forceinline__ void sp_copy_async(u32 slot, const u16* __restrict__ V, const u32* __restrict__ meta,
                                              int nchunks, int tile, int c, int lane) {
    const long long blk = sp_block(nchunks, tile, c);
    const u16* p = sp_values(V, blk, lane);
    cp_async16(slot + 16 * lane, p, 16u);
    cp_async16(slot + 512 + 16 * lane, p + 256, 16u);
    const int g = lane >> 2, t = lane & 3;
    if (t < 2) cp_async8(slot + 1024 + 8 * (2 * g + t), sp_meta_words(meta, blk, g, t));
}

// x in tc_sp24's register order (sp_load): every lane reads back only what it copied itself (lanes
// t = 2, 3 carry no metadata: the sparsity selector 0 takes it from t = 0, 1).
__device__ __forceinline__ void sp_lds(u32 slot, int lane, u32 (&x)[10]) {
    const int g = lane >> 2, t = lane & 3;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3])
                 : "r"(slot + 16 * lane));
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(x[4]), "=r"(x[5]), "=r"(x[6]), "=r"(x[7])
                 : "r"(slot + 512 + 16 * lane));
    if (t < 2)
        asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(x[8]), "=r"(x[9]) : "r"(slot + 1024 + 8 * (2 * g + t)));
}

// Warpgroup w of CTA (x, y, z) owns R row blocks of 64 (its warp j: tiles tile0 + (4w + j) R + rt,
// rt < R; a wgmma takes one tile per warp, so row block rt is the warps' tiles rt), K slice y, n
// block z. R = 2 reads each staged B chunk once for 128 rows per warpgroup: half the shared-memory
// staging and L2 traffic of B per A byte, for twice the accumulators.
// One prefetch distance D = PIPE - 1 for both operands: iteration i commits one cp.async group
// holding A chunk i + D (every warp, into its slot (i + D) % PIPE) and, with a B ring, B chunk
// i + D (slot (i + D) % BR, BR >= D + 2: the slot's previous chunk, i + D - BR <= i - 2, is done in
// every warpgroup, each having waited for chunk i - 2's wgmma before the barrier of chunk i).
// MINB: CTAs per SM the compiler must leave registers for, 0 for no cap (the host's MINB 0 means
// "auto" for this kernel and passes tc_launch.wg_minb's cap instead). Measured on
// the H200 (session 27): at NT = 8 the kernel took 80 or 86 registers depending on small code
// changes, and 86 leaves two 256-thread CTAs per SM instead of three (11008x4096 2:4, N = 64: 23.0
// vs 30.8 us for the same grid).
template <int BF16, int NT, int R, int WARPS, int SPLIT, int PIPE, int BR, int MINB>
__global__ void __cluster_dims__(1, SPLIT, 1) __launch_bounds__(WARPS * 32, MINB)
tc_sp24wg(const u16* __restrict__ V, const u32* __restrict__ meta, const u16* __restrict__ B, u16* __restrict__ C,
          int M, int N, int K, int Kp, long long ldb, long long ldc, int chunks_per_cta, int tiles, int bvec) {
    static_assert(WARPS % 4 == 0, "a CTA holds whole warpgroups");
    static_assert(R == 1 || R == 2, "one or two row tiles per warp");
    static_assert(PIPE >= 2, "one chunk in flight at least");
    static_assert(BR == 0 || BR >= PIPE + 1, "the B ring must hold the prefetch distance plus two chunks");
#if SD_HAVE_WGMMA
    constexpr int D = PIPE - 1;
    constexpr int ASLOT = R * SD_WG_SLOT;                 // a warp's A stage: R tiles of one chunk
    constexpr int SLOTS = BR > 0 ? BR : 1;                // B ring slots (BR = 0: chunk i at slot i)
    extern __shared__ __align__(16) unsigned char smem[];
    const WarpWork<NT, R, WARPS> ww(Kp, chunks_per_cta);
    const int lane = ww.lane, nchunks = ww.nchunks, c0 = ww.c0, c1 = ww.c1, n0 = ww.n0, tile0 = ww.tile0, tile = ww.tile;
    const int nc = c1 - c0;   // the same for every warp of the CTA
    constexpr int SLOT_BYTES = WgB<NT>::CHUNK;
    unsigned char* bsm = smem + ((SD_WG_ALIGN - (smem_addr(smem) & (SD_WG_ALIGN - 1))) & (SD_WG_ALIGN - 1));
    const int b_bytes = (BR ? BR : chunks_per_cta) * SLOT_BYTES;
    const u32 bs = smem_addr(bsm);
    const u32 aslots = bs + (u32)b_bytes + (u32)(ww.warp * PIPE * ASLOT);
    const WgBPieces<NT, WARPS * 32> bp(n0, N, bvec);
    // this warp's tiles of chunk c (those past M stay zeros in registers and are never copied)
    auto copy_a = [&](u32 stage, int c) {
#pragma unroll
        for (int rt = 0; rt < R; ++rt)
            if (tile + rt < tiles) sp_copy_async(stage + rt * SD_WG_SLOT, V, meta, nchunks, tile + rt, c, lane);
    };
    if (BR == 0) {
        for (int i = 0; i < nc; ++i) bp.stage(bsm + i * SLOT_BYTES, B, (c0 + i) * SD_CHUNK, K, N, ldb);
        cp_async_commit();   // rides in the first chunk's wait; the barrier below publishes it
    }
#pragma unroll
    for (int i = 0; i < D; ++i) {   // chunks 0 .. D-1: one commit group each
        if (i < nc) {
            copy_a(aslots + i * ASLOT, c0 + i);
            if (BR > 0) bp.stage(bsm + i * SLOT_BYTES, B, (c0 + i) * SD_CHUNK, K, N, ldb);
        }
        cp_async_commit();
    }
    // No zero-initialised accumulators: the first wgmma of the slice overwrites them (scale-d = 0),
    // and every wgmma sits in CTA-uniform control flow; either otherwise makes ptxas serialize the
    // wgmma pipeline (warnings C7515 / C7518 with nvcc 13.0).
    float acc[R][NT][4];
    u32 x[2][R][10];
#pragma unroll
    for (int rt = 0; rt < R; ++rt) {
        sp_zero(x[0][rt]);
        sp_zero(x[1][rt]);
    }
    for (int c = c0; c < c1; c += 2 * PIPE) {
#pragma unroll
        for (int p = 0; p < 2 * PIPE; ++p) {
            if (c + p >= c1) continue;
            const int i = c + p - c0;
            cp_async_wait<D - 1>();                         // chunk i's group has landed (this thread's part)
            if (BR > 0 || i == 0) {
                fence_proxy_async();                        // B written by this thread, for the tensor cores
                __syncthreads();                            // ... and by every thread
            }
#pragma unroll
            for (int rt = 0; rt < R; ++rt)
                if (tile + rt < tiles) sp_lds(aslots + (p % PIPE) * ASLOT + rt * SD_WG_SLOT, lane, x[p & 1][rt]);
            const u32 slot = bs + (u32)((BR > 0 ? i % SLOTS : i) * SLOT_BYTES);
            wg_fence();
#pragma unroll
            for (int rt = 0; rt < R; ++rt) {                // one B descriptor feeds every row block
                wgmma_chunk<BF16, NT>(acc[rt], x[p & 1][rt], slot, i > 0);
            }
            wg_commit();
            wg_wait<1>();                                   // chunk i-1's group: its registers and B slot are free
            if (i + D < nc) {
                copy_a(aslots + ((p + D) % PIPE) * ASLOT, c + p + D);
                if (BR > 0) bp.stage(bsm + ((i + D) % SLOTS) * SLOT_BYTES, B, (c + p + D) * SD_CHUNK, K, N, ldb);
            }
            cp_async_commit();
        }
    }
    wg_wait<0>();
    cp_async_wait<0>();
    if (nc <= 0) zero_acc(acc);   // an empty K slice (uniform across the CTA): its partials are zeros
    if (SPLIT > 1) __syncthreads();   // the partials go over B's shared memory
    epilogue<BF16, NT, R, WARPS, SPLIT>(acc, reinterpret_cast<float*>(smem), C, ldc, M, N, n0, tile0);
#else
    __trap();
#endif
}

// ---- tc_sp24tma: the wgmma kernel fed by the copy engine -------------------------------------
// tc_sp24wg spends its issue slots on feeding itself: every thread stages B pieces with cp.async,
// the CTA meets at a barrier per chunk, every warp waits for its own copies (H200 ncu, session 27,
// 11008x4096 2:4 at N = 64: 8.3 M warp instructions, issue active 48%, DRAM 50%, stalls on the
// wait / barrier / long scoreboard). Here one producer warp drives the copy engine instead: per chunk
// one mbarrier-tracked transaction with B (a tiled tensor copy that lands B in the swizzled canonical
// layout the descriptor reads) and each warp's A block (two 1-D bulk copies, 1024 bytes of values and
// 128 of metadata, already laid out as the slot tc_sp24wg's cp.async builds), STAGES chunks ahead.
// The consumer warpgroups only wait on the stage's "full" barrier, read A (three shared loads), issue
// the two wgmma and, once a chunk's wgmma are done, arrive on its "empty" barrier: no CTA barrier.
// A is a warp's own: its slot of a stage is free once its own shared loads have returned, so each
// consumer warp refills it itself (lane 0, two bulk copies on a barrier of its own, STAGES chunks
// ahead) right after the wgmma that used it. The first version had the producer issue every warp's
// A as well (20 copies per chunk from one thread): on the H200 (session 28) that thread set the pace,
// 11008x4096 2:4 at N = 64 took 31.2 us (0.81x cuBLAS) and WARPS = 4 (two producers per 128 rows)
// 22.5 us, with consumers stalled on the barriers (ncu: long scoreboard 9.65 per issue).
//
// B's tensor map (host: tc_launch / tensor_map.py) views B[K, N] as 3-D, {N, 16, K / 16} with row
// strides ldb and 16 ldb, so that box {8 NT' , 4, 4} at (n, 4q, k / 16) copies rows k + 4q + p + 16 tt
// (p, tt < 4) as 16 consecutive shared rows: exactly the physical rows 16q .. 16q + 15 of the chunk
// under phys_row_sp (logical row 16 tt + 4q + p). Four boxes per 64-column block fill a chunk; rows
// past K (K a multiple of 16) and columns past N arrive as zeros.
struct __align__(64) TensorMap { u64 w[16]; };

__device__ __forceinline__ void tensor_copy_3d(u32 dst, const TensorMap* map, int c0, int c1, int c2, u32 bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3, %4}], [%5];"
                 :: "r"(dst), "l"(reinterpret_cast<u64>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar) : "memory");
}

// The same box delivered to the same shared offset (and barrier offset) of every cluster CTA in `mask`.
__device__ __forceinline__ void tensor_copy_3d_multicast(u32 dst, const TensorMap* map, int c0, int c1, int c2,
                                                         u32 bar, unsigned short mask) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster "
                 "[%0], [%1, {%2, %3, %4}], [%5], %6;"
                 :: "r"(dst), "l"(reinterpret_cast<u64>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "h"(mask)
                 : "memory");
}

// Where B's stages and the warps' A slots sit, from the 1024-aligned base. ASTAGES = 0: each of the
// STAGES stages is B's chunk (WgB<NT>::CHUNK bytes) then every warp's A slot (SD_WG_SLOT bytes), the
// whole rounded up to 1024 so every stage's B starts on the swizzle's period. ASTAGES > 0: the STAGES
// B chunks back to back, then each warp's own ring of ASTAGES A slots, so A can run further ahead
// than B for a few KiB per stage (a B stage costs 8-16 KiB, the four warps' A 4.5 KiB).
template <int NT, int WARPS, int STAGES, int ASTAGES>
struct TmaLayout {
    static constexpr int B_BYTES = WgB<NT>::CHUNK;
    static constexpr bool RING = ASTAGES > 0;
    static constexpr int A_DEPTH = RING ? ASTAGES : STAGES;
    static constexpr int BYTES = RING ? B_BYTES                          // between B stages
        : (B_BYTES + WARPS * SD_WG_SLOT + SD_WG_ALIGN - 1) / SD_WG_ALIGN * SD_WG_ALIGN;
    static constexpr int A_BASE = RING ? STAGES * B_BYTES : B_BYTES;      // warp 0's first A slot
    static constexpr int A_WARP = RING ? A_DEPTH * SD_WG_SLOT : SD_WG_SLOT;   // between warps' slots
    static constexpr int A_SLOT = RING ? SD_WG_SLOT : BYTES;               // between a warp's slots
};

// CTA: WARPS consumer warps (WARPS / 4 warpgroups, one 16-row tile each, as tc_sp24wg with R = 1)
// and one producer warp (the last). MINB as tc_sp24wg's (0 = no cap); ASTAGES as TmaLayout's. The trailing arguments are
// tc_sp24wg's, so the host launches both the same way (B's pointer, ldb and bvec are unused here:
// the tensor map carries B).
// MX > 1: MX neighbouring row blocks (same K slice and columns) form a cluster row and share B: each
// producer copies every MX-th box of a chunk and multicasts it to all MX CTAs, so each B chunk leaves
// L2 once per MX row blocks instead of once per block (at N = 64, B's L2 traffic is 1.7x A's bytes
// with 64-row blocks). A stage is then refilled by all MX producers, so its "empty" barrier counts
// every consumer warp of the cluster row, each arriving on every CTA's barrier; the grid's x is a
// multiple of MX (a block past the last row tile streams B and computes zeros it does not store).
// Measured on the H200 (session 29, 2:4, N = 64): no faster than MX = 1 (11008x4096 22.5 against 21.6
// us; a cluster-scope release on the remote arrival had doubled it), so B's L2 traffic is not what
// bounds this kernel; MX = 1 stays the default (tc_launch MCAST).
template <int BF16, int NT, int WARPS, int SPLIT, int STAGES, int MINB, int ASTAGES, int MX>
__global__ void __cluster_dims__(MX, SPLIT, 1) __launch_bounds__((WARPS + 1) * 32, MINB)
tc_sp24tma(const __grid_constant__ TensorMap bmap, const u16* __restrict__ V, const u32* __restrict__ meta,
           const u16* __restrict__ B, u16* __restrict__ C, int M, int N, int K, int Kp, long long ldb, long long ldc,
           int chunks_per_cta, int tiles, int bvec) {
    static_assert(WARPS % 4 == 0, "a CTA holds whole warpgroups");
    static_assert(NT == 4 || NT == 8 || NT == 16, "the tensor copy fills 64-, 128-byte swizzled rows");
    static_assert(STAGES >= 2 && (ASTAGES == 0 || ASTAGES >= 2), "one chunk in flight at least");
    static_assert(MX >= 1 && MX * SPLIT <= 8 && (WgB<NT>::SUB * 4) % MX == 0, "a portable cluster; whole boxes per CTA");
#if SD_HAVE_WGMMA
    using Stage = TmaLayout<NT, WARPS, STAGES, ASTAGES>;
    constexpr int AD = Stage::A_DEPTH;
    extern __shared__ __align__(16) unsigned char smem[];
    const WarpWork<NT, 1, WARPS> ww(Kp, chunks_per_cta);
    const int lane = ww.lane, warp = ww.warp, c0 = ww.c0, n0 = ww.n0, tile0 = ww.tile0, tile = ww.tile;
    const int nc = ww.c1 - c0;
    // mbarriers: B full[STAGES], B empty[STAGES], then each consumer warp's A full[AD]
    const u32 bars = smem_addr(smem);
    const u32 base = (bars + 8 * (2 * STAGES + WARPS * AD) + SD_WG_ALIGN - 1) & ~(u32)(SD_WG_ALIGN - 1);
    unsigned char* stages = smem + (base - bars);
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(bars + 8 * s, 1);                   // the producer's expect_tx arrival
            mbar_init(bars + 8 * (STAGES + s), WARPS * MX);    // one arrival per consumer warp of the row
        }
        for (int s = 0; s < AD * WARPS; ++s) mbar_init(bars + 8 * (2 * STAGES + s), 1);
        fence_barrier_init();
    }
    if (MX > 1) cluster_sync_all();                       // the peers' barriers exist before any multicast
    else __syncthreads();
    const u32 crank = MX > 1 ? cluster_rank() : 0;
    const u32 row0 = crank / MX * MX;                     // cluster rank of this row's first CTA
    float acc[1][NT][4];
    if (warp == WARPS) {
        if (lane == 0 && nc > 0) {
            asm volatile("prefetch.tensormap [%0];" :: "l"(reinterpret_cast<u64>(&bmap)) : "memory");
            for (int i = 0; i < nc; ++i) {
                const int s = i % STAGES;
                const u32 full = bars + 8 * s, stage = base + (u32)(s * Stage::BYTES);
                if (i >= STAGES) mbar_wait(bars + 8 * (STAGES + s), ((i / STAGES) - 1) & 1);
                mbar_expect_tx(full, (u32)Stage::B_BYTES);      // the whole chunk, whoever copies it
#pragma unroll
                for (int h = 0; h < WgB<NT>::SUB; ++h)
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        const u32 dst = stage + h * WgB<NT>::BLOCK + q * 16 * WgB<NT>::ROW;
                        const int kc = (c0 + i) * (SD_CHUNK / 16);
                        if (MX == 1) tensor_copy_3d(dst, &bmap, n0 + 64 * h, 4 * q, kc, full);
                        else if ((h * 4 + q) % MX == (int)(crank - row0))
                            tensor_copy_3d_multicast(dst, &bmap, n0 + 64 * h, 4 * q, kc, full,
                                                     (unsigned short)(((1u << MX) - 1) << row0));
                    }
            }
        }
    } else {
        u32 x[2][10];
        sp_zero(x[0]);
        sp_zero(x[1]);
        const bool live = tile < tiles;                    // a tile past M keeps zeros and copies nothing
        const u32 aslot = base + (u32)(Stage::A_BASE + warp * Stage::A_WARP);
        const u32 afull = bars + 8 * (2 * STAGES + warp * AD);
        auto fetch_a = [&](int i) {                        // lane 0: chunk i of this warp's tile
            const int s = i % AD;
            const long long blk = sp_block(ww.nchunks, tile, c0 + i);
            const u32 bar = afull + 8 * s, slot = aslot + (u32)(s * Stage::A_SLOT);
            mbar_expect_tx(bar, (u32)SD_WG_SLOT);
            bulk_copy(slot, sp_values(V, blk, 0), 1024u, bar);
            bulk_copy(slot + 1024, sp_meta_words(meta, blk, 0, 0), 128u, bar);
        };
        if (live && lane == 0)
            for (int i = 0; i < min(AD, nc); ++i) fetch_a(i);
        auto step = [&](int i, u32 (&xa)[10]) {
            const int s = i % STAGES;
            const u32 stage = (u32)(s * Stage::BYTES);
            if (live) {
                const int sa = i % AD;
                mbar_wait(afull + 8 * sa, (i / AD) & 1);
                sp_lds(aslot + (u32)(sa * Stage::A_SLOT), lane, xa);
            }
            mbar_wait(bars + 8 * s, (i / STAGES) & 1);
            wg_fence();
            wgmma_chunk<BF16, NT>(acc[0], xa, base + stage, i > 0);
            wg_commit();
            // the wgmma took xa, so this warp's loads of the slot have returned: refill it
            if (live && lane == 0 && i + AD < nc) fetch_a(i + AD);
            wg_wait<1>();                                  // chunk i - 1's wgmma are done: release its stage
            if (i > 0) {
                const u32 empty = bars + 8 * (STAGES + (i - 1) % STAGES);
                if (MX == 1 && lane == 0) mbar_arrive(empty);
                else if (MX > 1 && lane < MX) mbar_arrive_cluster(empty, row0 + lane);   // every producer of the row
            }
        };
        for (int i = 0; i < nc; i += 2) {                  // two register sets: chunk i's may still be read
            step(i, x[0]);
            if (i + 1 < nc) step(i + 1, x[1]);
        }
        wg_wait<0>();
        if (nc <= 0) {
            zero_acc(acc);
        }
    }
    float* cpart = reinterpret_cast<float*>(stages);
    if (SPLIT == 1) {
        if (warp < WARPS) epilogue<BF16, NT, 1, WARPS, 1>(acc, cpart, C, ldc, M, N, n0, tile0);
        if (MX > 1) cluster_sync_all();                   // no CTA leaves while a peer may still arrive on it
        return;
    }
    __syncthreads();                                      // every stage consumed: partials go over them
    if (warp < WARPS) {
        epilogue<BF16, NT, 1, WARPS, SPLIT, MX>(acc, cpart, C, ldc, M, N, n0, tile0);
    } else {
        split_reduce<BF16, NT, WARPS * 16, SPLIT, MX>(cpart, C, ldc, M, N, n0, tile0);
    }
#else
    __trap();
#endif
}

// ---- tc_bitmap ------------------------------------------------------------------------------
// Per (16-row tile, 64-column chunk) a blob, 16-byte aligned, at blob_off[tile * (nchunks+1) + c]
// (in 16-byte units): a 176-byte chunk header, then the values of its 4 steps, then padding. A
// tile's blobs are consecutive, so a work unit (UNIT chunks) is one bulk copy.
//   W[g][s] (u32, byte 16g + 4s): the octets of lanes 4g..4g+3 at step s (byte t = lane (g, t)):
//     low nibble = row g's columns 16t+4s+0..3 of the chunk, high nibble = row g+8's.
//   P[g][s] (u8, byte 128 + 4g + s): for g >= 1 the kept values of lanes 0 .. 4g-1 at step s (the
//     rank of lane (g, 0)); P[0][s] = 0.
//   cum[s] (u16, byte 160 + 2s): kept values of the chunk's steps before s; size (u32, byte 168):
//     the blob's bytes, so a consumer walks a unit's blobs without reading the offsets again.
//   One 16-byte, one 4-byte and one 8-byte load per lane read a whole chunk's header (176 bytes).
//   values: step 0's kept values in lane order (each lane: row g's quad, then row g+8's), step 1's...
// Decode of one quad: two LDS.U16 at the quad's rank give slots 0/1, two at rank + (b0 + b1) give
// slots 2/3, and one PRMT per pair places them (zero bytes come from the zero-extended loads); a
// 16-entry table per nibble supplies both PRMT selectors and the two offsets.

#define SD_BITMAP_HDR 176

__device__ __forceinline__ u32 lut_entry_x(u32 n) {
    // selA | offB << 16 for nibble n: slot0 = b0 ? h0 : 0, slot1 = b1 ? (b0 ? h1 : h0) : 0
    const u32 b0 = n & 1, b1 = (n >> 1) & 1;
    const u32 s0 = b0 ? 0x10u : 0x32u;
    const u32 s1 = b1 ? (b0 ? 0x54u : 0x10u) : 0x32u;
    return (s0 | (s1 << 8)) | ((2u * (b0 + b1)) << 16);
}

__device__ __forceinline__ u32 lut_entry_y(u32 n) {
    // selB | cnt << 16: the same select on (b2, b3) and the quad's value bytes (2 * popc)
    const u32 b2 = (n >> 2) & 1, b3 = (n >> 3) & 1;
    const u32 s0 = b2 ? 0x10u : 0x32u;
    const u32 s1 = b3 ? (b2 ? 0x54u : 0x10u) : 0x32u;
    return (s0 | (s1 << 8)) | ((2u * (u32)__popc(n)) << 16);
}

// The two A-fragment registers of one quad (slots 0/1 and 2/3) and the next quad's value address.
__device__ __forceinline__ void decode_quad(u32 va, uint2 L, u32& lo, u32& hi, u32& vnext) {
    const u32 h0 = lds_u16(va), h1 = lds_u16(va + 2);
    const u32 vb = va + (L.x >> 16);
    const u32 g0 = lds_u16(vb), g1 = lds_u16(vb + 2);
    lo = prmt(h0, h1, L.x);
    hi = prmt(g0, g1, L.y);
    vnext = va + (L.y >> 16);
}

// A prologue the streaming kernels share (blob_stream_bulk, tc_scatter_rg, tc_words_grp): the CTA's K slice of B staged by
// every thread and waited for, the accumulators zeroed; B's shared address back.
template <int NT, int R = 1>
__device__ __forceinline__ u32 stage_b_slice(unsigned char* smem, const u16* __restrict__ B, int c0, int chunks_per_cta,
                                             int K, int n0, int N, long long ldb, int bvec, float (&acc)[R][NT][4]) {
    stage_b<NT, 0>(smem, B, c0 * SD_CHUNK, chunks_per_cta * SD_CHUNK, K, n0, N, ldb, bvec);
    cp_async_wait_all();
    __syncthreads();
    zero_acc(acc);
    return smem_addr(smem);
}

// A warp's u32 blob offsets per K slice in shared memory: chunks + 1, rounded up to 16 bytes
// (tc_launch.blob_offsets_stride).
__device__ __forceinline__ int blob_offsets_stride(int chunks) { return (chunks + 4) & ~3; }

// Stage the offsets of tile `tile`'s blobs c0 .. c0 + nc (nc + 1 words: each blob's end is the next
// one's start) into the warp's `offs`.
__device__ __forceinline__ void stage_blob_offsets(u32* offs, const u32* __restrict__ blob_off, int tile, int nchunks,
                                                   int c0, int nc, int lane) {
    if (nc) {
        const u32* off = blob_off + (long long)tile * (nchunks + 1) + c0;
        for (int i = lane; i <= nc; i += 32) offs[i] = off[i];
    }
}

// ---- the bulk blob ring (tc_bitmap; tc_words LOAD="bulk") -------------------------------------
// Each warp streams its tile's blobs over the CTA's K slice in units of SD_UNIT consecutive blobs
// (one bulk copy each: a tile's blobs of a K slice are contiguous) through a byte ring of RING_KB
// KiB in shared memory, up to SD_SLOTS units in flight on mbarriers. Lane 0 places units in the ring
// (wrapping to the start when one does not fit before the end; strict inequalities keep a full ring
// from ever looking empty) and issues the copies; every lane waits on the unit's slot and walks its
// blobs by the staged offsets. The warp's blob offsets are staged in shared memory first, so issuing
// never waits on global loads. Why bulk copies: one instruction moves a unit of 4 blobs, where the
// cp.async ring (blob_stream) spends a size computation and a 16-byte copy per lane and round per
// blob, and the ring keeps several KiB per warp in flight with few warps.
#define SD_SLOTS 4
#define SD_UNIT 4

// Lane 0's side of a warp's ring: which units are in flight, where each sits.
struct BulkBlobRing {
    const unsigned char* blobs;
    const u32* offs;      // the warp's staged blob offsets (16-byte units), chunks of its K slice
    u32* pos;             // [SD_SLOTS] ring byte position of each slot's unit
    u32 ring, bars;       // shared addresses of the ring and of the slots' mbarriers
    u32 ring_bytes;
    int chunks, units;    // chunks of the warp's K slice, bulk units they make
    int issued = 0;       // units issued so far
    u32 head = 0;         // the ring's next free byte
    __device__ __forceinline__ BulkBlobRing(const unsigned char* blobs_, const u32* offs_, u32* pos_, u32 ring_,
                                            u32 bars_, u32 ring_bytes_, int chunks_)
        : blobs(blobs_), offs(offs_), pos(pos_), ring(ring_), bars(bars_), ring_bytes(ring_bytes_), chunks(chunks_),
          units((chunks_ + SD_UNIT - 1) / SD_UNIT) {}
    // Issue every unit that has a free slot and room in the ring, `consumed` units being done with.
    __device__ __forceinline__ void issue_ready(int consumed) {
        while (issued < units && issued - consumed < SD_SLOTS) {
            const int cb = issued * SD_UNIT, ce = min(cb + SD_UNIT, chunks);
            const u32 lo = offs[cb], size = (offs[ce] - lo) * 16u;
            if (size > ring_bytes) __trap();   // the host sizes RING_KB to the largest unit; never overrun
            u32 p;
            if (issued == consumed) {
                p = 0;
            } else {
                const u32 tail = pos[consumed % SD_SLOTS];
                if (head >= tail) p = (head + size <= ring_bytes) ? head : (size < tail ? 0u : ring_bytes);
                else p = (head + size < tail) ? head : ring_bytes;
                if (p == ring_bytes) break;
            }
            const int slot = issued % SD_SLOTS;
            pos[slot] = p;
            bulk_load(ring + p, blobs + (u64)lo * 16u, size, bars + 8 * slot);
            head = p + size;
            ++issued;
        }
    }
};

// The stream itself, generic over the decoder (its chunk() as blob_stream's). Shared memory, in
// order: B's slice, the split-K partials, Decoder::EXTRA, each warp's SD_SLOTS mbarriers, their ring
// positions, each warp's ring, each warp's chunks + 1 offsets (tc_launch.smem_bytes).
template <int BF16, int NT, int WARPS, int SPLIT, int RING_KB, class Decoder>
__device__ __forceinline__ void blob_stream_bulk(const unsigned char* __restrict__ blobs, const u32* __restrict__ blob_off,
                                                 const u16* __restrict__ B, u16* __restrict__ C, int M, int N, int K,
                                                 int Kp, long long ldb, long long ldc, int chunks_per_cta, int tiles,
                                                 int bvec) {
    extern __shared__ __align__(16) unsigned char smem[];
    constexpr u32 RING = RING_KB * 1024;
    const WarpWork<NT, 1, WARPS> ww(Kp, chunks_per_cta);
    const int lane = ww.lane, warp = ww.warp, nchunks = ww.nchunks, c0 = ww.c0, c1 = ww.c1, n0 = ww.n0;
    const int tile0 = ww.tile0, tile = ww.tile;
    const int nc = ww.active(tiles) ? c1 - c0 : 0;
    const int b_bytes = SmemPlan<NT, 1, WARPS, SPLIT>::b_bytes(chunks_per_cta * SD_CHUNK);
    unsigned char* cpart_p = smem + b_bytes;
    unsigned char* extra = cpart_p + SmemPlan<NT, 1, WARPS, SPLIT>::cpart_bytes;
    u64* bars = reinterpret_cast<u64*>(extra + Decoder::EXTRA);                     // [WARPS][SD_SLOTS]
    u32* pos = reinterpret_cast<u32*>(bars + WARPS * SD_SLOTS);                     // [WARPS][SD_SLOTS]
    unsigned char* rings = reinterpret_cast<unsigned char*>(pos + WARPS * SD_SLOTS);   // [WARPS][RING]
    u32* offs = reinterpret_cast<u32*>(rings + WARPS * RING);                       // [WARPS][chunks_per_cta + 1]
    u32* my_pos = pos + warp * SD_SLOTS;
    u32* my_offs = offs + warp * (chunks_per_cta + 1);
    unsigned char* my_ring = rings + warp * RING;
    const u32 my_bars = smem_addr(bars + warp * SD_SLOTS);
    Decoder dec(extra, warp, lane);
    stage_blob_offsets(my_offs, blob_off, tile, nchunks, c0, nc, lane);
    if (lane == 0) {
        for (int i = 0; i < SD_SLOTS; ++i) mbar_init(my_bars + 8 * i, 1);
        fence_barrier_init();
    }
    __syncwarp();
    BulkBlobRing ring(blobs, my_offs, my_pos, smem_addr(my_ring), my_bars, RING, nc);
    if (lane == 0) ring.issue_ready(0);
    float acc[1][NT][4];
    const u32 bs = stage_b_slice<NT>(smem, B, c0, chunks_per_cta, K, n0, N, ldb, bvec, acc);
    for (int u = 0; u < ring.units; ++u) {
        const int slot = u % SD_SLOTS;
        mbar_wait(my_bars + 8 * slot, (u32)((u / SD_SLOTS) & 1));
        const unsigned char* buf = my_ring + my_pos[slot];
        const int cb = u * SD_UNIT, ce = min(cb + SD_UNIT, nc);
        for (int cc = cb; cc < ce; ++cc) {
            dec.template chunk<BF16, NT>(buf, bs, cc, acc);
            buf += (my_offs[cc + 1] - my_offs[cc]) * 16u;
        }
        __syncwarp();
        if (lane == 0) ring.issue_ready(u + 1);
        __syncwarp();
    }
    epilogue<BF16, NT, 1, WARPS, SPLIT>(acc, reinterpret_cast<float*>(cpart_p), C, ldc, M, N, n0, tile0);
}

// tc_bitmap's decoder: the chunk's header (step words, lane-group ranks, step bases), a popc rank per
// lane and step, the nibble table's PRMTs.
struct BitmapDecoder {
    static constexpr int EXTRA = 16 * 8;                         // the quad table (tc_launch.LUT_BYTES)
    u32 lut_addr, lmask;
    int g;
    __device__ __forceinline__ BitmapDecoder(unsigned char* extra, int, int lane)
        : lut_addr(smem_addr(extra)), lmask((lane & 3) ? ((1u << (8 * (lane & 3))) - 1u) : 0u), g(lane >> 2) {
        if (threadIdx.x < 16) reinterpret_cast<uint2*>(extra)[threadIdx.x] = make_uint2(lut_entry_x(threadIdx.x), lut_entry_y(threadIdx.x));
    }
    template <int BF16, int NT>
    __device__ __forceinline__ void chunk(const unsigned char* blob, u32 bs, int cc, float (&acc)[1][NT][4]) const {
        const u32 buf = smem_addr(blob);
        const int t = (int)(threadIdx.x & 3);
        uint4 wv;
        u32 pv, cum01, cum23;
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(wv.x), "=r"(wv.y), "=r"(wv.z), "=r"(wv.w) : "r"(buf + 16 * g));
        asm volatile("ld.shared.u32 %0, [%1];" : "=r"(pv) : "r"(buf + 128 + 4 * g));
        asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(cum01), "=r"(cum23) : "r"(buf + 160));
        const u32 wsteps[4] = {wv.x, wv.y, wv.z, wv.w};
        const u32 vstep[4] = {0u, cum01 >> 16, cum23 & 0xFFFFu, cum23 >> 16};
        const u32 vals0 = buf + SD_BITMAP_HDR;
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const u32 w = wsteps[s];
            const u32 rank = prmt(pv, 0u, 0x4440u + s) + (u32)__popc(w & lmask);
            const u32 octet = w >> (8 * t);
            uint2 Llo, Lhi;
            asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(Llo.x), "=r"(Llo.y) : "r"(lut_addr + 8 * (octet & 15u)));
            asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(Lhi.x), "=r"(Lhi.y) : "r"(lut_addr + 8 * ((octet >> 4) & 15u)));
            u32 a0, a2, a1, a3, vmid, vend;
            decode_quad(vals0 + 2 * (vstep[s] + rank), Llo, a0, a2, vmid);
            decode_quad(vmid, Lhi, a1, a3, vend);
            u32 b[NT][2];
            load_b_step<NT>(bs, cc * SD_CHUNK + 16 * s, b);
#pragma unroll
            for (int j = 0; j < NT; ++j) mma16816<BF16>(acc[0][j], a0, a1, a2, a3, b[j][0], b[j][1]);
        }
    }
};

template <int BF16, int NT, int WARPS, int SPLIT, int RING_KB>
__global__ void __cluster_dims__(1, SPLIT, 1) __launch_bounds__(WARPS * 32)
tc_bitmap(const unsigned char* __restrict__ blobs, const u32* __restrict__ blob_off, const u16* __restrict__ B,
          u16* __restrict__ C, int M, int N, int K, int Kp, long long ldb, long long ldc, int chunks_per_cta,
          int tiles, int bvec) {
    blob_stream_bulk<BF16, NT, WARPS, SPLIT, RING_KB, BitmapDecoder>(blobs, blob_off, B, C, M, N, K, Kp, ldb, ldc,
                                                                    chunks_per_cta, tiles, bvec);
}

// ---- tc_lanemask ----------------------------------------------------------------------------
// Unstructured sparsity with one 32-bit mask word per lane and chunk (tc_bitmap's successor
// candidate for N = 4..32: no per-step header, no dependent loads between a chunk's quads).
// Per (16-row tile, 64-column chunk) a blob, 16-byte aligned, at blob_off[tile * (nchunks+1) + c]
// (in 16-byte units; entry nchunks is the end of the tile's last blob):
//   words (bytes 0..127): lane L = (g, t)'s u32 mask at byte 4L: bit i (0..15) = row g, chunk column
//     16t + i; bit 16 + i = row g+8, column 16t + i: the 32 elements lane L feeds the chunk's four
//     m16n8k16 steps (tc_dense's K permutation); step s takes nibble s of each row half (slots 0/1
//     form a0 or a1, slots 2/3 a2 or a3).
//   values (from byte 128): step-major, as tc_bitmap's: step 0's kept values lane by lane (each
//     lane: its row g quad, then its row g+8 quad), then step 1's, ...; zero padding to 16 bytes.
//     Step-major keeps a warp's gathers of one step within ~8 bytes per lane: a lane-major order
//     (each lane's 32 elements in one run) put the lanes ~32 bytes apart and measured 8-way bank
//     conflicts on the H200 (ncu: 3.3 M conflicts in 7.0 M shared wavefronts, 2:4 weights 1.6x slower).
// A warp streams its tile over the CTA's K slice: each blob is copied into a ring slot of the warp's
// (PIPE slots of slot_bytes, the host's largest blob + 16) with 16-byte cp.async per lane, PIPE-1
// blobs in flight. Decode of a chunk: the lane's word; its kept values per step, packed one byte per
// step, scanned across the warp in one pass (an exclusive prefix is at most 31 * 8 = 248, so no byte
// overflows; lane 31's inclusive sum may carry, and the exclusive value, incl - own, is exact mod
// 2^32); the steps' bases from lane 31's totals; each quad's first value from those and a SWAR
// nibble count; the 16-entry table and PRMT of tc_bitmap turn each quad into two fragment registers.

// decode_quad on a plain shared-memory pointer: no volatile asm, so the compiler may issue the loads
// of several quads before the first PRMT needs one.
__device__ __forceinline__ void decode_quad_c(const unsigned char* v, uint2 L, u32& lo, u32& hi) {
    const u32 h0 = *reinterpret_cast<const u16*>(v), h1 = *reinterpret_cast<const u16*>(v + 2);
    const unsigned char* w = v + (L.x >> 16);     // + 2 * (b0 + b1) bytes: the table's offset field
    const u32 g0 = *reinterpret_cast<const u16*>(w), g1 = *reinterpret_cast<const u16*>(w + 2);
    lo = prmt(h0, h1, L.x);
    hi = prmt(g0, g1, L.y);
}

// One blob (`units` 16-byte pieces from piece `lo` of `blobs`) into the ring slot at shared address
// `dst`: 16-byte cp.async per lane, 32 pieces per round.
__device__ __forceinline__ void issue_blob(u32 slot, const unsigned char* __restrict__ blobs, u32 lo, u32 units, int lane) {
    const unsigned char* src = blobs + ((unsigned long long)lo + lane) * 16u;
    u32 dst = slot + 16u * lane;
#pragma unroll 1
    for (u32 u = lane; u < units; u += 32, src += 512, dst += 512) cp_async16(dst, src, 16u);
}

// The blob ring both unstructured stream kernels share (tc_lanemask, tc_scatter): blob i of the warp's
// K slice goes into ring slot i % PIPE (slots of slot_bytes, the host's largest blob and spare) with
// 16-byte cp.async per lane, PIPE-1 blobs in flight; B's slice is staged once; the decoder turns each
// landed blob into the chunk's four k16 steps of mma. Shared memory, in order: B's slice, the split-K
// partials, the decoder's EXTRA bytes (a table, or fragment scratch per warp), each warp's blob
// offsets, each warp's ring (tc_launch.smem_bytes has the same arithmetic). PF > 0 (tc_words' PF): lane 0
// also asks the copy engine to pull blobs into L2 PF blobs beyond the ring's last copy, so the ring's
// copies find them there. Why: ncu (session 35, 11008x4096 50% N = 16) put 26% of the stall samples on
// the warp waiting for its next blob (WARPSYNC after the cp.async wait), with one blob in flight per warp
// at PIPE 2, and a deeper ring costs shared memory and CTAs per SM (PIPE 3 measured 3.4% slower).
template <int BF16, int NT, int WARPS, int SPLIT, int PIPE, class Decoder, int PF = 0>
__device__ __forceinline__ void blob_stream(const unsigned char* __restrict__ blobs, const u32* __restrict__ blob_off,
                                            const u16* __restrict__ B, u16* __restrict__ C, int M, int N, int K,
                                            int Kp, long long ldb, long long ldc, int chunks_per_cta, int tiles,
                                            int bvec, int slot_bytes) {
    extern __shared__ __align__(16) unsigned char smem[];
    const WarpWork<NT, 1, WARPS> ww(Kp, chunks_per_cta);
    const int lane = ww.lane, warp = ww.warp, nchunks = ww.nchunks, c0 = ww.c0, n0 = ww.n0, tile0 = ww.tile0;
    const int tile = ww.tile;
    const int nc = ww.active(tiles) ? ww.c1 - c0 : 0;
    const int b_bytes = SmemPlan<NT, 1, WARPS, SPLIT>::b_bytes(chunks_per_cta * SD_CHUNK);
    unsigned char* cpart_p = smem + b_bytes;
    unsigned char* extra = cpart_p + SmemPlan<NT, 1, WARPS, SPLIT>::cpart_bytes;
    u32* my_offs = reinterpret_cast<u32*>(extra + Decoder::EXTRA) + warp * blob_offsets_stride(chunks_per_cta);
    unsigned char* my_ring = extra + Decoder::EXTRA + WARPS * blob_offsets_stride(chunks_per_cta) * 4 + warp * PIPE * slot_bytes;
    const u32 ring_addr = smem_addr(my_ring);
    Decoder dec(extra, warp, lane);
    stage_blob_offsets(my_offs, blob_off, tile, nchunks, c0, nc, lane);
    __syncwarp();
    // Blob i of this warp's K slice into ring slot i % PIPE.
    auto issue = [&](int i) {
        const u32 lo = my_offs[i];
        issue_blob(ring_addr + (u32)((i % PIPE) * slot_bytes), blobs, lo, my_offs[i + 1] - lo, lane);
    };
    // Blobs [i0, i1) of the slice into L2 (one bulk prefetch: a tile's blobs of a slice are contiguous).
    auto prefetch = [&](int i0, int i1) {
        if (lane == 0 && i0 < i1) {
            const u32 lo = my_offs[i0], hi = my_offs[i1];
            if (hi > lo) prefetch_l2(blobs + (u64)lo * 16u, (hi - lo) * 16u);
        }
    };
    if (PF) prefetch(PIPE - 1, min(nc, PIPE - 1 + PF));
    stage_b<NT, 0>(smem, B, c0 * SD_CHUNK, chunks_per_cta * SD_CHUNK, K, n0, N, ldb, bvec);
    cp_async_commit();                                           // group: B's slice
#pragma unroll
    for (int p = 0; p + 1 < PIPE; ++p) {
        if (p < nc) issue(p);
        cp_async_commit();                                       // one group per blob (maybe empty)
    }
    cp_async_wait<PIPE - 1>();                                   // B's group has landed
    __syncthreads();
    const u32 bs = smem_addr(smem);
    float acc[1][NT][4];
    zero_acc(acc);
    for (int i = 0; i < nc; ++i) {
        if (PF && i + PIPE - 1 + PF < nc) prefetch(i + PIPE - 1 + PF, i + PIPE + PF);
        if (i + PIPE - 1 < nc) issue(i + PIPE - 1);
        cp_async_commit();
        cp_async_wait<PIPE - 1>();                               // blob i has landed (this lane's pieces)
        __syncwarp();                                            // ... and every lane's
        dec.template chunk<BF16, NT>(my_ring + (i % PIPE) * slot_bytes, bs, i, acc);
        __syncwarp();                                            // slot i % PIPE may be refilled next
    }
    cp_async_wait<0>();
    epilogue<BF16, NT, 1, WARPS, SPLIT>(acc, reinterpret_cast<float*>(cpart_p), C, ldc, M, N, n0, tile0);
}

// One k16 step's mma for every n8 tile of the CTA's block.
template <int BF16, int NT>
__device__ __forceinline__ void step_mma(float (&acc)[1][NT][4], u32 bs, int row0, u32 a0, u32 a1, u32 a2, u32 a3) {
    u32 b[NT][2];
    load_b_step<NT>(bs, row0, b);
#pragma unroll
    for (int j = 0; j < NT; ++j) mma16816<BF16>(acc[0][j], a0, a1, a2, a3, b[j][0], b[j][1]);
}

// tc_lanemask's decoder: the lane's mask word, a warp scan of its per-step counts, the quad table.
struct LaneMaskDecoder {
    static constexpr int EXTRA = 16 * 8;                         // the quad table (tc_launch.LUT_BYTES)
    const uint2* lut;
    int lane;
    __device__ __forceinline__ LaneMaskDecoder(unsigned char* extra, int, int lane_) : lut(reinterpret_cast<const uint2*>(extra)), lane(lane_) {
        if (threadIdx.x < 16) reinterpret_cast<uint2*>(extra)[threadIdx.x] = make_uint2(lut_entry_x(threadIdx.x), lut_entry_y(threadIdx.x));
    }
    template <int BF16, int NT>
    __device__ __forceinline__ void chunk(const unsigned char* slot, u32 bs, int i, float (&acc)[1][NT][4]) const {
        const u32 w = reinterpret_cast<const u32*>(slot)[lane];
        const u32 x = w - ((w >> 1) & 0x55555555u);
        const u32 y = (x & 0x33333333u) + ((x >> 2) & 0x33333333u);       // kept values per nibble (0..4)
        const u32 z = (y & 0xFFFFu) + (y >> 16);                           // nibble s: this lane's values at step s
        const u32 own = (z & 0xFu) | ((z & 0xF0u) << 4) | ((z & 0xF00u) << 8) | ((z & 0xF000u) << 12);
        u32 incl = own;                                                    // one byte per step, scanned
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const u32 v = __shfl_up_sync(0xffffffffu, incl, d);
            if (lane >= d) incl += v;
        }
        const u32 excl = incl - own;
        const u32 ex31 = __shfl_sync(0xffffffffu, excl, 31), own31 = __shfl_sync(0xffffffffu, own, 31);
        const u32 t0 = (ex31 & 0xFFu) + (own31 & 0xFFu);                   // kept values of step 0 (<= 256)
        const u32 t1 = ((ex31 >> 8) & 0xFFu) + ((own31 >> 8) & 0xFFu);
        const u32 t2 = ((ex31 >> 16) & 0xFFu) + ((own31 >> 16) & 0xFFu);
        const u32 base[4] = {0u, t0, t0 + t1, t0 + t1 + t2};
        const unsigned char* vals = slot + 128;
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const uint2 Lg = lut[(w >> (4 * s)) & 15u];
            const uint2 Lh = lut[(w >> (16 + 4 * s)) & 15u];
            const u32 start = base[s] + ((excl >> (8 * s)) & 0xFFu);       // row g's quad
            const u32 start_h = start + ((y >> (4 * s)) & 15u);            // row g+8's, after it
            u32 a0, a1, a2, a3;
            decode_quad_c(vals + 2 * start, Lg, a0, a2);
            decode_quad_c(vals + 2 * start_h, Lh, a1, a3);
            step_mma<BF16, NT>(acc, bs, i * SD_CHUNK + 16 * s, a0, a1, a2, a3);
        }
    }
};

template <int BF16, int NT, int WARPS, int SPLIT, int PIPE>
__global__ void __cluster_dims__(1, SPLIT, 1) __launch_bounds__(WARPS * 32)
tc_lanemask(const unsigned char* __restrict__ blobs, const u32* __restrict__ blob_off, const u16* __restrict__ B,
            u16* __restrict__ C, int M, int N, int K, int Kp, long long ldb, long long ldc, int chunks_per_cta,
            int tiles, int bvec, int slot_bytes) {
    blob_stream<BF16, NT, WARPS, SPLIT, PIPE, LaneMaskDecoder>(blobs, blob_off, B, C, M, N, K, Kp, ldb, ldc,
                                                               chunks_per_cta, tiles, bvec, slot_bytes);
}

// ---- tc_scatter -----------------------------------------------------------------------------
// Unstructured sparsity as (value, position byte) pairs, scattered into a dense fragment tile in
// shared memory and read back as mma.sync fragments ("load as sparse, compute as dense"). Why: the
// bitmap decode (tc_lanemask) costs ~300 warp instructions per 1024 elements whatever the sparsity;
// a scatter costs a few instructions per kept value, so from ~60% sparsity it issues far fewer.
// Per (16-row tile, 64-column chunk) a blob, 16-byte aligned, at blob_off[tile * (nchunks+1) + c]:
//   bytes 0..15: the value counts of steps 0..3 (u16 each), each padded to a whole group of 8; zeros;
//   from byte 16: the values (u16), step by step, in groups of 8 (16 bytes); then one position byte
//   per value, same order (8 bytes per group); zero padding to 16 bytes. A padding value is a 0
//   stored at a position no kept value of its step uses.
// A position p = 8 * lane + 2 * reg + half addresses half `half` of fragment register a<reg> of
// lane (g, t) at step s: a warp's step region is 512 bytes, lane L's 16 bytes at 16 L, so one
// 16-byte load per lane reads back a0..a3. Lane L loads groups L, L + 32, ... and stores value r of
// its group with its r-th store; the host orders each step's values by their word's rank among the
// words of the same shared-memory bank, then by bank (counted from the step's first lane), so a store
// instruction touches each bank about once (1.6 wavefronts on average at 30-70% density, tests/
// test_tc_formats.py). Each lane zeroes the 16 bytes it read back, for the next blob.
template <int WARPS>
struct ScatterDecoder {
    static constexpr int REGION = 4 * 512;                       // a warp's four step regions
    static constexpr int EXTRA = WARPS * REGION;                 // tc_launch.SCATTER_REGION_BYTES per warp
    unsigned char* frag;
    int lane;
    __device__ __forceinline__ ScatterDecoder(unsigned char* extra, int warp, int lane_) : frag(extra + warp * REGION), lane(lane_) {
#pragma unroll
        for (int s = 0; s < 4; ++s) reinterpret_cast<uint4*>(frag)[32 * s + lane] = make_uint4(0u, 0u, 0u, 0u);
    }
    // Value r of a lane's group (bits 16 * (r & 1) of word r >> 1 of v) to the half its position
    // byte (byte r of p) names in the group's step region at `base`.
    __device__ __forceinline__ static void store8(u32 base, const uint4& v, const uint2& p) {
        const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int r = 0; r < 8; ++r) {
            const u32 b = ((r < 4 ? p.x : p.y) >> (8 * (r & 3))) & 0xFFu;
            asm volatile("st.shared.u16 [%0], %1;" ::"r"(base + 2u * b), "h"((unsigned short)(w[r >> 1] >> (16 * (r & 1))))
                         : "memory");
        }
    }
    template <int BF16, int NT>
    __device__ __forceinline__ void chunk(const unsigned char* slot, u32 bs, int i, float (&acc)[1][NT][4]) const {
        // Header: the four steps' value counts, each padded to whole groups of 8 (tc_formats.TCScatter).
        const uint2 hdr = *reinterpret_cast<const uint2*>(slot);
        const int e1 = (int)(hdr.x & 0xFFFFu), e2 = e1 + (int)(hdr.x >> 16), e3 = e2 + (int)(hdr.y & 0xFFFFu);
        const int groups = (e3 + (int)(hdr.y >> 16)) >> 3;
        const uint4* vals = reinterpret_cast<const uint4*>(slot + 16);              // 8 values per group
        const uint2* pos = reinterpret_cast<const uint2*>(slot + 16 + 16 * groups);   // 8 position bytes per group
        const u32 frag_addr = smem_addr(frag);
        // Lane L takes groups L, L + 32, ...: one 16-byte and one 8-byte load per 8 values (H200,
        // session 32: one value per lane per round cost ~5 instructions and a shared-load latency
        // each); a group never straddles two steps, so its step (512-byte region) is one compare chain.
#pragma unroll 1
        for (int g = lane; g < groups; g += 64) {
            const bool two = g + 32 < groups;
            const uint4 v0 = vals[g];
            const uint2 p0 = pos[g];
            uint4 v1 = make_uint4(0u, 0u, 0u, 0u);
            uint2 p1 = make_uint2(0u, 0u);
            if (two) {
                v1 = vals[g + 32];
                p1 = pos[g + 32];
            }
            const int i0 = 8 * g, i1 = i0 + 256;
            store8(frag_addr + 512u * ((u32)(i0 >= e1) + (u32)(i0 >= e2) + (u32)(i0 >= e3)), v0, p0);
            if (two) store8(frag_addr + 512u * ((u32)(i1 >= e1) + (u32)(i1 >= e2) + (u32)(i1 >= e3)), v1, p1);
        }
        __syncwarp();
        steps<BF16, NT>(bs, i, acc);
    }
    // Each step's fragment read back (one 16-byte load per lane), zeroed for the next blob, and its mma.
    template <int BF16, int NT>
    __device__ __forceinline__ void steps(u32 bs, int i, float (&acc)[1][NT][4]) const {
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            uint4* mine = reinterpret_cast<uint4*>(frag) + 32 * s + lane;
            const uint4 a = *mine;
            *mine = make_uint4(0u, 0u, 0u, 0u);                  // only this lane reads these 16 bytes
            step_mma<BF16, NT>(acc, bs, i * SD_CHUNK + 16 * s, a.x, a.y, a.z, a.w);
        }
    }
};

template <int BF16, int NT, int WARPS, int SPLIT, int PIPE>
__global__ void __cluster_dims__(1, SPLIT, 1) __launch_bounds__(WARPS * 32)
tc_scatter(const unsigned char* __restrict__ blobs, const u32* __restrict__ blob_off, const u16* __restrict__ B,
           u16* __restrict__ C, int M, int N, int K, int Kp, long long ldb, long long ldc, int chunks_per_cta,
           int tiles, int bvec, int slot_bytes) {
    blob_stream<BF16, NT, WARPS, SPLIT, PIPE, ScatterDecoder<WARPS>>(blobs, blob_off, B, C, M, N, K, Kp, ldb, ldc,
                                                                     chunks_per_cta, tiles, bvec, slot_bytes);
}

// ---- tc_scatter with LOAD=reg: blobs straight into registers (no cp.async ring) -------------------
// Why (session 33, ncu on the ring kernel, 11008x4096 70% N = 8): ~111 shared-memory wavefronts per
// blob with the shared pipe ~63% busy and ~2 instructions issued per SM cycle. The ring costs a blob's
// bytes twice in shared memory (the cp.async write, then the value / position loads) and a per-blob
// issue loop. Here lane L loads groups L, L + 32, L + 64, L + 96 of the blob with 16- and 8-byte global
// loads into registers, one blob ahead of the one it scatters (two register sets, the loop unrolled by
// two so they never move), and asks L2 to prefetch the blob after that. The group count comes from the
// blob's size in the offsets (16 + 24 groups bytes, padded to 16: groups = (16 units - 16) / 24), so
// the loads do not wait for the header; the header (step counts) is read with them and used at the
// scatter. Everything after the loads (steps, stores, read-back, mma, split-K) is the ring kernel's.
// Measured in session 34 (H200): correct, within a few % of the ring kernel at N = 8 (faster with 8 warps on
// 11008x4096) and up to 1.6x slower at N = 16;
// an option, not the default.
struct ScatterRegs {
    uint2 hdr;
    uint4 v[4];
    uint2 p[4];
    int groups;
};

__device__ __forceinline__ void scatter_regs_load(const unsigned char* __restrict__ blobs, const u32* offs, int i,
                                                  int lane, ScatterRegs& r) {
    const u32 lo = offs[i], units = offs[i + 1] - lo;
    const int groups = (int)((16u * units - 16u) / 24u);
    const unsigned char* base = blobs + (unsigned long long)lo * 16u;
    r.groups = groups;
    r.hdr = ldg_stream8(base);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        r.v[k] = make_uint4(0u, 0u, 0u, 0u);
        r.p[k] = make_uint2(0u, 0u);
        const int g = lane + 32 * k;
        if (32 * k < groups && g < groups) {
            r.v[k] = ldg_stream16(base + 16 + 16 * g);
            r.p[k] = ldg_stream8(base + 16 + 16 * groups + 8 * g);
        }
    }
}

__device__ __forceinline__ void scatter_regs_prefetch(const unsigned char* __restrict__ blobs, const u32* offs, int i,
                                                      int lane) {
    const u32 lo = offs[i], bytes = 16u * (offs[i + 1] - lo);
    for (u32 b = 128u * lane; b < bytes; b += 4096u)
        asm volatile("prefetch.global.L2 [%0];" :: "l"(blobs + (unsigned long long)lo * 16u + b));
}

// Scatter one loaded blob into the warp's zeroed step regions (at shared address `frag`), then the
// ring decoder's read-back, zeroing and mma (ScatterDecoder::steps).
template <int BF16, int NT, int WARPS>
__device__ __forceinline__ void scatter_regs_decode(const ScatterRegs& r, const ScatterDecoder<WARPS>& dec, u32 frag,
                                                    u32 bs, int i, float (&acc)[1][NT][4]) {
    const int e1 = (int)(r.hdr.x & 0xFFFFu), e2 = e1 + (int)(r.hdr.x >> 16), e3 = e2 + (int)(r.hdr.y & 0xFFFFu);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int g = dec.lane + 32 * k, i0 = 8 * g;
        if (32 * k < r.groups && g < r.groups)
            dec.store8(frag + 512u * ((u32)(i0 >= e1) + (u32)(i0 >= e2) + (u32)(i0 >= e3)), r.v[k], r.p[k]);
    }
    __syncwarp();
    dec.template steps<BF16, NT>(bs, i, acc);
    __syncwarp();                                                // the regions are zero again
}

template <int BF16, int NT, int WARPS, int SPLIT>
__global__ void __cluster_dims__(1, SPLIT, 1) __launch_bounds__(WARPS * 32)
tc_scatter_rg(const unsigned char* __restrict__ blobs, const u32* __restrict__ blob_off, const u16* __restrict__ B,
              u16* __restrict__ C, int M, int N, int K, int Kp, long long ldb, long long ldc, int chunks_per_cta,
              int tiles, int bvec, int) {
    extern __shared__ __align__(16) unsigned char smem[];
    const WarpWork<NT, 1, WARPS> ww(Kp, chunks_per_cta);
    const int lane = ww.lane, warp = ww.warp, nchunks = ww.nchunks, c0 = ww.c0, n0 = ww.n0, tile0 = ww.tile0;
    const int nc = ww.active(tiles) ? ww.c1 - c0 : 0;
    const int b_bytes = SmemPlan<NT, 1, WARPS, SPLIT>::b_bytes(chunks_per_cta * SD_CHUNK);
    unsigned char* cpart_p = smem + b_bytes;
    unsigned char* extra = cpart_p + SmemPlan<NT, 1, WARPS, SPLIT>::cpart_bytes;
    u32* my_offs = reinterpret_cast<u32*>(extra + ScatterDecoder<WARPS>::EXTRA) + warp * blob_offsets_stride(chunks_per_cta);
    const ScatterDecoder<WARPS> dec(extra, warp, lane);         // zeroes the warp's step regions
    const u32 frag = smem_addr(dec.frag);
    stage_blob_offsets(my_offs, blob_off, ww.tile, nchunks, c0, nc, lane);
    __syncwarp();
    ScatterRegs ra, rb;
    if (nc) scatter_regs_load(blobs, my_offs, 0, lane, ra);      // the first blob's loads overlap B's staging
    if (nc > 1) scatter_regs_prefetch(blobs, my_offs, 1, lane);
    float acc[1][NT][4];
    const u32 bs = stage_b_slice<NT>(smem, B, c0, chunks_per_cta, K, n0, N, ldb, bvec, acc);
    for (int i = 0; i < nc; i += 2) {                            // ra holds blob i, rb blob i + 1
        if (i + 1 < nc) scatter_regs_load(blobs, my_offs, i + 1, lane, rb);
        if (i + 2 < nc) scatter_regs_prefetch(blobs, my_offs, i + 2, lane);
        scatter_regs_decode<BF16, NT>(ra, dec, frag, bs, i, acc);
        if (i + 1 < nc) {
            if (i + 2 < nc) scatter_regs_load(blobs, my_offs, i + 2, lane, ra);
            if (i + 3 < nc) scatter_regs_prefetch(blobs, my_offs, i + 3, lane);
            scatter_regs_decode<BF16, NT>(rb, dec, frag, bs, i + 1, acc);
        }
    }
    epilogue<BF16, NT, 1, WARPS, SPLIT>(acc, reinterpret_cast<float*>(cpart_p), C, ldc, M, N, n0, tile0);
}

// ---- tc_words --------------------------------------------------------------------------------
// Unstructured sparsity kept at the granularity of fragment units: tc_dense's 16 registers per lane
// and (tile, chunk), taken one 32-bit word (UNIT 1: two neighbouring values of a row) or two (UNIT 2:
// registers 2u, 2u+1, four neighbouring values) at a time, with the all-zero units left out. Why: the
// bitmap and scatter decoders build fragments value by value in shared memory (300-450 warp
// instructions per 16x64 block on the H200) and stay below cuBLAS at 50-70%; a unit is what a lane
// feeds the tensor cores, so keeping or dropping whole units needs no expansion inside a register.
// Per (16-row tile, 64-column chunk) a blob, 16-byte aligned, at blob_off[tile * (nchunks+1) + c]:
//   the header (WordsLayout<UNIT>::HEAD bytes): NU = 16 / UNIT u32 lane masks (bit L of mask u: lane
//   L keeps its unit u), then NU u16 bases (units of the blob before unit u's), zeros to 16 bytes;
//   then the kept units in unit-major order: unit 0 of every lane that keeps it (lanes ascending),
//   then unit 1, ...; zero padding to 16 bytes.
// The warp streams its tile's blobs through blob_stream's cp.async ring; a lane reads the header
// (broadcast 16-byte loads) and for unit u reads (one predicated 4- or 8-byte shared load) the unit
// at base_u + popc(mask_u & lanes below it): the warp's load of one unit is one contiguous run of
// shared memory, and no fragment is scattered, zeroed or read back. Then tc_dense's mma
// (dense_compute). Masks per unit rather than per lane: a per-lane mask needed a warp ballot per
// register, whose predicate ptxas built with a shift, an AND and a compare; stored bases rather than
// a running popcount: a serial chain of 16 quarter-rate POPC per block. Bytes: UNIT 1 keeps 3/4, 1/2,
// 1/5 of the words at 50 / 70 / 90% random sparsity (1.28 / 1.84 / 4.5x fewer bytes than dense) at
// ~8 instructions per register; UNIT 2 keeps 94 / 76 / 34% of the 8-byte units (1.06 / 1.3 / 2.9x)
// at half the instructions, which pays where the decode, not the bytes, sets the time (>= ~85%).
template <int UNIT>
struct WordsLayout {
    static_assert(UNIT == 1 || UNIT == 2, "a unit is one or two fragment registers");
    static constexpr int NU = 16 / UNIT;                           // units per lane and block
    static constexpr int HEAD = (NU * 6 + 15) & ~15;               // masks and bases, 16-byte aligned
};

// The shared unit at `addr` when bit `bit` of mask is set, else zeros (predicated: a unit past the
// blob, which a clear bit may point at, is never read). The bit test inside the asm is one LOP3.
__device__ __forceinline__ void lds_kept_unit(u32 addr, u32 mask, u32 bit, u32& lo) {
    asm volatile("{\n\t.reg .pred q;\n\t.reg .b32 t;\n\tand.b32 t, %2, %3;\n\tsetp.ne.u32 q, t, 0;\n\t"
                 "mov.u32 %0, 0;\n\t@q ld.shared.u32 %0, [%1];\n\t}" : "=r"(lo) : "r"(addr), "r"(mask), "r"(bit));
}

__device__ __forceinline__ void lds_kept_unit(u32 addr, u32 mask, u32 bit, u32& lo, u32& hi) {
    asm volatile("{\n\t.reg .pred q;\n\t.reg .b32 t;\n\tand.b32 t, %3, %4;\n\tsetp.ne.u32 q, t, 0;\n\t"
                 "mov.u32 %0, 0;\n\tmov.u32 %1, 0;\n\t@q ld.shared.v2.u32 {%0, %1}, [%2];\n\t}"
                 : "=r"(lo), "=r"(hi) : "r"(addr), "r"(mask), "r"(bit));
}

// Stage probes (benchmarks/words_stage_probe.py compiles the source with SD_PROBE set; 0 everywhere else,
// where these branches compile away): 1 = the words are never read (zero fragments, the mma kept); 2 = no
// mma (the decoded words folded into one accumulator); 3 = tc_words_grp reads its first stages only and
// decodes them over and over (no DRAM after the start); 4 = tc_words_grp's consumers only wait and release;
// 5 / 6 / 7 = 4 without staging B / without the epilogue (split-K reduction, C) / without either; 8 = 4 with
// only the epilogue's barriers (the CTA barrier and the two cluster barriers: no partials, DSMEM reads or C;
// with the pushed epilogue, EP = 1, its wait on the cluster barrier that the start arrived on).
// Why: the CTA stream's loads alone read the 50% pack at 97% of a pure read (bulk_stream_probe.py, H200),
// while the kernel reads it at ~72%: these time the kernel with one stage left out.
#ifndef SD_PROBE
#define SD_PROBE 0
#endif

template <int UNIT>
struct WordsDecoder {
    using L = WordsLayout<UNIT>;
    static constexpr int EXTRA = 0;
    u32 bit, below;   // this lane's bit, the lanes below it
    __device__ __forceinline__ WordsDecoder(unsigned char*, int, int lane) : bit(1u << lane), below((1u << lane) - 1u) {}
    template <int BF16, int NT>
    __device__ __forceinline__ void chunk(const unsigned char* slot, u32 bs, int i, float (&acc)[1][NT][4]) const {
        if constexpr (SD_PROBE == 1) {
            const u32 z[1][16] = {};
            dense_compute<BF16, NT, 1>(z, bs, i, acc);
            return;
        }
        u32 x[1][16];
        decode(slot, x[0]);
        if constexpr (SD_PROBE == 2) {
            u32 f = 0;
#pragma unroll
            for (int r = 0; r < 16; ++r) f ^= x[0][r];
            acc[0][0][0] += __uint_as_float(f & 1u);
            return;
        }
        dense_compute<BF16, NT, 1>(x, bs, i, acc);
    }
    // Two row tiles' blobs of one chunk (tc_words_grp with R = 2): both decoded before the mma, so the
    // two blobs' load chains overlap and B's fragments are read once for both; `second` false (a tile
    // past M, whose blob is empty) leaves the second fragment zero.
    template <int BF16, int NT>
    __device__ __forceinline__ void chunk2(const unsigned char* slot0, const unsigned char* slot1, bool second, u32 bs,
                                           int i, float (&acc)[2][NT][4]) const {
        u32 x[2][16];
        decode(slot0, x[0]);
        if (second) {
            decode(slot1, x[1]);
        } else {
#pragma unroll
            for (int r = 0; r < 16; ++r) x[1][r] = 0u;
        }
        dense_compute<BF16, NT, 2>(x, bs, i, acc);
    }
    // One blob's fragment registers: the header's masks and bases, then one predicated shared load per unit.
    __device__ __forceinline__ void decode(const unsigned char* slot, u32 (&x)[16]) const {
        u32 head[L::HEAD / 4];
#pragma unroll
        for (int q = 0; q < L::HEAD / 16; ++q) {
            const uint4 m = reinterpret_cast<const uint4*>(slot)[q];
            head[4 * q] = m.x; head[4 * q + 1] = m.y; head[4 * q + 2] = m.z; head[4 * q + 3] = m.w;
        }
        const u32 units = smem_addr(slot) + L::HEAD;
#pragma unroll
        for (int u = 0; u < L::NU; ++u) {
            const u32 mask = head[u];
            const u32 base = __byte_perm(head[L::NU + u / 2], 0u, (u & 1) ? 0x4432u : 0x4410u);
            const u32 at = units + 4u * UNIT * (base + __popc(mask & below));
            if (UNIT == 1) lds_kept_unit(at, mask, bit, x[u]);
            else lds_kept_unit(at, mask, bit, x[UNIT * u], x[UNIT * u + UNIT - 1]);
        }
    }
};

template <int BF16, int NT, int WARPS, int SPLIT, int PIPE, int UNIT, int PF>
__global__ void __cluster_dims__(1, SPLIT, 1) __launch_bounds__(WARPS * 32)
tc_words(const unsigned char* __restrict__ blobs, const u32* __restrict__ blob_off, const u16* __restrict__ B,
         u16* __restrict__ C, int M, int N, int K, int Kp, long long ldb, long long ldc, int chunks_per_cta,
         int tiles, int bvec, int slot_bytes) {
    blob_stream<BF16, NT, WARPS, SPLIT, PIPE, WordsDecoder<UNIT>, PF>(blobs, blob_off, B, C, M, N, K, Kp, ldb, ldc,
                                                                      chunks_per_cta, tiles, bvec, slot_bytes);
}

// tc_words on the bulk blob ring (LOAD="bulk"): the same blobs and decoder, each warp's blobs moved four
// at a time by the copy engine into a RING_KB ring (blob_stream_bulk). Why: ncu on the cp.async ring
// (session 34, 11008x4096 90% N = 8) put the ring's per-blob size arithmetic and copy issue among the
// top stalls, and the ring holds one blob in flight per warp at PIPE 2 (~1.6 KiB at 50%), so the SMs
// read the format at 58-64% of a pure read; a bulk ring keeps several units (KiB each) in flight.
template <int BF16, int NT, int WARPS, int SPLIT, int RING_KB, int UNIT>
__global__ void __cluster_dims__(1, SPLIT, 1) __launch_bounds__(WARPS * 32)
tc_words_bulk(const unsigned char* __restrict__ blobs, const u32* __restrict__ blob_off, const u16* __restrict__ B,
              u16* __restrict__ C, int M, int N, int K, int Kp, long long ldb, long long ldc, int chunks_per_cta,
              int tiles, int bvec) {
    blob_stream_bulk<BF16, NT, WARPS, SPLIT, RING_KB, WordsDecoder<UNIT>>(blobs, blob_off, B, C, M, N, K, Kp, ldb,
                                                                        ldc, chunks_per_cta, tiles, bvec);
}

// ---- tc_words on a CTA stream (LOAD="group") ----------------------------------------------------
// The blobs of a CTA's WARPS row tiles are packed chunk by chunk (TCWords with group = WARPS: for each
// group of WARPS tiles, chunk c's blobs of tile 0 .. WARPS-1, then chunk c + 1's), so what the whole CTA
// needs for one chunk is one contiguous run, and one bulk copy moves it. A producer warp (the CTA's
// last) keeps STAGES such copies in flight on "full" mbarriers; each consumer warp waits for its chunk,
// decodes its own blob (WordsDecoder) at its offset inside the stage, and arrives on the stage's "empty"
// barrier, which the producer waits for before refilling it. blob_off holds, per group, its nchunks *
// WARPS blob starts (16-byte units, chunk-major) and the group's end; a tile past M has empty blobs.
// Shared memory: B's slice, the full and empty barriers, the group's offsets of the slice (to 16
// bytes), the STAGES stages of stage_bytes (the pack's largest run of CH chunks), the split-K partials
// over the stages once every stage is consumed (tc_launch.smem_bytes). CH > 1: a stage holds CH
// consecutive chunks (their runs are contiguous too), so a block of CH chunks costs one copy and one
// barrier round trip: ncu (session 35) put the stage waits first (long scoreboard 4.45 per issue).
// Why: the per-warp cp.async ring (blob_stream) keeps one ~1.6 KiB blob in flight per warp at 50%
// sparsity and reads the format at 62-68% of a pure read; ncu (session 35) puts 26% of its stall samples
// on that wait. A per-warp bulk ring (tc_words_bulk) cost the CTAs per SM and ran 0.37-1.12x cuBLAS,
// and an L2 prefetch ahead of the ring 4-25% slower: one copy per chunk for the whole CTA keeps
// STAGES x ~13 KiB in flight at 8 warps without a ring per warp. BP > 1 (B_PARTS): the consumer warps
// stage B's slice in BP cp.async groups and wait for each (a named barrier among them) at its first chunk,
// instead of every thread staging all of B behind a CTA barrier; measured slower (session 36, H200: the
// 1.6-1.7 us that staging B costs is its L2 traffic at the start more than the wait for it). R = 2: the
// pack groups WARPS x 2 tiles and warp w decodes tiles 2w and 2w + 1 of each chunk run (WordsDecoder::chunk2)
// before one mma pass over both: two independent load chains per warp and B's fragments read once for two
// tiles. Why: the stage probe (session 36) put the consumers above the 70% pack's load time, and 14% fewer
// decode instructions ran slower there, so each warp's dependency chain is the limit (session 37, H200,
// 11008x4096 at 70%: 4-7% faster; at 50%, where the loads set the pace, level to 6% slower: "auto" R in
// cost.words_auto_params). EP = 1: the split-K partials are pushed to their owner CTAs (PushReduce)
// instead of pulled after a cluster barrier (split_reduce). TW = 2 (TILE_WARPS): two consumer warps per row
// tile, the CTA's WARPS / 2 tiles packed with stages of CH = 2 chunks; warp w decodes tile w % (WARPS / 2)
// at chunk 2 i + w / (WARPS / 2) of stage i, and the second warp's partial tile is added to the first's in
// shared memory (over the stages, once both are done with them) before the epilogue. Why: on 4096x4096 the
// CTA stream has 8 chunks per warp and ~19 warps per SM; the stage probe (session 38, H200) put the consumers
// 3.3 us above the load skeleton's 8.9 us at 70%, ncu issue active 54%, which read as each warp's chain of
// dependent decode steps setting the time. Measured (session 38, H200): correct, and 5-25% slower than one warp
// per tile on 4096x4096 and 11008x4096 (8 or 16 warps; docs/kernels.md "Session 38"): not a default.
template <int BF16, int NT, int WARPS, int SPLIT, int STAGES, int UNIT, int CH, int BP, int R, int EP, int TW = 1>
__global__ void __cluster_dims__(1, SPLIT, 1) __launch_bounds__((WARPS + 1) * 32)
tc_words_grp(const unsigned char* __restrict__ blobs, const u32* __restrict__ blob_off, const u16* __restrict__ B,
             u16* __restrict__ C, int M, int N, int K, int Kp, long long ldb, long long ldc, int chunks_per_cta,
             int tiles, int bvec, int stage_bytes) {
    static_assert(STAGES >= 2 && CH >= 1, "one stage in flight while another is decoded");
    static_assert(BP == 1 || (CH == 1 && BP <= 4), "B in parts: one chunk per stage, at most four parts");
    static_assert(R == 1 || (R == 2 && CH == 1 && (SD_PROBE == 0 || SD_PROBE >= 4)),
                  "two row tiles per warp: one chunk per stage (stage probes 1-3 decode one tile per warp)");
    static_assert(TW == 1 || (TW == 2 && CH == TW && R == 1 && BP == 1 && WARPS % TW == 0 && (SD_PROBE == 0 || SD_PROBE >= 4)),
                  "two warps per tile: one chunk per warp in each stage, one tile per warp, B staged whole");
    constexpr int WT = WARPS / TW;                              // warps with a tile of their own (the tiles)
    constexpr int G = WT * R;                                   // blobs of one chunk run (the pack's group)
    extern __shared__ __align__(16) unsigned char smem[];
    const WarpWork<NT, R, WT> ww(Kp, chunks_per_cta);
    const int lane = ww.lane, warp = ww.warp, nchunks = ww.nchunks, c0 = ww.c0, n0 = ww.n0, tile0 = ww.tile0;
    const int wt = TW == 1 ? warp : warp % WT, phase = TW == 1 ? 0 : warp / WT;   // TW = 2: the warp's tile, chunk parity
    const int nc = max(0, ww.c1 - c0);
    const int nst = CH == 1 ? nc : (nc + CH - 1) / CH;          // stages of CH chunks in this K slice
    const int b_bytes = SmemPlan<NT, R, WARPS, SPLIT>::b_bytes(chunks_per_cta * SD_CHUNK);
    u64* bar_p = reinterpret_cast<u64*>(smem + b_bytes);
    const u32 bars = smem_addr(bar_p);                          // full[STAGES], then empty[STAGES]
    u32* offs = reinterpret_cast<u32*>(bar_p + 2 * STAGES);
    unsigned char* stages = reinterpret_cast<unsigned char*>(offs) + ((chunks_per_cta * G + 1) * 4 + 15) / 16 * 16;
    const u32 stage0 = smem_addr(stages);
    constexpr bool PUSH = EP == 1 && SPLIT > 1;                 // split-K by pushing partials (PushReduce)
    using PR = PushReduce<NT, G * 16, SPLIT>;
    constexpr int PAIR_BYTES = TW > 1 ? G * 16 * NT * 8 * 4 : 0;  // TW = 2: the second warps' partial tiles
    const int stage_region = TW > 1 ? max(STAGES * stage_bytes, PAIR_BYTES) : STAGES * stage_bytes;
    const u32 recv = stage0 + (u32)stage_region;               // PUSH: the receive barrier, then the slots
    const u32 rank = PUSH ? cluster_rank() : 0u;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(bars + 8 * s, 1);                         // the producer's expect_tx arrival
            mbar_init(bars + 8 * (STAGES + s), WARPS);          // one arrival per consumer warp
        }
        if (PUSH) {                                             // complete once every peer's rows are in
            mbar_init(recv, 1);
            mbar_expect_tx(recv, PR::share_bytes((int)rank));
        }
        fence_barrier_init();
    }
    if (nc) {
        const u32* off = blob_off + (long long)blockIdx.x * (nchunks * G + 1) + c0 * G;
        for (int i = threadIdx.x; i <= nc * G; i += blockDim.x) offs[i] = off[i];
    }
    __syncthreads();                                            // barriers and offsets in place
    if constexpr (PUSH) cluster_arrive_relaxed();               // waited for before the first push
    auto issue = [&](int i) {                                   // the producer: chunks i*CH.. into stage i % STAGES
        const int s = i % STAGES;
        const int end = CH == 1 ? i + 1 : min((i + 1) * CH, nc);
        const u32 lo = offs[i * CH * G], bytes = (offs[end * G] - lo) * 16u;
        mbar_expect_tx(bars + 8 * s, bytes);                    // 0 bytes: a plain arrival completes the phase
        if (bytes) bulk_copy(stage0 + (u32)(s * stage_bytes), blobs + (u64)lo * 16u, bytes, bars + 8 * s);
    };
    const bool producer = warp == WARPS && lane == 0;
    if (producer)
        for (int i = 0; i < min(STAGES, nst); ++i) issue(i);   // in flight while B is staged
    float acc[R][NT][4];
    u32 bs;
    const int part = (nc + BP - 1) / BP;                        // chunks per part of B (BP > 1)
    if constexpr (SD_PROBE == 5 || SD_PROBE == 7 || BP > 1) {
        zero_acc(acc);
        bs = smem_addr(smem);
        if (BP > 1 && warp < WARPS) {                           // the consumers stage B, one cp.async group per part
            for (int q = 0; q < BP; ++q) {
                stage_b_rows<NT>(smem, B, c0 * SD_CHUNK, min(q * part, nc) * SD_CHUNK, min((q + 1) * part, nc) * SD_CHUNK,
                                 K, n0, N, ldb, bvec, threadIdx.x, WARPS * 32);
                cp_async_commit();
            }
        }
    } else {
        bs = stage_b_slice<NT, R>(smem, B, c0, chunks_per_cta, K, n0, N, ldb, bvec, acc);
    }
    if (warp == WARPS) {
        if (producer && SD_PROBE != 3)
            for (int i = STAGES; i < nst; ++i) {
                mbar_wait(bars + 8 * (STAGES + i % STAGES), ((i / STAGES) - 1) & 1);   // stage i - STAGES consumed
                issue(i);
            }
    } else {
        const int tile = TW == 1 ? ww.tile : tile0 + wt;
        const bool live = tile < tiles;                         // a tile past M has empty blobs
        const bool live2 = R == 2 && tile + 1 < tiles;          // R = 2: the warp's second tile
        const WordsDecoder<UNIT> dec(nullptr, warp, lane);
        for (int i = 0; i < nst; ++i) {
            const int s = i % STAGES;
            if (BP > 1 && i % part == 0) {                      // part i / part of B is in: publish it
                cp_async_wait_part<BP>(i / part);
                named_bar_sync(1, WARPS * 32);
            }
            if (SD_PROBE != 3 || i < STAGES) mbar_wait(bars + 8 * s, (i / STAGES) & 1);
            if constexpr (SD_PROBE >= 4) {
            } else if constexpr (TW > 1) {                      // chunk 2 i + phase of the stage, tile wt
                const int c = i * TW + phase;
                if (live && c < nc)
                    dec.template chunk<BF16, NT>(stages + s * stage_bytes + (offs[c * G + wt] - offs[i * TW * G]) * 16u,
                                                 bs, c, acc);
            } else if constexpr (R == 2) {                      // tiles 2 warp, 2 warp + 1 of the run
                const unsigned char* run = stages + s * stage_bytes;
                const u32 lo = offs[i * G];
                if (live) dec.template chunk2<BF16, NT>(run + (offs[i * G + 2 * warp] - lo) * 16u,
                                                        run + (offs[i * G + 2 * warp + 1] - lo) * 16u, live2, bs, i, acc);
            } else if constexpr (CH == 1) {                     // the measured kernel's form (session 35)
                const int at = SD_PROBE == 3 ? s : i;           // probe 3: the blob that stage s holds
                if (live) dec.template chunk<BF16, NT>(stages + s * stage_bytes + (offs[at * G + warp] - offs[at * G]) * 16u,
                                                       bs, i, acc);
            } else if (live) {
                const unsigned char* stage = stages + s * stage_bytes;
                const u32 base = offs[i * CH * G];
                for (int c = i * CH; c < min((i + 1) * CH, nc); ++c)
                    dec.template chunk<BF16, NT>(stage + (offs[c * G + warp] - base) * 16u, bs, c, acc);
            }
            __syncwarp();                                       // every lane's loads of the stage are done
            if (lane == 0) mbar_arrive(bars + 8 * (STAGES + s));
        }
    }
    float* cpart = reinterpret_cast<float*>(stages);
    if constexpr (TW > 1) {                                     // tile wt's second warp adds its partial to the first's
        if (warp < WARPS) {
            named_bar_sync(2, WARPS * 32);                      // every consumer warp is done with the stages
            float4* pair = reinterpret_cast<float4*>(stages) + (wt * 32 + lane) * NT;
            if (phase) {
#pragma unroll
                for (int j = 0; j < NT; ++j) pair[j] = make_float4(acc[0][j][0], acc[0][j][1], acc[0][j][2], acc[0][j][3]);
            }
            named_bar_sync(2, WARPS * 32);
            if (!phase) {
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    const float4 v = pair[j];
                    acc[0][j][0] += v.x; acc[0][j][1] += v.y; acc[0][j][2] += v.z; acc[0][j][3] += v.w;
                }
            }
        }
    }
    if constexpr (SD_PROBE == 6 || SD_PROBE == 7) return;
    if constexpr (SD_PROBE == 8) {
        if constexpr (PUSH) {
            __syncwarp();
            cluster_wait();                                     // the pushed epilogue's one barrier (no pushes)
        } else if (SPLIT > 1) {
            __syncthreads();
            cluster_sync_all();
            cluster_sync_all();
        }
        return;
    }
    if (SPLIT == 1) {
        if (warp < WT) epilogue<BF16, NT, R, WT, 1>(acc, cpart, C, ldc, M, N, n0, tile0);
        return;
    }
    if constexpr (PUSH) {
        __syncwarp();
        cluster_wait();                                         // every peer's receive barrier exists
        if (warp < WT) push_partials<NT, R, WT, SPLIT>(acc, recv, rank, warp, lane);
        reduce_pushed<BF16, NT, G * 16, SPLIT>(reinterpret_cast<const float*>(stages + stage_region + PR::HEAD),
                                              recv, rank, C, ldc, M, N, n0, tile0);
        return;
    }
    __syncthreads();                                            // every stage consumed: partials go over them
    if (warp < WT) epilogue<BF16, NT, R, WT, SPLIT>(acc, cpart, C, ldc, M, N, n0, tile0);
    else split_reduce<BF16, NT, G * 16, SPLIT>(cpart, C, ldc, M, N, n0, tile0);
}

// ---- stream-K scheduling of the blob-ring kernels (SCHED=stream) ----------------------------------
// Why: with the cluster split (blob_stream) a CTA streams only 8-16 blobs per warp, and on the H200
// (session 33, ncu, tc_scatter 11008x4096 70% N = 8, split 8) a quarter of the stall samples sat on the
// split-K cluster barrier while the 1376 CTAs ran in 2.08 waves ("a partial wave of 584 blocks").
// Here the grid is one wave of CTAs (as many as the SMs hold), and the work items (row-tile group g of
// WARPS tiles, chunk c), numbered g * nchunks + c, are cut into gridDim.x contiguous ranges that differ
// by at most one item: CTA i owns [i T / P, (i + 1) T / P). Its warps walk the range together (warp w
// takes tile g * WARPS + w), so they share one B slice: the range's chunks, at most nchunks of them,
// staged once in range order (slot (c - first chunk) mod nchunks). A range covers the tail of one
// group and the head of the next (or more): where a group's K range is split between CTAs, each
// writes its partial tile to a global fp32 workspace and bumps the group's counter; the CTA that
// arrives last sums every partial in CTA order (deterministic whoever is last), stores C and resets
// the counter to 0 for the next launch. No CTA waits for another: no cluster, no co-residency needed.
// The host computes the schedule (tc_launch.stream_schedule, int32): sched[i] = the first item of CTA
// i (i <= P, sched[P] = T), sched[P + 1 + i] = its first group, sched[2P + 1 + 2g .. + 1] = the first
// and last CTA holding part of group g (64-bit divisions here cost ~40 registers: nvcc 13, sm_90a).
__device__ __forceinline__ float4 ld_cg_f4(const float* p) {
    float4 v;
    asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p) : "memory");
    return v;
}

template <int BF16, int NT, int WARPS, int PIPE, class Decoder>
__device__ __forceinline__ void blob_stream_sk(const unsigned char* __restrict__ blobs, const u32* __restrict__ blob_off,
                                               const u16* __restrict__ B, u16* __restrict__ C, int M, int N, int K,
                                               int Kp, long long ldb, long long ldc, int span_max, int tiles,
                                               int bvec, int slot_bytes, float* __restrict__ ws,
                                               int* __restrict__ counts, const int* __restrict__ sched) {
    extern __shared__ __align__(16) unsigned char smem[];
    constexpr int W = NT * 8;
    constexpr int PART = WARPS * 16 * W;                       // floats of one partial (a group's rows)
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nchunks = Kp / SD_CHUNK;
    const int groups = (tiles + WARPS - 1) / WARPS;
    const int P = gridDim.x, cta = blockIdx.x;
    const int s0 = sched[cta], span = sched[cta + 1] - s0, gfirst = sched[P + 1 + cta];
    const int cfirst = s0 - gfirst * nchunks;
    const int staged = min(span, nchunks);
    const int kmax = (span_max + nchunks - 1) / nchunks + 1;   // groups a range can touch (tc_launch.stream_kmax)
    const int n0 = blockIdx.z * W;
    const int b_bytes = min(span_max, nchunks) * SD_CHUNK * BStride<NT>::bytes;
    unsigned char* extra = smem + b_bytes;
    const int offs_stride = blob_offsets_stride(span_max);
    u32* my_lo = reinterpret_cast<u32*>(extra + Decoder::EXTRA) + warp * 2 * offs_stride;
    u32* my_hi = my_lo + offs_stride;
    unsigned char* rings = extra + Decoder::EXTRA + WARPS * 2 * offs_stride * 4;
    unsigned char* my_ring = rings + warp * PIPE * slot_bytes;
    volatile int* last_flag = reinterpret_cast<volatile int*>(rings + WARPS * PIPE * slot_bytes);
    const u32 ring_addr = smem_addr(my_ring);
    Decoder dec(extra, warp, lane);
    for (int j = lane; j < span; j += 32) {                    // the warp's blobs: item s0 + j
        const int x = cfirst + j, g = gfirst + x / nchunks, c = x % nchunks;
        const int tile = g * WARPS + warp;
        u32 lo = 0u, hi = 0u;
        if (tile < tiles) {
            const u32* o = blob_off + (long long)tile * (nchunks + 1) + c;
            lo = o[0];
            hi = o[1];
        }
        my_lo[j] = lo;
        my_hi[j] = hi;                                         // a tile past M: no bytes, no decode
    }
    __syncwarp();
    auto issue = [&](int i) {
        const u32 lo = my_lo[i];
        issue_blob(ring_addr + (u32)((i % PIPE) * slot_bytes), blobs, lo, my_hi[i] - lo, lane);
    };
    const int run1 = min(staged, nchunks - cfirst);            // chunks cfirst.., then 0.. if the range wraps
    stage_b<NT, 0>(smem, B, cfirst * SD_CHUNK, run1 * SD_CHUNK, K, n0, N, ldb, bvec);
    if (staged > run1)
        stage_b<NT, 0>(smem + run1 * SD_CHUNK * BStride<NT>::bytes, B, 0, (staged - run1) * SD_CHUNK, K, n0, N, ldb, bvec);
    cp_async_commit();
#pragma unroll
    for (int p = 0; p + 1 < PIPE; ++p) {
        if (p < span) issue(p);
        cp_async_commit();
    }
    cp_async_wait<PIPE - 1>();
    __syncthreads();
    const u32 bs = smem_addr(smem);
    const int g8 = lane >> 2, t4 = lane & 3;
    float acc[1][NT][4];
    zero_acc(acc);
    int g = gfirst, c = cfirst;
    for (int i = 0; i < span; ++i) {
        if (i + PIPE - 1 < span) issue(i + PIPE - 1);
        cp_async_commit();
        cp_async_wait<PIPE - 1>();
        __syncwarp();
        const int bslot = c >= cfirst ? c - cfirst : c + nchunks - cfirst;
        if (my_hi[i] != my_lo[i]) dec.template chunk<BF16, NT>(my_ring + (i % PIPE) * slot_bytes, bs, bslot, acc);
        __syncwarp();
        if (c == nchunks - 1 || i == span - 1) {               // this CTA's part of group g ends here
            const int q0 = sched[2 * P + 1 + 2 * g], q1 = sched[2 * P + 2 + 2 * g];
            const int tile0 = g * WARPS;
            if (q0 == q1) {                                    // the whole K range was ours: store C
                epilogue<BF16, NT, 1, WARPS, 1>(acc, nullptr, C, ldc, M, N, n0, tile0);
            } else {
                float* part = ws + (((long long)blockIdx.z * P + cta) * kmax + (g - gfirst)) * PART;
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    const int lr = warp * 16 + g8, col = 8 * j + 2 * t4;
                    *reinterpret_cast<float2*>(part + lr * W + col) = make_float2(acc[0][j][0], acc[0][j][1]);
                    *reinterpret_cast<float2*>(part + (lr + 8) * W + col) = make_float2(acc[0][j][2], acc[0][j][3]);
                }
                __threadfence();                               // our partial before our arrival
                __syncthreads();
                int* count = counts + (long long)blockIdx.z * groups + g;
                if (threadIdx.x == 0) *last_flag = atomicAdd(count, 1) == q1 - q0;
                __syncthreads();
                if (*last_flag) {                              // every other part has arrived: sum in CTA order
                    __threadfence();
                    for (int e = threadIdx.x; e < PART / 4; e += blockDim.x) {
                        const int lr = e / (W / 4), col = 4 * (e % (W / 4));
                        float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
                        for (int q = q0; q <= q1; ++q) {
                            const int kq = g - sched[P + 1 + q];
                            const float4 v = ld_cg_f4(ws + (((long long)blockIdx.z * P + q) * kmax + kq) * PART + lr * W + col);
                            sum.x += v.x; sum.y += v.y; sum.z += v.z; sum.w += v.w;
                        }
                        store_quad<BF16>(C, ldc, tile0 * 16 + lr, n0 + col, M, N, sum);
                    }
                    if (threadIdx.x == 0) *count = 0;          // ready for the next launch
                }
            }
            zero_acc(acc);
        }
        if (++c == nchunks) {
            c = 0;
            ++g;
        }
    }
    cp_async_wait<0>();
}

template <int BF16, int NT, int WARPS, int PIPE>
__global__ void __launch_bounds__(WARPS * 32)
tc_scatter_sk(const unsigned char* __restrict__ blobs, const u32* __restrict__ blob_off, const u16* __restrict__ B,
              u16* __restrict__ C, int M, int N, int K, int Kp, long long ldb, long long ldc, int span_max,
              int tiles, int bvec, int slot_bytes, float* __restrict__ ws, int* __restrict__ counts,
              const int* __restrict__ sched) {
    blob_stream_sk<BF16, NT, WARPS, PIPE, ScatterDecoder<WARPS>>(blobs, blob_off, B, C, M, N, K, Kp, ldb, ldc, span_max,
                                                                  tiles, bvec, slot_bytes, ws, counts, sched);
}

// tc_words on the stream-K schedule (SCHED="stream"): the same decoder over blob_stream_sk. Why: ncu on
// tc_words (11008x4096 90%, N = 8, H200, session 34) put the split-K cluster barrier first among the
// stall samples (UCGABAR_WAIT 11%, ERRBAR 5%) with the grid at 0.74 waves. Measured in session 35 (H200):
// correct, and slower than the cluster split on all 12 rows (0.58-1.10x cuBLAS); an option, not planned.
template <int BF16, int NT, int WARPS, int PIPE, int UNIT>
__global__ void __launch_bounds__(WARPS * 32)
tc_words_sk(const unsigned char* __restrict__ blobs, const u32* __restrict__ blob_off, const u16* __restrict__ B,
            u16* __restrict__ C, int M, int N, int K, int Kp, long long ldb, long long ldc, int span_max,
            int tiles, int bvec, int slot_bytes, float* __restrict__ ws, int* __restrict__ counts,
            const int* __restrict__ sched) {
    blob_stream_sk<BF16, NT, WARPS, PIPE, WordsDecoder<UNIT>>(blobs, blob_off, B, C, M, N, K, Kp, ldb, ldc, span_max,
                                                               tiles, bvec, slot_bytes, ws, counts, sched);
}

// Explicit instantiations for offline compiles (nvcc -DSPARSEDITTO_INSTANTIATE_ALL); CuPy's
// name_expressions instantiate only what a launch plan can reach.
#ifdef SPARSEDITTO_INSTANTIATE_ALL
#define SD_TAIL int, int, int, int, long long, long long, int, int, int
#define SD_DENSE(BF, NT, R, W, S, P, BR) template __global__ void tc_dense<BF, NT, R, W, S, P, BR, 0>( \
    const u16*, const u16*, u16*, SD_TAIL);
#define SD_SP(BF, NT, R, W, S, P, BR) template __global__ void tc_sp24<BF, NT, R, W, S, P, BR, 0>( \
    const u16*, const u32*, const u16*, u16*, SD_TAIL);
#define SD_BM(BF, NT, W, S, RK) template __global__ void tc_bitmap<BF, NT, W, S, RK>( \
    const unsigned char*, const u32*, const u16*, u16*, SD_TAIL);
SD_DENSE(0, 2, 2, 8, 4, 2, 0) SD_DENSE(1, 1, 1, 8, 1, 4, 3) SD_DENSE(0, 8, 1, 4, 8, 3, 0)
SD_SP(0, 2, 2, 8, 4, 2, 2) SD_SP(1, 1, 1, 8, 1, 4, 0) SD_SP(0, 8, 1, 4, 8, 3, 4) SD_SP(0, 8, 2, 8, 8, 2, 4)
SD_BM(0, 2, 4, 4, 8) SD_BM(1, 1, 8, 1, 12) SD_BM(0, 8, 4, 8, 16)
#define SD_WG(BF, NT, W, S, P, BR) template __global__ void tc_sp24wg<BF, NT, 1, W, S, P, BR, 0>( \
    const u16*, const u32*, const u16*, u16*, SD_TAIL);
SD_WG(0, 8, 8, 2, 4, 0) SD_WG(1, 8, 4, 4, 4, 5) SD_WG(0, 16, 8, 2, 3, 4) SD_WG(1, 16, 4, 1, 3, 0)
template __global__ void tc_sp24wg<0, 8, 1, 8, 4, 3, 4, 3>(const u16*, const u32*, const u16*, u16*, SD_TAIL);
template __global__ void tc_sp24wg<1, 8, 2, 8, 4, 3, 4, 1>(const u16*, const u32*, const u16*, u16*, SD_TAIL); SD_WG(0, 4, 8, 1, 3, 4) SD_WG(0, 2, 4, 8, 6, 0) SD_WG(1, 1, 16, 2, 2, 5)
#define SD_TMA(BF, NT, W, S, ST, MB, AS, MX) template __global__ void tc_sp24tma<BF, NT, W, S, ST, MB, AS, MX>( \
    const __grid_constant__ TensorMap, const u16*, const u32*, const u16*, u16*, SD_TAIL);
SD_TMA(0, 8, 8, 1, 4, 0, 0, 1) SD_TMA(1, 8, 8, 4, 4, 2, 0, 1) SD_TMA(0, 16, 8, 2, 3, 0, 0, 1) SD_TMA(0, 4, 4, 8, 6, 3, 0, 1)
SD_TMA(0, 8, 4, 2, 4, 0, 8, 1) SD_TMA(0, 8, 4, 1, 4, 0, 0, 2) SD_TMA(1, 8, 4, 3, 4, 0, 0, 2) SD_TMA(0, 16, 4, 4, 3, 0, 0, 2)
SD_TMA(0, 4, 4, 2, 4, 0, 6, 2) SD_TMA(0, 8, 4, 3, 4, 0, 0, 1) SD_TMA(0, 8, 8, 6, 4, 0, 0, 1)
#define SD_LM(BF, NT, W, S, P) template __global__ void tc_lanemask<BF, NT, W, S, P>( \
    const unsigned char*, const u32*, const u16*, u16*, SD_TAIL, int);
SD_LM(0, 2, 8, 4, 4) SD_LM(1, 1, 4, 1, 3) SD_LM(0, 4, 8, 8, 4) SD_LM(0, 2, 16, 2, 2)
#define SD_SC(BF, NT, W, S, P) template __global__ void tc_scatter<BF, NT, W, S, P>( \
    const unsigned char*, const u32*, const u16*, u16*, SD_TAIL, int);
SD_SC(0, 2, 8, 4, 3) SD_SC(1, 1, 4, 1, 3) SD_SC(0, 4, 8, 8, 4) SD_SC(0, 2, 16, 2, 2)
#define SD_WD(BF, NT, W, S, P, U, PF) template __global__ void tc_words<BF, NT, W, S, P, U, PF>( \
    const unsigned char*, const u32*, const u16*, u16*, SD_TAIL, int);
SD_WD(0, 1, 8, 8, 3, 1, 0) SD_WD(1, 2, 4, 4, 4, 2, 0) SD_WD(0, 8, 8, 2, 2, 1, 0) SD_WD(0, 1, 4, 8, 3, 2, 0)
SD_WD(0, 2, 8, 4, 2, 1, 4) SD_WD(1, 1, 4, 8, 2, 2, 8)
#define SD_WB(BF, NT, W, S, RK, U) template __global__ void tc_words_bulk<BF, NT, W, S, RK, U>( \
    const unsigned char*, const u32*, const u16*, u16*, SD_TAIL);
SD_WB(0, 1, 4, 4, 16, 1) SD_WB(1, 2, 8, 2, 24, 2) SD_WB(0, 8, 4, 8, 12, 1) SD_WB(0, 2, 2, 1, 32, 2)
#define SD_WG2(BF, NT, W, S, ST, U, CH, BP, R, EP) template __global__ void tc_words_grp<BF, NT, W, S, ST, U, CH, BP, R, EP>( \
    const unsigned char*, const u32*, const u16*, u16*, SD_TAIL, int);
SD_WG2(0, 1, 8, 4, 3, 1, 1, 1, 1, 0) SD_WG2(1, 2, 8, 4, 2, 2, 1, 1, 1, 0) SD_WG2(0, 8, 4, 8, 4, 1, 1, 1, 1, 0)
SD_WG2(0, 2, 4, 1, 3, 1, 1, 1, 1, 0) SD_WG2(0, 2, 8, 4, 2, 1, 2, 1, 1, 0) SD_WG2(1, 1, 8, 2, 3, 2, 4, 1, 1, 0)
SD_WG2(0, 2, 8, 4, 2, 1, 1, 4, 1, 0) SD_WG2(1, 1, 8, 1, 3, 1, 1, 2, 1, 0) SD_WG2(0, 2, 8, 8, 2, 1, 1, 1, 2, 0)
SD_WG2(1, 8, 4, 2, 3, 2, 1, 1, 2, 0) SD_WG2(0, 2, 8, 4, 2, 1, 1, 1, 1, 1) SD_WG2(1, 8, 8, 3, 3, 1, 1, 1, 2, 1)
SD_WG2(0, 1, 4, 1, 2, 2, 1, 1, 1, 1)
#define SD_WG3(BF, NT, W, S, ST, U, EP) template __global__ void tc_words_grp<BF, NT, W, S, ST, U, 2, 1, 1, EP, 2>( \
    const unsigned char*, const u32*, const u16*, u16*, SD_TAIL, int);
SD_WG3(0, 2, 8, 8, 2, 1, 1) SD_WG3(1, 1, 4, 4, 3, 2, 0) SD_WG3(0, 8, 8, 1, 2, 1, 0) SD_WG3(1, 2, 16, 2, 2, 1, 1)
#define SD_SK(KIND, BF, NT, W, P) template __global__ void KIND<BF, NT, W, P>( \
    const unsigned char*, const u32*, const u16*, u16*, SD_TAIL, int, float*, int*, const int*);
SD_SK(tc_scatter_sk, 0, 1, 4, 3) SD_SK(tc_scatter_sk, 1, 2, 8, 4) SD_SK(tc_scatter_sk, 0, 8, 4, 2)
#define SD_WSK(BF, NT, W, P, U) template __global__ void tc_words_sk<BF, NT, W, P, U>( \
    const unsigned char*, const u32*, const u16*, u16*, SD_TAIL, int, float*, int*, const int*);
SD_WSK(0, 1, 8, 2, 1) SD_WSK(1, 2, 4, 3, 2)
#define SD_RG(BF, NT, W, S) template __global__ void tc_scatter_rg<BF, NT, W, S>( \
    const unsigned char*, const u32*, const u16*, u16*, SD_TAIL, int);
SD_RG(0, 1, 4, 8) SD_RG(1, 2, 8, 4) SD_RG(0, 8, 4, 2)
#endif
