// MoE experts as two grouped GEMMs over the block-padded permutation that moe_route produces
// (vLLM's fused_moe layout), on the tensor cores (mma.sync m16n8k16, f32 accumulate), operands
// staged through a STAGES-deep cp.async pipeline and read with ldmatrix. No host round trip:
// every block finds its expert and its rows in device memory.
//
// Inputs (T tokens, H hidden, F ffn, E experts, k per token; slot = t*k + j):
//   x [T, H], gate_up [E, 2F, H] (gate rows 0..F, up rows F..2F), down [E, H, F] (storage type),
//   sorted [P] i32: slot ids grouped by expert, each expert's segment [offsets[e], offsets[e+1])
//   padded with the sentinel T*k (any value outside 0..T*k is treated as padding),
//   offsets [E+1] i32, topk_weights [T, k] f32.
// Launches:
//   1. moe_tile_map (one block): offsets made monotone and clamped to [0, P] (soff), and the
//      prefix count of BM-row tiles per expert segment (tstart[E+1]), so a tile never spans two
//      experts whatever the routing block size is.
//   2. moe_gemm_swiglu_{prec}_{tile}: h[p, :] = silu(x[tok] gate_e^T) * (x[tok] up_e^T) for
//      every permuted row p (tok = sorted[p] / k, gathered in the operand load; padding rows are
//      zeros and are not stored). Each block computes the gate and the up tiles of the same
//      output columns, so the SwiGLU happens on the f32 accumulators.
//   3. moe_gemm_down_{prec}_{tile}: rows[slot, :] = h[p, :] down_e^T, stored by slot id.
//   4. moe_combine_slots_{prec}: y[t, :] = sum_j w[t, j] * rows[t*k + j, :], j ascending (f32),
//      so the result is deterministic (no atomics). rows is zeroed by the host before step 3,
//      so a slot the routing dropped contributes nothing.
// Block order of 2 and 3 (1-D grid): expert-major, then the n-tile, then the m-tile, so the
// blocks resident at once share each weight tile (read from DRAM once, then from L2) and one
// expert's tokens. Blocks past the last tile return at once (the grid is sized for the worst
// case, P/BM + E tiles, because the host does not read the offsets).
// Requirements (checked by the host): H % 8 == 0 and F % 8 == 0 (16-byte rows for cp.async).
// gpu-kernels/emu/run.sh runs these kernels on the CPU (threads and barriers standing in for the
// PTX between "element types" and "1. tile map") against an f64 reference.

#define MOE_MAP_THREADS 256

// ---- element types: storage type, tensor-core product, f32 pair packing ----
struct MoeBf16 {
    typedef bf16_t T;
    static __device__ __forceinline__ void mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ unsigned pack2(float lo, float hi) { return pack_bf16x2(lo, hi); }
    static __device__ __forceinline__ float lo(unsigned w) { return bf_lo(w); }
    static __device__ __forceinline__ float hi(unsigned w) { return bf_hi(w); }
};

struct MoeF16 {
    typedef unsigned short T;
    static __device__ __forceinline__ void mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    // `lo` in the low half (the lower address), as pack_bf16x2.
    static __device__ __forceinline__ unsigned pack2(float lo, float hi) {
        unsigned r;
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
        return r;
    }
    static __device__ __forceinline__ float lo(unsigned w) {
        float r;
        const unsigned short h = (unsigned short)(w & 0xffffu);
        asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(h));
        return r;
    }
    static __device__ __forceinline__ float hi(unsigned w) {
        float r;
        const unsigned short h = (unsigned short)(w >> 16);
        asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(h));
        return r;
    }
};

// ---- copies and fragments (as sm80/attention.cu; own names, this module is compiled alone) ----
__device__ __forceinline__ void moe_cp_async16(void* smem, const void* gmem, bool pred) {
    const unsigned s = smem_addr(smem);
    const int n = pred ? 16 : 0;  // 0: nothing is read, 16 zero bytes are written
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void moe_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void moe_cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void moe_ldsm_x4(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(smem_addr(p)));
}

__device__ __forceinline__ float moe_silu(float g) { return g / (1.f + fast_exp2(-1.4426950408889634f * g)); }

// ---- 1. tile map ----

