// Elementwise and layout kernels on bf16 storage: add, head split/merge, SiLU, and the
// MoE experts' gather / SwiGLU / combine helpers. Grid-stride loops; 16-byte accesses where
// the sizes allow.

// y = a + b over n elements. Vector path over n/8 vectors, then a scalar tail.
extern "C" __global__ void add_bf16(const bf16_t* __restrict__ a, const bf16_t* __restrict__ b,
                                    bf16_t* __restrict__ y, u64_t n) {
    const u64_t nv = n / 8;
    const u64_t stride = (u64_t)gridDim.x * blockDim.x;
    const uint4* a4 = (const uint4*)a;
    const uint4* b4 = (const uint4*)b;
    uint4* y4 = (uint4*)y;
    for (u64_t i = (u64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nv; i += stride) {
        float fa[8], fb[8];
        unpack8(a4[i], fa);
        unpack8(b4[i], fb);
#pragma unroll
        for (int j = 0; j < 8; ++j) fa[j] += fb[j];
        y4[i] = pack8(fa);
    }
    for (u64_t i = nv * 8 + (u64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        y[i] = f2bf(bf2f(a[i]) + bf2f(b[i]));
}

// [B*T, H*D] -> [B, H, T, D]; `vec` = 8 when D % 8 == 0 (16-byte moves), else 1.
extern "C" __global__ void split_heads_bf16(const bf16_t* __restrict__ x, bf16_t* __restrict__ y,
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
extern "C" __global__ void merge_heads_bf16(const bf16_t* __restrict__ x, bf16_t* __restrict__ y,
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

// In place y = y * sigmoid(y) (the SiLU epilogue cuBLASLt lacks).
extern "C" __global__ void silu_bf16(bf16_t* __restrict__ y, u64_t n) {
    const u64_t stride = (u64_t)gridDim.x * blockDim.x;
    for (u64_t i = (u64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = bf2f(y[i]);
        y[i] = f2bf(v / (1.f + expf(-v)));
    }
}

// Fills n 16-bit words with `v` (poisoning outputs in tests).
extern "C" __global__ void fill_u16(unsigned short* __restrict__ y, u64_t n, unsigned short v) {
    const u64_t stride = (u64_t)gridDim.x * blockDim.x;
    for (u64_t i = (u64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) y[i] = v;
}

// MoE experts, step 1: xg[p, :] = x[sorted[p] / k, :] for real slots, 0 for padding. One
// block per row p of the padded permutation.
extern "C" __global__ void moe_gather_bf16(const bf16_t* __restrict__ x, const int* __restrict__ sorted,
                                           bf16_t* __restrict__ xg, int P, int H, int k, int sentinel) {
    const int p = blockIdx.x;
    if (p >= P) return;
    const int s = sorted[p];
    bf16_t* dst = xg + (u64_t)p * H;
    if (s >= 0 && s < sentinel) {
        const bf16_t* src = x + (u64_t)(s / k) * H;
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

// MoE experts, step 2: act[p, f] = silu(h[p, f]) * h[p, F + f] (gate rows first, then up).
extern "C" __global__ void moe_swiglu_bf16(const bf16_t* __restrict__ h, bf16_t* __restrict__ act,
                                           int P, int F) {
    const u64_t total = (u64_t)P * F;
    const u64_t stride = (u64_t)gridDim.x * blockDim.x;
    for (u64_t i = (u64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        u64_t p = i / F, f = i % F;
        float g = bf2f(h[p * 2 * F + f]);
        float u = bf2f(h[p * 2 * F + F + f]);
        act[i] = f2bf(g / (1.f + expf(-g)) * u);
    }
}

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
extern "C" __global__ void moe_combine_bf16(const bf16_t* __restrict__ out, const int* __restrict__ inv,
                                            const float* __restrict__ w, bf16_t* __restrict__ y,
                                            int T, int H, int k) {
    const int t = blockIdx.x;
    if (t >= T) return;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        float acc = 0.f;
        for (int j = 0; j < k; ++j) {
            int p = inv[t * k + j];
            if (p >= 0) acc += w[t * k + j] * bf2f(out[(u64_t)p * H + i]);
        }
        y[(u64_t)t * H + i] = f2bf(acc);
    }
}

// Precision casts between the storages (f32 results such as LSE feeding a bf16 kernel).
extern "C" __global__ void cast_f32_bf16(const float* __restrict__ x, bf16_t* __restrict__ y, u64_t n) {
    const u64_t stride = (u64_t)gridDim.x * blockDim.x;
    for (u64_t i = (u64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) y[i] = f2bf(x[i]);
}
extern "C" __global__ void cast_bf16_f32(const bf16_t* __restrict__ x, float* __restrict__ y, u64_t n) {
    const u64_t stride = (u64_t)gridDim.x * blockDim.x;
    for (u64_t i = (u64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) y[i] = bf2f(x[i]);
}
