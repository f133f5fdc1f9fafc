// Value types and B-row loads shared by SparseDitto's CUDA-core templates (csr_vector, bitmap_spmv).
//
// The registry inlines it in front of a template's own .cu file (the template's CUDA_SRC placeholder
// names both files), so every candidate's CUDA_SRC stays one self-contained text. No CUDA headers:
// fp16/bf16 conversions are inline PTX, so the text compiles under NVRTC without include paths and
// under `nvcc -arch=sm_80+`. T is one of F32, F16, BF16: T::storage is what memory holds,
// to_float / from_float convert to and from the fp32 accumulators.

typedef unsigned short u16;

struct F32 {
    typedef float storage;
    static __device__ __forceinline__ float to_float(float x) { return x; }
    static __device__ __forceinline__ float from_float(float x) { return x; }
};

struct F16 {
    typedef u16 storage;
    static __device__ __forceinline__ float to_float(u16 x) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
        return f;
    }
    static __device__ __forceinline__ u16 from_float(float f) {
        u16 h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
        return h;
    }
};

struct BF16 {
    typedef u16 storage;
    static __device__ __forceinline__ float to_float(u16 x) {
        return __uint_as_float(static_cast<unsigned int>(x) << 16);
    }
    static __device__ __forceinline__ u16 from_float(float f) {
        u16 h;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));  // sm_80+
        return h;
    }
};

// VEC consecutive storage elements, aligned to their total size (<= 16 bytes), so a load of one
// Pack compiles to a single ld.global.v2/v4 (two for 8 fp32 values).
template <typename S, int VEC>
struct alignas(sizeof(S) * VEC) Pack {
    S v[VEC];
};

template <typename T, int VEC>
__device__ __forceinline__ void load_row_strip(const typename T::storage* __restrict__ p, int n0, int N,
                                               bool vec_ok, float (&out)[VEC]) {
    typedef typename T::storage S;
    if (vec_ok && n0 + VEC <= N) {
        Pack<S, VEC> pk = *reinterpret_cast<const Pack<S, VEC>*>(p + n0);
#pragma unroll
        for (int t = 0; t < VEC; ++t) out[t] = T::to_float(pk.v[t]);
    } else {
#pragma unroll
        for (int t = 0; t < VEC; ++t) out[t] = (n0 + t < N) ? T::to_float(p[n0 + t]) : 0.0f;
    }
}