// Inclusive scan over the block (one value per thread; MAX when `is_max`, else SUM; values are
// >= 0, so 0 is the identity of both). Ends with a barrier, so tmp[MOE_MAP_THREADS - 1] holds
// the total for every thread to read.
__device__ __forceinline__ int moe_block_scan(int v, bool is_max, int* tmp) {
    const int t = threadIdx.x;
    tmp[t] = v;
    __syncthreads();
    for (int o = 1; o < MOE_MAP_THREADS; o <<= 1) {
        const int u = t >= o ? tmp[t - o] : 0;
        __syncthreads();
        v = is_max ? max(v, u) : v + u;
        tmp[t] = v;
        __syncthreads();
    }
    return v;
}

// soff[e] = min(P, max(0, offsets[0..=e])) for e in 0..=E; tstart[0] = 0 and
// tstart[e+1] = tstart[e] + ceil((soff[e+1] - soff[e]) / BM). One block of MOE_MAP_THREADS.
extern "C" __global__ void __launch_bounds__(MOE_MAP_THREADS) moe_tile_map(
        const int* __restrict__ offsets, int E, int P, int BM, int* __restrict__ soff,
        int* __restrict__ tstart) {
    __shared__ int tmp[MOE_MAP_THREADS];
    const int t = threadIdx.x;
    int carry = 0;
    for (int base = 0; base <= E; base += MOE_MAP_THREADS) {
        const int e = base + t;
        const int v = e <= E ? min(max(offsets[e], 0), P) : 0;
        const int s = max(moe_block_scan(v, true, tmp), carry);
        if (e <= E) soff[e] = s;
        carry = max(carry, tmp[MOE_MAP_THREADS - 1]);
        __syncthreads();  // everyone read tmp before the next scan writes it
    }
    // soff written by this block is visible to it after the barrier above
    if (t == 0) tstart[0] = 0;
    carry = 0;
    for (int base = 0; base < E; base += MOE_MAP_THREADS) {
        const int e = base + t;
        const int v = e < E ? (soff[e + 1] - soff[e] + BM - 1) / BM : 0;
        const int s = moe_block_scan(v, false, tmp) + carry;
        if (e < E) tstart[e + 1] = s;
        carry += tmp[MOE_MAP_THREADS - 1];
        __syncthreads();
    }
}

// ---- 2, 3. the grouped GEMM: C = A W_e^T over each expert's rows ----

