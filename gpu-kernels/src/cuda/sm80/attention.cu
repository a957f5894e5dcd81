// FlashAttention-2-style forward for sm_80 and later: bf16 or f16 operands on the tensor
// cores (mma.sync m16n8k16, f32 accumulate), online softmax in registers, K/V tiles
// double-buffered in shared memory with cp.async. Each warp owns 16 query rows; a block owns
// 16*NW rows. The storage is the template parameter ST (BF16 or F16 of common.cuh): entry
// points `mha_bf16_fwd_*` and `mha_f16_fwd_*`. The fragment layouts of m16n8k16 are the same
// for both types, so only the mma instruction and the P/O packing differ.
//
// q [B, Hq, Nq, D], k/v [B, Hkv, Nkv, D] (ST), o [B, Hq, Nq, D] (ST), lse [B, Hq, Nq] (f32,
// natural log). Query head h reads kv head h / (Hq / Hkv). Causal masks are bottom-right:
// query i sees key j iff j <= i + Nkv - Nq; a row that sees nothing gets o = 0, lse = -inf.

// key rows per tile: the BN template parameter (ATT_BN is the default)
#define ATT_BN 64

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool pred) {
    const unsigned s = smem_addr(smem);
    const int n = pred ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldsm_x4(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void mma_bf16(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_f16(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// c += a b on the tensor cores in the storage type ST.
template <typename ST>
__device__ __forceinline__ void mma_st(float* c, const unsigned* a, unsigned b0, unsigned b1);
template <>
__device__ __forceinline__ void mma_st<BF16>(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    mma_bf16(c, a, b0, b1);
}
template <>
__device__ __forceinline__ void mma_st<F16>(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    mma_f16(c, a, b0, b1);
}

// Loads `rows` x D of a [N, D] matrix starting at row r0 into shared memory (row stride
// D + 8), zero-filling rows past n.
template <int D, int NT>
__device__ __forceinline__ void load_tile(h16_t* s, const h16_t* g, int r0, int rows, int n) {
    constexpr int CPR = D / 8;  // 16-byte chunks per row
    for (int c = threadIdx.x; c < rows * CPR; c += NT) {
        const int r = c / CPR, col = (c % CPR) * 8;
        const bool ok = r0 + r < n;
        const h16_t* src = ok ? g + (u64_t)(r0 + r) * D + col : g;
        cp_async16(s + r * (D + 8) + col, src, ok);
    }
}

// NW warps, each owning MT 16-row m-tiles (so each K/V fragment read from shared memory feeds
// MT mma's); QREG keeps the Q fragments in registers for the whole loop, else they are re-read
// from shared memory each tile (fewer registers).
template <typename ST, int D, int NW, int MT, bool QREG, int BN>
__device__ __forceinline__ void attn_fwd(const h16_t* __restrict__ Q, const h16_t* __restrict__ K,
                                         const h16_t* __restrict__ V, h16_t* __restrict__ O,
                                         float* __restrict__ LSE, int Hq, int Hkv, int Nq, int Nkv,
                                         float scale_log2, int causal) {
    constexpr int BM = 16 * MT * NW, NT = 32 * NW, S = D + 8;
    constexpr int KD = D / 16;   // k-steps over the head dim
    constexpr int NN = BN / 8;   // n-tiles of S
    constexpr int ND = D / 8;    // n-tiles of O
    extern __shared__ __align__(16) unsigned char att_smem[];
    h16_t* sQ = (h16_t*)att_smem;
    h16_t* sK = sQ + BM * S;
    h16_t* sV = sK + BN * S;

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int m_block = gridDim.x - 1 - blockIdx.x;  // longest (causal) blocks first
    const int h = blockIdx.y, b = blockIdx.z;
    const int hk = h / (Hq / Hkv);
    const h16_t* q = Q + ((u64_t)b * Hq + h) * Nq * D;
    const h16_t* k = K + ((u64_t)b * Hkv + hk) * Nkv * D;
    const h16_t* v = V + ((u64_t)b * Hkv + hk) * Nkv * D;
    h16_t* o = O + ((u64_t)b * Hq + h) * Nq * D;
    float* lse = LSE + ((u64_t)b * Hq + h) * Nq;
    const int m0 = m_block * BM;
    const int diag = Nkv - Nq;
    const int n_end = causal ? min(Nkv, m0 + BM + diag) : Nkv;
    const int n_blocks = n_end > 0 ? (n_end + BN - 1) / BN : 0;

    const int g = lane >> 2, tq = lane & 3;
    const int wrow = warp * 16 * MT;      // first tile row of this warp
    const int row0 = m0 + wrow + g;       // this lane's rows: row0 + 16*mt + {0, 8}

    float acc_o[MT][ND][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < ND; ++i) acc_o[mt][i][0] = acc_o[mt][i][1] = acc_o[mt][i][2] = acc_o[mt][i][3] = 0.f;
    float m_r[MT][2], l_r[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        m_r[mt][0] = m_r[mt][1] = TANDEM_NEG_INF;
        l_r[mt][0] = l_r[mt][1] = 0.f;
    }

    // FA2's schedule with one K and one V buffer: V_j loads while S = Q K_j and the softmax
    // run; K_{j+1} loads while O += P V_j runs.
    if (n_blocks > 0) {
        load_tile<D, NT>(sQ, q, m0, BM, Nq);
        load_tile<D, NT>(sK, k, 0, BN, Nkv);
        cp_async_commit();
    }
    unsigned qf[QREG ? MT : 1][QREG ? KD : 1][4];
    for (int nb = 0; nb < n_blocks; ++nb) {
        cp_async_wait<0>();
        __syncthreads();  // K_nb (and Q) landed; every warp is done with V_{nb-1}
        load_tile<D, NT>(sV, v, nb * BN, BN, Nkv);
        cp_async_commit();
        if (QREG && nb == 0) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int kk = 0; kk < KD; ++kk) {
                    const h16_t* p = sQ + (wrow + mt * 16 + (lane & 15)) * S + kk * 16 + (lane >> 4) * 8;
                    ldsm_x4(qf[QREG ? mt : 0][QREG ? kk : 0][0], qf[QREG ? mt : 0][QREG ? kk : 0][1],
                            qf[QREG ? mt : 0][QREG ? kk : 0][2], qf[QREG ? mt : 0][QREG ? kk : 0][3], p);
                }
        }
        const h16_t* cK = sK;
        const h16_t* cV = sV;
        // S = Q K^T for this warp's rows x BN keys
        float acc_s[MT][NN][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int i = 0; i < NN; ++i) acc_s[mt][i][0] = acc_s[mt][i][1] = acc_s[mt][i][2] = acc_s[mt][i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KD; ++kk) {
            unsigned qa[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                if (QREG) {
#pragma unroll
                    for (int j = 0; j < 4; ++j) qa[mt][j] = qf[QREG ? mt : 0][QREG ? kk : 0][j];
                } else {
                    const h16_t* p = sQ + (wrow + mt * 16 + (lane & 15)) * S + kk * 16 + (lane >> 4) * 8;
                    ldsm_x4(qa[mt][0], qa[mt][1], qa[mt][2], qa[mt][3], p);
                }
            }
#pragma unroll
            for (int nt = 0; nt < NN; nt += 2) {
                unsigned b0, b1, b2, b3;
                const h16_t* p = cK + (nt * 8 + (lane >> 4) * 8 + (lane & 7)) * S + kk * 16 + ((lane >> 3) & 1) * 8;
                ldsm_x4(b0, b1, b2, b3, p);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma_st<ST>(acc_s[mt][nt], qa[mt], b0, b1);
                    mma_st<ST>(acc_s[mt][nt + 1], qa[mt], b2, b3);
                }
            }
        }
        // mask: keys past Nkv, and above the causal diagonal
        const int n0 = nb * BN;
        const bool need_mask = (n0 + BN > Nkv) || (causal && n0 + BN - 1 > m0 + diag);
        if (need_mask) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < NN; ++nt) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int j = n0 + nt * 8 + tq * 2 + (e & 1);
                        const int i = row0 + mt * 16 + (e >> 1) * 8;
                        if (j >= Nkv || (causal && j > i + diag)) acc_s[mt][nt][e] = TANDEM_NEG_INF;
                    }
                }
        }
        // online softmax, two rows per lane per m-tile
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                float mx = m_r[mt][r];
#pragma unroll
                for (int nt = 0; nt < NN; ++nt) mx = fmaxf(mx, fmaxf(acc_s[mt][nt][2 * r], acc_s[mt][nt][2 * r + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float m_use = mx == TANDEM_NEG_INF ? 0.f : mx;
                const float alpha = fast_exp2((m_r[mt][r] - m_use) * scale_log2);
                m_r[mt][r] = mx;
                const float mb = m_use * scale_log2;
                float rs = 0.f;
#pragma unroll
                for (int nt = 0; nt < NN; ++nt) {
                    acc_s[mt][nt][2 * r] = fast_exp2(fmaf(acc_s[mt][nt][2 * r], scale_log2, -mb));
                    acc_s[mt][nt][2 * r + 1] = fast_exp2(fmaf(acc_s[mt][nt][2 * r + 1], scale_log2, -mb));
                    rs += acc_s[mt][nt][2 * r] + acc_s[mt][nt][2 * r + 1];
                }
                l_r[mt][r] = l_r[mt][r] * alpha + rs;
#pragma unroll
                for (int dt = 0; dt < ND; ++dt) {
                    acc_o[mt][dt][2 * r] *= alpha;
                    acc_o[mt][dt][2 * r + 1] *= alpha;
                }
            }
        cp_async_wait<0>();
        __syncthreads();  // V_nb landed; every warp is done with K_nb
        if (nb + 1 < n_blocks) load_tile<D, NT>(sK, k, (nb + 1) * BN, BN, Nkv);
        cp_async_commit();
        // O += P V
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            unsigned pa[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                pa[mt][0] = ST::pack2(acc_s[mt][2 * kk][0], acc_s[mt][2 * kk][1]);
                pa[mt][1] = ST::pack2(acc_s[mt][2 * kk][2], acc_s[mt][2 * kk][3]);
                pa[mt][2] = ST::pack2(acc_s[mt][2 * kk + 1][0], acc_s[mt][2 * kk + 1][1]);
                pa[mt][3] = ST::pack2(acc_s[mt][2 * kk + 1][2], acc_s[mt][2 * kk + 1][3]);
            }
#pragma unroll
            for (int dt = 0; dt < ND; dt += 2) {
                unsigned b0, b1, b2, b3;
                const h16_t* p = cV + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * S + (dt + (lane >> 4)) * 8;
                ldsm_x4_t(b0, b1, b2, b3, p);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma_st<ST>(acc_o[mt][dt], pa[mt], b0, b1);
                    mma_st<ST>(acc_o[mt][dt + 1], pa[mt], b2, b3);
                }
            }
        }
    }
    cp_async_wait<0>();
    // finish: full row sums, normalise, store
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float l = l_r[mt][r];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const int i = row0 + mt * 16 + r * 8;
            const float inv = l > 0.f ? 1.f / l : 0.f;
            if (i < Nq) {
                h16_t* orow = o + (u64_t)i * D;
#pragma unroll
                for (int dt = 0; dt < ND; ++dt)
                    *(unsigned*)(orow + dt * 8 + tq * 2) =
                        ST::pack2(acc_o[mt][dt][2 * r] * inv, acc_o[mt][dt][2 * r + 1] * inv);
                if (tq == 0)
                    lse[i] = l > 0.f ? (m_r[mt][r] * scale_log2 + __log2f(l)) * 0.69314718055994531f : TANDEM_NEG_INF;
            }
        }
}

