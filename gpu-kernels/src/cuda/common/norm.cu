// RMSNorm over the last dim, optionally after a fused residual add:
//   t = x (+ residual); y = t * rsqrt(mean(t^2) + eps) * w; sum = t (storage) when residual.
// Storage bf16 or f16 (template parameter S; entry points `rmsnorm_{bf16,f16}[_scalar]`),
// math in f32. One block per row. The vector kernel keeps the row in registers (VPT 16-byte
// vectors per thread), so each byte is read once; it needs cols % 8 == 0 and
// cols <= 8 * VPT * blockDim.

#define RMS_VPT 4

template <typename S>
__device__ __forceinline__ void rmsnorm_impl(
        const h16_t* __restrict__ x, const h16_t* __restrict__ w, const h16_t* __restrict__ res,
        h16_t* __restrict__ y, h16_t* __restrict__ sum, int cols, float eps) {
    __shared__ float red[32];
    const u64_t row = blockIdx.x;
    const int nv = cols / 8;
    const uint4* x4 = (const uint4*)(x + row * cols);
    const uint4* r4 = res ? (const uint4*)(res + row * cols) : 0;
    const uint4* w4 = (const uint4*)w;
    float v[RMS_VPT][8];
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < RMS_VPT; ++i) {
        const int c = threadIdx.x + i * blockDim.x;
        if (c < nv) {
            unpack8_as<S>(x4[c], v[i]);
            if (r4) {
                float r[8];
                unpack8_as<S>(r4[c], r);
#pragma unroll
                for (int j = 0; j < 8; ++j) v[i][j] += r[j];
                ((uint4*)(sum + row * cols))[c] = pack8_as<S>(v[i]);
            }
#pragma unroll
            for (int j = 0; j < 8; ++j) ss += v[i][j] * v[i][j];
        }
    }
    ss = block_sum(ss, red);
    const float inv = rsqrtf(ss / (float)cols + eps);
    uint4* y4 = (uint4*)(y + row * cols);
#pragma unroll
    for (int i = 0; i < RMS_VPT; ++i) {
        const int c = threadIdx.x + i * blockDim.x;
        if (c < nv) {
            float wf[8];
            unpack8_as<S>(w4[c], wf);
#pragma unroll
            for (int j = 0; j < 8; ++j) v[i][j] = v[i][j] * inv * wf[j];
            y4[c] = pack8_as<S>(v[i]);
        }
    }
}

// Any width: two passes over the row (the second from cache).
template <typename S>
__device__ __forceinline__ void rmsnorm_scalar_impl(
        const h16_t* __restrict__ x, const h16_t* __restrict__ w, const h16_t* __restrict__ res,
        h16_t* __restrict__ y, h16_t* __restrict__ sum, int cols, float eps) {
    __shared__ float red[32];
    const u64_t row = blockIdx.x;
    const h16_t* xr = x + row * cols;
    const h16_t* rr = res ? res + row * cols : 0;
    float ss = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float t = S::to_f(xr[c]) + (rr ? S::to_f(rr[c]) : 0.f);
        if (rr) sum[row * cols + c] = S::from_f(t);
        ss += t * t;
    }
    ss = block_sum(ss, red);
    const float inv = rsqrtf(ss / (float)cols + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float t = S::to_f(xr[c]) + (rr ? S::to_f(rr[c]) : 0.f);
        y[row * cols + c] = S::from_f(t * inv * S::to_f(w[c]));
    }
}

#define RMS_ENTRY(NAME, IMPL, S)                                                                \
    extern "C" __global__ void __launch_bounds__(1024) NAME(                                    \
            const h16_t* __restrict__ x, const h16_t* __restrict__ w, const h16_t* __restrict__ res, \
            h16_t* __restrict__ y, h16_t* __restrict__ sum, int cols, float eps) {              \
        IMPL<S>(x, w, res, y, sum, cols, eps);                                                  \
    }
RMS_ENTRY(rmsnorm_bf16, rmsnorm_impl, BF16)
RMS_ENTRY(rmsnorm_f16, rmsnorm_impl, F16)
RMS_ENTRY(rmsnorm_bf16_scalar, rmsnorm_scalar_impl, BF16)
RMS_ENTRY(rmsnorm_f16_scalar, rmsnorm_scalar_impl, F16)