// BM x BN tile of C per block (BN counts weight rows: for SWIGLU, BN/2 gate and BN/2 up rows,
// so BN/2 output columns), BK deep k-tiles, WM_WARPS x WN_WARPS warps (warp tile BM/WM_WARPS x
// BN/WN_WARPS), STAGES k-tiles in flight. Shared memory rows are padded to BK + 8 elements, so
// ldmatrix's eight 16-byte rows fall in distinct banks.
//
// SWIGLU (GEMM 1): A = x [T, K], W = gate_up [E, 2N, K], C = h [P, N] stored by permuted row p.
//   Warp wn's weight rows are [gate cols c..c+WN/2 ; up cols c..c+WN/2] (c = wn * WN/2), so its
//   n-tiles j and j + NTL/2 hold the gate and up of the same columns in the same thread.
// else (GEMM 2): A = h [P, K], W = down [E, N, K], C = rows [T*k, N] stored by slot id.
template <class Tr, int BM, int BN, int BK, int WM_WARPS, int WN_WARPS, int STAGES, bool SWIGLU>
__device__ __forceinline__ void moe_gemm(const typename Tr::T* __restrict__ A, const typename Tr::T* __restrict__ W,
                                         typename Tr::T* __restrict__ C, const int* __restrict__ sorted,
                                         const int* __restrict__ soff, const int* __restrict__ tstart,
                                         int E, int N, int K, int topk, int slots) {
    typedef typename Tr::T T;
    constexpr int NT = 32 * WM_WARPS * WN_WARPS;
    constexpr int WM = BM / WM_WARPS, WN = BN / WN_WARPS;  // warp tile (WN in weight rows)
    constexpr int MT = WM / 16, NTL = WN / 8;              // m16 and n8 tiles per warp
    constexpr int S = BK + 8;                              // shared row stride, elements
    constexpr int CPR = BK / 8;                            // 16-byte chunks per row
    constexpr int RPP = NT / CPR;                          // rows one pass of the block covers
    constexpr int A_IT = BM / RPP, B_IT = BN / RPP;        // passes per stage
    constexpr int BNO = SWIGLU ? BN / 2 : BN;              // output columns per block
    static_assert(BM % (16 * WM_WARPS) == 0 && WN % 16 == 0, "warp tile: m16 tiles, n8 tiles in pairs");
    static_assert(BK % 16 == 0 && NT % CPR == 0 && BM % RPP == 0 && BN % RPP == 0, "loader shape");
    static_assert(STAGES >= 2, "pipeline depth");

    extern __shared__ __align__(16) unsigned char moe_smem[];
    T* sA = (T*)moe_smem;          // [STAGES][BM][S]
    T* sB = sA + STAGES * BM * S;  // [STAGES][BN][S]
    __shared__ int s_arow[BM];     // row of A to load (-1: zeros)
    __shared__ int s_crow[BM];     // row of C to store (-1: none)

    // which expert, m-tile and n-tile: blocks of expert e are [tstart[e]*nb, tstart[e+1]*nb),
    // m-tile fastest
    const int nb = (N + BNO - 1) / BNO;
    const int b = blockIdx.x;
    if ((long long)b >= (long long)tstart[E] * nb) return;
    const int q = b / nb;
    int lo = 0, hi = E;  // tstart[lo] <= q < tstart[hi]
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (tstart[mid] <= q) lo = mid;
        else hi = mid;
    }
    const int e = lo;
    const int cnt = tstart[e + 1] - tstart[e];
    const int local = b - tstart[e] * nb;
    const int n_tile = local / cnt;
    const int row0 = soff[e] + (local % cnt) * BM;
    const int row_end = min(row0 + BM, soff[e + 1]);

    int real = 0;  // rows of this tile holding a slot, counted per thread
    for (int r = threadIdx.x; r < BM; r += NT) {
        const int p = row0 + r;
        int s = -1;
        if (p < row_end) {
            const int v = sorted[p];
            if (v >= 0 && v < slots) s = v;
        }
        real += s >= 0;
        if (SWIGLU) {
            s_arow[r] = s >= 0 ? s / topk : -1;
            s_crow[r] = s >= 0 ? p : -1;
        } else {
            s_arow[r] = s >= 0 ? p : -1;
            s_crow[r] = s;
        }
    }
    // a tile of padding only (routing blocks longer than BM) has nothing to compute or store
    if (__syncthreads_count(real) == 0) return;

    // this thread's 16-byte chunks: the same rows and column in every k-tile
    const int kc = (threadIdx.x % CPR) * 8;
    const int r_first = threadIdx.x / CPR;
    const T* a_src[A_IT];
    const T* b_src[B_IT];
#pragma unroll
    for (int i = 0; i < A_IT; ++i) {
        const int ar = s_arow[r_first + i * RPP];
        a_src[i] = ar >= 0 ? A + (u64_t)ar * K + kc : nullptr;
    }
    const T* We = W + (u64_t)e * (SWIGLU ? 2 : 1) * N * K;
