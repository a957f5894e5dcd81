// Elementwise and layout kernels on 16-bit storage (bf16 or f16, the template parameter S):
// add, head split/merge, SiLU, the MoE experts' gather / SwiGLU / combine helpers, and the
// casts between f32 and the storage. Math in f32. Grid-stride loops; 16-byte accesses where
// the sizes allow. Each template has two entry points, `{op}_bf16` and `{op}_f16`.

// y = a + b over n elements. Vector path over n/8 vectors, then a scalar tail.
template <typename S>
__device__ __forceinline__ void add_impl(const h16_t* __restrict__ a, const h16_t* __restrict__ b,
                                         h16_t* __restrict__ y, u64_t n) {
    const u64_t nv = n / 8;
    const u64_t stride = (u64_t)gridDim.x * blockDim.x;
    const uint4* a4 = (const uint4*)a;
    const uint4* b4 = (const uint4*)b;
    uint4* y4 = (uint4*)y;
    for (u64_t i = (u64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nv; i += stride) {
        float fa[8], fb[8];
        unpack8_as<S>(a4[i], fa);
        unpack8_as<S>(b4[i], fb);
#pragma unroll
        for (int j = 0; j < 8; ++j) fa[j] += fb[j];
        y4[i] = pack8_as<S>(fa);
    }
    for (u64_t i = nv * 8 + (u64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        y[i] = S::from_f(S::to_f(a[i]) + S::to_f(b[i]));
}

#define ADD_ENTRY(NAME, S)                                                                      \
    extern "C" __global__ void NAME(const h16_t* __restrict__ a, const h16_t* __restrict__ b,   \
                                    h16_t* __restrict__ y, u64_t n) {                           \
        add_impl<S>(a, b, y, n);                                                                \
    }
ADD_ENTRY(add_bf16, BF16)
ADD_ENTRY(add_f16, F16)

// [B*T, H*D] -> [B, H, T, D]; `vec` = 8 when D % 8 == 0 (16-byte moves), else 1. A pure move
// of 16-bit words: both storages run the same code.
template <typename S>
__device__ __forceinline__ void split_heads_impl(const h16_t* __restrict__ x, h16_t* __restrict__ y,
                                                 int B, int T, int H, int D, int vec) {
    const u64_t total = (u64_t)B * H * T * D / vec;
    const u64_t stride = (u64_t)gridDim.x * blockDim.x;
    const int dv = D / vec;
    for (u64_t o = (u64_t)blockIdx.x * blockDim.x + threadIdx.x; o < total; o += stride) {
        int d = (int)(o % dv);
        u64_t r = o / dv;
        int t = (int)(r % T); r /= T;
        int h = (int)(r % H);
        int b = (int)(r / H);
        u64_t src = ((u64_t)(b * T + t) * H + h) * D + (u64_t)d * vec;
        if (vec == 8) ((uint4*)y)[o] = *(const uint4*)(x + src);
        else y[o] = x[src];
    }
}

// [B, H, T, D] -> [B*T, H*D].
template <typename S>
__device__ __forceinline__ void merge_heads_impl(const h16_t* __restrict__ x, h16_t* __restrict__ y,
                                                 int B, int H, int T, int D, int vec) {
    const u64_t total = (u64_t)B * H * T * D / vec;
    const u64_t stride = (u64_t)gridDim.x * blockDim.x;
    const int dv = D / vec;
    for (u64_t o = (u64_t)blockIdx.x * blockDim.x + threadIdx.x; o < total; o += stride) {
        // o indexes the output [B, T, H, D/vec]
        int d = (int)(o % dv);
        u64_t r = o / dv;
        int h = (int)(r % H); r /= H;
        int t = (int)(r % T);
        int b = (int)(r / T);
        u64_t src = ((u64_t)(b * H + h) * T + t) * D + (u64_t)d * vec;
        if (vec == 8) ((uint4*)y)[o] = *(const uint4*)(x + src);
        else y[o] = x[src];
    }
}

#define HEADS_ENTRY(NAME, IMPL, S)                                                              \
    extern "C" __global__ void NAME(const h16_t* __restrict__ x, h16_t* __restrict__ y, int d0,  \
                                    int d1, int d2, int D, int vec) {                           \
        IMPL<S>(x, y, d0, d1, d2, D, vec);                                                      \
    }
// split: (B, T, H, D, vec); merge: (B, H, T, D, vec)
HEADS_ENTRY(split_heads_bf16, split_heads_impl, BF16)
HEADS_ENTRY(split_heads_f16, split_heads_impl, F16)
HEADS_ENTRY(merge_heads_bf16, merge_heads_impl, BF16)
HEADS_ENTRY(merge_heads_f16, merge_heads_impl, F16)

// In place y = y * sigmoid(y) (the SiLU epilogue cuBLASLt lacks).
template <typename S>
__device__ __forceinline__ void silu_impl(h16_t* __restrict__ y, u64_t n) {
    const u64_t stride = (u64_t)gridDim.x * blockDim.x;
    for (u64_t i = (u64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = S::to_f(y[i]);
        y[i] = S::from_f(v / (1.f + expf(-v)));
    }
}

#define SILU_ENTRY(NAME, S)                                                                     \
    extern "C" __global__ void NAME(h16_t* __restrict__ y, u64_t n) { silu_impl<S>(y, n); }
SILU_ENTRY(silu_bf16, BF16)
SILU_ENTRY(silu_f16, F16)

// Fills n 16-bit words with the bit pattern `v` (poisoning outputs in tests). Storage-blind:
// it also poisons f32 and i32 outputs word by word (0x7FC0 is a NaN in bf16 and in f16, and
// 0x7FC07FC0 one in f32).
extern "C" __global__ void fill_u16(unsigned short* __restrict__ y, u64_t n, unsigned short v) {
    const u64_t stride = (u64_t)gridDim.x * blockDim.x;
    for (u64_t i = (u64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) y[i] = v;
}

// MoE experts, step 1: xg[p, :] = x[sorted[p] / k, :] for real slots, 0 for padding. One
// block per row p of the padded permutation. (0x0000 is +0 in both storages.)
template <typename S>
__device__ __forceinline__ void moe_gather_impl(const h16_t* __restrict__ x, const int* __restrict__ sorted,
                                                h16_t* __restrict__ xg, int P, int H, int k, int sentinel) {
    const int p = blockIdx.x;
    if (p >= P) return;
    const int s = sorted[p];
    h16_t* dst = xg + (u64_t)p * H;
    if (s >= 0 && s < sentinel) {
        const h16_t* src = x + (u64_t)(s / k) * H;
        if ((H & 7) == 0) {
            for (int i = threadIdx.x; i < H / 8; i += blockDim.x)
                ((uint4*)dst)[i] = ((const uint4*)src)[i];
        } else {
            for (int i = threadIdx.x; i < H; i += blockDim.x) dst[i] = src[i];
        }
    } else {
        for (int i = threadIdx.x; i < H; i += blockDim.x) dst[i] = 0;
    }
}

#define GATHER_ENTRY(NAME, S)                                                                   \
    extern "C" __global__ void NAME(const h16_t* __restrict__ x, const int* __restrict__ sorted, \
                                    h16_t* __restrict__ xg, int P, int H, int k, int sentinel) { \
        moe_gather_impl<S>(x, sorted, xg, P, H, k, sentinel);                                   \
    }
GATHER_ENTRY(moe_gather_bf16, BF16)
GATHER_ENTRY(moe_gather_f16, F16)

// MoE experts, step 2: act[p, f] = silu(h[p, f]) * h[p, F + f] (gate rows first, then up).
template <typename S>
__device__ __forceinline__ void moe_swiglu_impl(const h16_t* __restrict__ h, h16_t* __restrict__ act,
                                                int P, int F) {
    const u64_t total = (u64_t)P * F;
    const u64_t stride = (u64_t)gridDim.x * blockDim.x;
    for (u64_t i = (u64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        u64_t p = i / F, f = i % F;
        float g = S::to_f(h[p * 2 * F + f]);
        float u = S::to_f(h[p * 2 * F + F + f]);
        act[i] = S::from_f(g / (1.f + expf(-g)) * u);
    }
}

#define SWIGLU_ENTRY(NAME, S)                                                                   \
    extern "C" __global__ void NAME(const h16_t* __restrict__ h, h16_t* __restrict__ act, int P, \
                                    int F) {                                                    \
        moe_swiglu_impl<S>(h, act, P, F);                                                       \
    }
SWIGLU_ENTRY(moe_swiglu_bf16, BF16)
SWIGLU_ENTRY(moe_swiglu_f16, F16)

// MoE experts, step 3: inv[sorted[p]] = p for every real slot in the permutation.
extern "C" __global__ void moe_inverse_i32(const int* __restrict__ sorted, int* __restrict__ inv,
                                           int P, int sentinel) {
    for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < P; p += gridDim.x * blockDim.x) {
        int s = sorted[p];
        if (s >= 0 && s < sentinel) inv[s] = p;
    }
}

// MoE experts, step 4: y[t, :] = sum_j w[t, j] * out[inv[t*k + j], :] over the slots in the
// permutation (inv >= 0). One block per token.
template <typename S>
__device__ __forceinline__ void moe_combine_impl(const h16_t* __restrict__ out, const int* __restrict__ inv,
                                                 const float* __restrict__ w, h16_t* __restrict__ y,
                                                 int T, int H, int k) {
    const int t = blockIdx.x;
    if (t >= T) return;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        float acc = 0.f;
        for (int j = 0; j < k; ++j) {
            int p = inv[t * k + j];
            if (p >= 0) acc += w[t * k + j] * S::to_f(out[(u64_t)p * H + i]);
        }
        y[(u64_t)t * H + i] = S::from_f(acc);
    }
}

#define COMBINE_ENTRY(NAME, S)                                                                  \
    extern "C" __global__ void NAME(const h16_t* __restrict__ out, const int* __restrict__ inv,  \
                                    const float* __restrict__ w, h16_t* __restrict__ y, int T,  \
                                    int H, int k) {                                             \
        moe_combine_impl<S>(out, inv, w, y, T, H, k);                                           \
    }
COMBINE_ENTRY(moe_combine_bf16, BF16)
COMBINE_ENTRY(moe_combine_f16, F16)

// Precision casts between f32 and the storage (f32 results such as LSE feeding a 16-bit
// kernel, or routing weights read as f32).
template <typename S>
__device__ __forceinline__ void cast_from_f32_impl(const float* __restrict__ x, h16_t* __restrict__ y, u64_t n) {
    const u64_t stride = (u64_t)gridDim.x * blockDim.x;
    for (u64_t i = (u64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) y[i] = S::from_f(x[i]);
}
template <typename S>
__device__ __forceinline__ void cast_to_f32_impl(const h16_t* __restrict__ x, float* __restrict__ y, u64_t n) {
    const u64_t stride = (u64_t)gridDim.x * blockDim.x;
    for (u64_t i = (u64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) y[i] = S::to_f(x[i]);
}

#define CAST_FROM_F32_ENTRY(NAME, S)                                                            \
    extern "C" __global__ void NAME(const float* __restrict__ x, h16_t* __restrict__ y, u64_t n) { \
        cast_from_f32_impl<S>(x, y, n);                                                         \
    }
#define CAST_TO_F32_ENTRY(NAME, S)                                                              \
    extern "C" __global__ void NAME(const h16_t* __restrict__ x, float* __restrict__ y, u64_t n) { \
        cast_to_f32_impl<S>(x, y, n);                                                           \
    }
CAST_FROM_F32_ENTRY(cast_f32_bf16, BF16)
CAST_FROM_F32_ENTRY(cast_f32_f16, F16)
CAST_TO_F32_ENTRY(cast_bf16_f32, BF16)
CAST_TO_F32_ENTRY(cast_f16_f32, F16)