#define ATT_ENTRY(NAME, ST, D, NW, MT, QREG, BN)                                                \
    extern "C" __global__ void __launch_bounds__(32 * NW) NAME(                                      \
            const h16_t* __restrict__ q, const h16_t* __restrict__ k, const h16_t* __restrict__ v,   \
            h16_t* __restrict__ o, float* __restrict__ lse, int Hq, int Hkv, int Nq, int Nkv,        \
            float scale_log2, int causal) {                                                          \
        attn_fwd<ST, D, NW, MT, QREG, BN>(q, k, v, o, lse, Hq, Hkv, Nq, Nkv, scale_log2, causal);    \
    }

// name                          storage D  warps m-tiles/warp Q-in-registers key-tile
ATT_ENTRY(mha_bf16_fwd_d64,        BF16, 64, 4, 1, true, 64)
ATT_ENTRY(mha_bf16_fwd_d128,       BF16, 128, 4, 1, true, 64)
ATT_ENTRY(mha_bf16_fwd_d64_w8,     BF16, 64, 8, 1, true, 64)
ATT_ENTRY(mha_bf16_fwd_d128_w8,    BF16, 128, 8, 1, true, 64)
ATT_ENTRY(mha_bf16_fwd_d64_m2,     BF16, 64, 4, 2, true, 64)
ATT_ENTRY(mha_bf16_fwd_d128_m2,    BF16, 128, 4, 2, false, 64)
ATT_ENTRY(mha_bf16_fwd_d64_m2n32,  BF16, 64, 4, 2, true, 32)
ATT_ENTRY(mha_bf16_fwd_d128_m2n32, BF16, 128, 4, 2, true, 32)
// head dim 256: O takes 128 registers a thread, so one m-tile a warp and Q re-read from shared
// memory each tile (the m2 layouts would need 256 for O alone); 4 warps need 99 KB of shared
// memory (every sm_80+ part has it), 8 warps 132 KB
ATT_ENTRY(mha_bf16_fwd_d256,       BF16, 256, 4, 1, false, 64)
ATT_ENTRY(mha_bf16_fwd_d256_w8,    BF16, 256, 8, 1, false, 64)
ATT_ENTRY(mha_f16_fwd_d256,        F16, 256, 4, 1, false, 64)
ATT_ENTRY(mha_f16_fwd_d256_w8,     F16, 256, 8, 1, false, 64)
ATT_ENTRY(mha_f16_fwd_d64,         F16, 64, 4, 1, true, 64)
ATT_ENTRY(mha_f16_fwd_d128,        F16, 128, 4, 1, true, 64)
ATT_ENTRY(mha_f16_fwd_d64_w8,      F16, 64, 8, 1, true, 64)
ATT_ENTRY(mha_f16_fwd_d128_w8,     F16, 128, 8, 1, true, 64)
ATT_ENTRY(mha_f16_fwd_d64_m2,      F16, 64, 4, 2, true, 64)
ATT_ENTRY(mha_f16_fwd_d128_m2,     F16, 128, 4, 2, false, 64)
ATT_ENTRY(mha_f16_fwd_d64_m2n32,   F16, 64, 4, 2, true, 32)
ATT_ENTRY(mha_f16_fwd_d128_m2n32,  F16, 128, 4, 2, true, 32)
