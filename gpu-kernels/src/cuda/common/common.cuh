// Shared helpers for tandem's CUDA kernels. Prepended to every module's source by the
// catalog, so no kernel needs a system header (NVRTC finds none on some machines).
#pragma once

typedef unsigned short bf16_t;
typedef unsigned long long u64_t;

#define TANDEM_NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float bf2f(bf16_t h) { return __uint_as_float(((unsigned)h) << 16); }

__device__ __forceinline__ bf16_t f2bf(float f) {
    unsigned short r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
}

// Two floats to a bf16x2 word: `lo` in the low half (the lower address).
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ float bf_lo(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }

// 8 bf16 (one 16-byte vector) to floats and back.
__device__ __forceinline__ void unpack8(const uint4 v, float* f) {
    f[0] = bf_lo(v.x); f[1] = bf_hi(v.x); f[2] = bf_lo(v.y); f[3] = bf_hi(v.y);
    f[4] = bf_lo(v.z); f[5] = bf_hi(v.z); f[6] = bf_lo(v.w); f[7] = bf_hi(v.w);
}
__device__ __forceinline__ uint4 pack8(const float* f) {
    uint4 v;
    v.x = pack_bf16x2(f[0], f[1]); v.y = pack_bf16x2(f[2], f[3]);
    v.z = pack_bf16x2(f[4], f[5]); v.w = pack_bf16x2(f[6], f[7]);
    return v;
}

// IEEE binary16 (f16) storage: the same helpers by PTX cvt (f16 -> f32 is exact, so no
// rounding modifier; f32 -> f16 rounds to nearest even, overflow gives +-inf).
typedef unsigned short f16_t;

__device__ __forceinline__ float h2f(f16_t h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ f16_t f2h(float f) {
    unsigned short r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
}

// Two floats to an f16x2 word: `lo` in the low half (the lower address), as pack_bf16x2.
__device__ __forceinline__ unsigned pack_f16x2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ float h_lo(unsigned w) { return h2f((f16_t)(w & 0xffffu)); }
__device__ __forceinline__ float h_hi(unsigned w) { return h2f((f16_t)(w >> 16)); }

// Storage precisions as template parameters. bf16_t and f16_t are both unsigned short (the
// raw 16 bits, h16_t), so kernels templated on the storage take one of these tags, and
// their extern "C" entry points are `{op}_bf16` and `{op}_f16`.
typedef unsigned short h16_t;

struct BF16 {
    static __device__ __forceinline__ float to_f(h16_t h) { return bf2f(h); }
    static __device__ __forceinline__ h16_t from_f(float f) { return f2bf(f); }
    static __device__ __forceinline__ unsigned pack2(float lo, float hi) { return pack_bf16x2(lo, hi); }
    static __device__ __forceinline__ float lo(unsigned w) { return bf_lo(w); }
    static __device__ __forceinline__ float hi(unsigned w) { return bf_hi(w); }
};

struct F16 {
    static __device__ __forceinline__ float to_f(h16_t h) { return h2f(h); }
    static __device__ __forceinline__ h16_t from_f(float f) { return f2h(f); }
    static __device__ __forceinline__ unsigned pack2(float lo, float hi) { return pack_f16x2(lo, hi); }
    static __device__ __forceinline__ float lo(unsigned w) { return h_lo(w); }
    static __device__ __forceinline__ float hi(unsigned w) { return h_hi(w); }
};

// 8 values of storage S (one 16-byte vector) to floats and back.
template <typename S>
__device__ __forceinline__ void unpack8_as(const uint4 v, float* f) {
    f[0] = S::lo(v.x); f[1] = S::hi(v.x); f[2] = S::lo(v.y); f[3] = S::hi(v.y);
    f[4] = S::lo(v.z); f[5] = S::hi(v.z); f[6] = S::lo(v.w); f[7] = S::hi(v.w);
}
template <typename S>
__device__ __forceinline__ uint4 pack8_as(const float* f) {
    uint4 v;
    v.x = S::pack2(f[0], f[1]); v.y = S::pack2(f[2], f[3]);
    v.z = S::pack2(f[4], f[5]); v.w = S::pack2(f[6], f[7]);
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block; every thread gets the result. `red` holds 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = lane < nwarps ? red[lane] : 0.f;
    return warp_sum(t);
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}

__device__ __forceinline__ float fast_exp2(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