#pragma unroll
    for (int i = 0; i < B_IT; ++i) {
        const int r = r_first + i * RPP;
        int col, wrow;
        if (SWIGLU) {
            const int wq = r % WN, half = WN / 2;
            col = n_tile * BNO + (r / WN) * half + (wq % half);
            wrow = wq >= half ? N + col : col;
        } else {
            col = n_tile * BNO + r;
            wrow = col;
        }
        b_src[i] = col < N ? We + (u64_t)wrow * K + kc : nullptr;
    }

    const int nk = (K + BK - 1) / BK;
    auto load_stage = [&](int stage, int kt) {
        const int k0 = kt * BK;
        const bool kin = k0 + kc < K;  // K % 8 == 0: a chunk is all in or all out
        T* a_dst = sA + stage * BM * S + r_first * S + kc;
        T* b_dst = sB + stage * BN * S + r_first * S + kc;
#pragma unroll
        for (int i = 0; i < A_IT; ++i) {
            const bool ok = kin && a_src[i] != nullptr;
            moe_cp_async16(a_dst + i * RPP * S, ok ? a_src[i] + k0 : A, ok);
        }
#pragma unroll
        for (int i = 0; i < B_IT; ++i) {
            const bool ok = kin && b_src[i] != nullptr;
            moe_cp_async16(b_dst + i * RPP * S, ok ? b_src[i] + k0 : W, ok);
        }
    };

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wm = warp / WN_WARPS, wn = warp % WN_WARPS;
    float acc[MT][NTL][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < NTL; ++j) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;

    // prologue: k-tiles 0..STAGES-2 in flight (one commit group each, empty past the end)
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nk) load_stage(s, s);
        moe_cp_async_commit();
    }
    for (int kt = 0; kt < nk; ++kt) {
        // groups committed so far: STAGES-1+kt; at most STAGES-2 pending => k-tile kt landed
        moe_cp_async_wait<STAGES - 2>();
        __syncthreads();  // kt visible to all; every warp is done with the stage refilled next
        const int pre = kt + STAGES - 1;
        if (pre < nk) load_stage(pre % STAGES, pre);
        moe_cp_async_commit();

        const T* a_s = sA + (kt % STAGES) * BM * S + wm * WM * S;
        const T* b_s = sB + (kt % STAGES) * BN * S + wn * WN * S;
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
            unsigned af[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
                moe_ldsm_x4(af[mt][0], af[mt][1], af[mt][2], af[mt][3],
                            a_s + (mt * 16 + (lane & 15)) * S + kk * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int j = 0; j < NTL; j += 2) {
                unsigned b0, b1, b2, b3;
                moe_ldsm_x4(b0, b1, b2, b3,
                            b_s + (j * 8 + (lane >> 4) * 8 + (lane & 7)) * S + kk * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    Tr::mma(acc[mt][j], af[mt], b0, b1);
                    Tr::mma(acc[mt][j + 1], af[mt], b2, b3);
                }
            }
        }
    }
    moe_cp_async_wait<0>();  // only empty groups can remain

    // epilogue: lane holds rows g, g+8 of each m-tile, columns 2*tq, 2*tq+1 of each n-tile
    const int g = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int crow = s_crow[wm * WM + mt * 16 + g + r * 8];
            if (crow < 0) continue;
            T* dst = C + (u64_t)crow * N;
            if (SWIGLU) {
#pragma unroll
                for (int j = 0; j < NTL / 2; ++j) {
                    const int col = n_tile * BNO + wn * (WN / 2) + j * 8 + tq * 2;
                    if (col < N) {  // N % 8 == 0: col + 1 < N too
                        const float h0 = moe_silu(acc[mt][j][2 * r]) * acc[mt][j + NTL / 2][2 * r];
                        const float h1 = moe_silu(acc[mt][j][2 * r + 1]) * acc[mt][j + NTL / 2][2 * r + 1];
                        *(unsigned*)(dst + col) = Tr::pack2(h0, h1);
                    }
                }
            } else {
#pragma unroll
                for (int j = 0; j < NTL; ++j) {
                    const int col = n_tile * BNO + wn * WN + j * 8 + tq * 2;
                    if (col < N) *(unsigned*)(dst + col) = Tr::pack2(acc[mt][j][2 * r], acc[mt][j][2 * r + 1]);
                }
            }
        }
}

// ---- 4. weighted combine of each token's k slot rows ----

