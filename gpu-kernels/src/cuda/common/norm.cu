// RMSNorm over the last dim, optionally after a fused residual add:
//   t = x (+ residual); y = t * rsqrt(mean(t^2) + eps) * w; sum = t (bf16) when residual.
// One block per row. The vector kernel keeps the row in registers (VPT 16-byte vectors per
// thread), so each byte is read once; it needs cols % 8 == 0 and cols <= 8 * VPT * blockDim.

#define RMS_VPT 4

extern "C" __global__ void __launch_bounds__(1024) rmsnorm_bf16(
        const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, const bf16_t* __restrict__ res,
        bf16_t* __restrict__ y, bf16_t* __restrict__ sum, int cols, float eps) {
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
            unpack8(x4[c], v[i]);
            if (r4) {
                float r[8];
                unpack8(r4[c], r);
#pragma unroll
                for (int j = 0; j < 8; ++j) v[i][j] += r[j];
                ((uint4*)(sum + row * cols))[c] = pack8(v[i]);
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
            unpack8(w4[c], wf);
#pragma unroll
            for (int j = 0; j < 8; ++j) v[i][j] = v[i][j] * inv * wf[j];
            y4[c] = pack8(v[i]);
        }
    }
}

// Any width: two passes over the row (the second from cache).
extern "C" __global__ void __launch_bounds__(1024) rmsnorm_bf16_scalar(
        const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, const bf16_t* __restrict__ res,
        bf16_t* __restrict__ y, bf16_t* __restrict__ sum, int cols, float eps) {
    __shared__ float red[32];
    const u64_t row = blockIdx.x;
    const bf16_t* xr = x + row * cols;
    const bf16_t* rr = res ? res + row * cols : 0;
    float ss = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float t = bf2f(xr[c]) + (rr ? bf2f(rr[c]) : 0.f);
        if (rr) sum[row * cols + c] = f2bf(t);
        ss += t * t;
    }
    ss = block_sum(ss, red);
    const float inv = rsqrtf(ss / (float)cols + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float t = bf2f(xr[c]) + (rr ? bf2f(rr[c]) : 0.f);
        y[row * cols + c] = f2bf(t * inv * bf2f(w[c]));
    }
}
