// Rotary embedding, rotate-half, on x [B, H, T, D]: position of row t is offset + t,
// inv_freq_i = base^(-2i/D), y_i = x_i cos - x_{i+D/2} sin, y_{i+D/2} = x_{i+D/2} cos + x_i sin.
// Angles in f32 with full-range sincosf (no fast math). Storage bf16 or f16 (template
// parameter S; entry points `rope_{bf16,f16}[_scalar]`).

// Vector path: D % 16 == 0; each thread rotates 8 pairs with two 16-byte loads and stores.
template <typename S>
__device__ __forceinline__ void rope_impl(const h16_t* __restrict__ x, h16_t* __restrict__ y,
                                          u64_t rows, int T, int D, int offset, float log2_base) {
    const int half = D / 2, groups = half / 8;
    const u64_t total = rows * groups;
    const u64_t stride = (u64_t)gridDim.x * blockDim.x;
    for (u64_t g = (u64_t)blockIdx.x * blockDim.x + threadIdx.x; g < total; g += stride) {
        const u64_t row = g / groups;
        const int i0 = (int)(g % groups) * 8;
        const float pos = (float)(offset + (int)(row % T));
        const h16_t* xr = x + row * D;
        float a[8], b[8];
        unpack8_as<S>(*(const uint4*)(xr + i0), a);
        unpack8_as<S>(*(const uint4*)(xr + half + i0), b);
        float ya[8], yb[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const float inv_freq = exp2f(-(float)(2 * (i0 + j)) / (float)D * log2_base);
            float s, c;
            sincosf(pos * inv_freq, &s, &c);
            ya[j] = a[j] * c - b[j] * s;
            yb[j] = b[j] * c + a[j] * s;
        }
        h16_t* yr = y + row * D;
        *(uint4*)(yr + i0) = pack8_as<S>(ya);
        *(uint4*)(yr + half + i0) = pack8_as<S>(yb);
    }
}

// Any even D.
template <typename S>
__device__ __forceinline__ void rope_scalar_impl(const h16_t* __restrict__ x, h16_t* __restrict__ y,
                                                 u64_t rows, int T, int D, int offset, float log2_base) {
    const int half = D / 2;
    const u64_t total = rows * half;
    const u64_t stride = (u64_t)gridDim.x * blockDim.x;
    for (u64_t g = (u64_t)blockIdx.x * blockDim.x + threadIdx.x; g < total; g += stride) {
        const u64_t row = g / half;
        const int i = (int)(g % half);
        const float pos = (float)(offset + (int)(row % T));
        const float inv_freq = exp2f(-(float)(2 * i) / (float)D * log2_base);
        float s, c;
        sincosf(pos * inv_freq, &s, &c);
        const float a = S::to_f(x[row * D + i]), b = S::to_f(x[row * D + half + i]);
        y[row * D + i] = S::from_f(a * c - b * s);
        y[row * D + half + i] = S::from_f(b * c + a * s);
    }
}

#define ROPE_ENTRY(NAME, IMPL, S)                                                               \
    extern "C" __global__ void NAME(const h16_t* __restrict__ x, h16_t* __restrict__ y,         \
                                    u64_t rows, int T, int D, int offset, float log2_base) {    \
        IMPL<S>(x, y, rows, T, D, offset, log2_base);                                           \
    }
ROPE_ENTRY(rope_bf16, rope_impl, BF16)
ROPE_ENTRY(rope_f16, rope_impl, F16)
ROPE_ENTRY(rope_bf16_scalar, rope_scalar_impl, BF16)
ROPE_ENTRY(rope_f16_scalar, rope_scalar_impl, F16)