// y[t, :] = sum_{j ascending} w[t*k + j] * rows[t*k + j, :] in f32; 8 columns per thread.
template <class Tr>
__device__ __forceinline__ void moe_combine(const typename Tr::T* __restrict__ rows, const float* __restrict__ w,
                                            typename Tr::T* __restrict__ y, int T, int H, int k) {
    const int hv = H / 8;
    const u64_t total = (u64_t)T * hv;
    const u64_t stride = (u64_t)gridDim.x * blockDim.x;
    for (u64_t i = (u64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const u64_t t = i / hv, v = i % hv;
        float acc[8];
#pragma unroll
        for (int c = 0; c < 8; ++c) acc[c] = 0.f;
        for (int j = 0; j < k; ++j) {
            const u64_t slot = t * k + j;
            const float wt = w[slot];
            const uint4 q = *(const uint4*)(rows + slot * H + v * 8);
            acc[0] += wt * Tr::lo(q.x); acc[1] += wt * Tr::hi(q.x);
            acc[2] += wt * Tr::lo(q.y); acc[3] += wt * Tr::hi(q.y);
            acc[4] += wt * Tr::lo(q.z); acc[5] += wt * Tr::hi(q.z);
            acc[6] += wt * Tr::lo(q.w); acc[7] += wt * Tr::hi(q.w);
        }
        uint4 o;
        o.x = Tr::pack2(acc[0], acc[1]); o.y = Tr::pack2(acc[2], acc[3]);
        o.z = Tr::pack2(acc[4], acc[5]); o.w = Tr::pack2(acc[6], acc[7]);
        *(uint4*)(y + t * H + v * 8) = o;
    }
}

// ---- entry points ----

#define MOE_GEMM_ENTRY(NAME, TR, BM, BN, BK, WMW, WNW, STAGES, SWIGLU)                                   \
    extern "C" __global__ void __launch_bounds__(32 * WMW * WNW) NAME(                                  \
            const unsigned short* __restrict__ a, const unsigned short* __restrict__ w,                   \
            unsigned short* __restrict__ c, const int* __restrict__ sorted, const int* __restrict__ soff, \
            const int* __restrict__ tstart, int E, int N, int K, int topk, int slots) {                   \
        moe_gemm<TR, BM, BN, BK, WMW, WNW, STAGES, SWIGLU>(a, w, c, sorted, soff, tstart, E, N, K, topk,  \
                                                           slots);                                         \
    }

// Tiles (the host's `Tile`; dynamic shared memory STAGES * (BM + BN) * (BK + 8) * 2 bytes):
//   l: 128 x 128 x 32, 2x2 warps of 64x64, 4 stages (80 KiB)  many tokens per expert
//   m:  64 x 128 x 32, 2x2 warps of 32x64, 4 stages (60 KiB)
//   s:  32 x 128 x 64, 1x4 warps of 32x32, 4 stages (90 KiB)  decode: weight streaming
// name                          traits   BM   BN  BK WM WN ST SWIGLU
MOE_GEMM_ENTRY(moe_gemm_swiglu_bf16_l, MoeBf16, 128, 128, 32, 2, 2, 4, true)
MOE_GEMM_ENTRY(moe_gemm_swiglu_bf16_m, MoeBf16, 64, 128, 32, 2, 2, 4, true)
MOE_GEMM_ENTRY(moe_gemm_swiglu_bf16_s, MoeBf16, 32, 128, 64, 1, 4, 4, true)
MOE_GEMM_ENTRY(moe_gemm_down_bf16_l, MoeBf16, 128, 128, 32, 2, 2, 4, false)
MOE_GEMM_ENTRY(moe_gemm_down_bf16_m, MoeBf16, 64, 128, 32, 2, 2, 4, false)
MOE_GEMM_ENTRY(moe_gemm_down_bf16_s, MoeBf16, 32, 128, 64, 1, 4, 4, false)
MOE_GEMM_ENTRY(moe_gemm_swiglu_f16_l, MoeF16, 128, 128, 32, 2, 2, 4, true)
MOE_GEMM_ENTRY(moe_gemm_swiglu_f16_m, MoeF16, 64, 128, 32, 2, 2, 4, true)
MOE_GEMM_ENTRY(moe_gemm_swiglu_f16_s, MoeF16, 32, 128, 64, 1, 4, 4, true)
MOE_GEMM_ENTRY(moe_gemm_down_f16_l, MoeF16, 128, 128, 32, 2, 2, 4, false)
MOE_GEMM_ENTRY(moe_gemm_down_f16_m, MoeF16, 64, 128, 32, 2, 2, 4, false)
MOE_GEMM_ENTRY(moe_gemm_down_f16_s, MoeF16, 32, 128, 64, 1, 4, 4, false)

extern "C" __global__ void moe_combine_slots_bf16(const bf16_t* __restrict__ rows, const float* __restrict__ w,
                                                  bf16_t* __restrict__ y, int T, int H, int k) {
    moe_combine<MoeBf16>(rows, w, y, T, H, k);
}
extern "C" __global__ void moe_combine_slots_f16(const unsigned short* __restrict__ rows, const float* __restrict__ w,
                                                 unsigned short* __restrict__ y, int T, int H, int k) {
    moe_combine<MoeF16>(rows, w, y, T, H, k);
}
