// Hopper (sm_90a) attention forward: S = Q K^T on wgmma (warpgroup MMA, operands read by the
// tensor cores straight from shared memory through matrix descriptors), the online softmax and
// O += P V as in sm80/attention.cu (mma.sync, P from registers, V through ldmatrix.trans).
// Compiled after sm80/attention.cu (its helpers: cp_async16, ldsm_x4_t, mma_bf16, ATT_BN).
//
// One warpgroup (4 warps) per block, 64*MT query rows: m-tile mt (64 rows) is one wgmma chain;
// warp w owns rows 64*mt + 16*w + {g, g+8}, the accumulator layout wgmma and mma.sync share.
// Q and K live in shared memory in the no-swizzle core-matrix layout (8 rows x 16 bytes per core
// matrix; core matrices along K 128 bytes apart (LBO), 8-row groups D*16 bytes apart (SBO)).

__device__ __forceinline__ u64_t wg_desc(const void* smem, unsigned lbo, unsigned sbo) {
    const unsigned a = smem_addr(smem);
    return (u64_t)((a & 0x3FFFF) >> 4) | ((u64_t)(lbo >> 4) << 16) | ((u64_t)(sbo >> 4) << 32);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// d[64x64] (+)= A[64x16] B[16x64]^T, both K-major in shared memory. 32 f32 per thread.
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[8][4], u64_t da, u64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
          "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
          "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
          "+f"(d[7][2]), "+f"(d[7][3])
        : "l"(da), "l"(db), "r"(accumulate));
}

// d[64x64] += A[64x16] (registers, mma.sync's A fragment per warp) B[16x64], B N-major in
// shared memory (imm-trans-b = 1). 32 f32 per thread.
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[8][4], const unsigned (&a)[4], u64_t db) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, 1, 1, 1, 1;\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

// d[64x128] += A[64x16] (registers, mma.sync's A fragment per warp) B[16x128], B N-major in
// shared memory (imm-trans-b = 1). 64 f32 per thread.
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[16][4], const unsigned (&a)[4], u64_t db) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, 1, 1, 1, 1;\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

// Loads rows x D of a [N, D] matrix into the core-matrix layout, zero-filling rows past n. A
// warp moves 8 rows x 4 chunks: 64 contiguous bytes per row from global memory, 512
// contiguous bytes (conflict-free) into shared memory.
template <int D, int NT>
__device__ __forceinline__ void load_tile_cm(bf16_t* s, const bf16_t* g, int r0, int rows, int n) {
    constexpr int CPR = D / 8;
    for (int c = threadIdx.x; c < rows * CPR; c += NT) {
        const int lane = c & 31, grp = c >> 5;
        const int rg = grp / (CPR / 4), cq = grp % (CPR / 4);
        const int ri = lane & 7, cc = cq * 4 + (lane >> 3);
        const int r = rg * 8 + ri;
        const bool ok = r0 + r < n;
        const bf16_t* src = ok ? g + (u64_t)(r0 + r) * D + cc * 8 : g;
        cp_async16(s + ((rg * CPR + cc) * 8 + ri) * 8, src, ok);
    }
}

template <int D, bool PV_WG, int MT, int NWG = 1>
__device__ __forceinline__ void attn_fwd_wg(const bf16_t* __restrict__ Q, const bf16_t* __restrict__ K,
                                            const bf16_t* __restrict__ V, bf16_t* __restrict__ O,
                                            float* __restrict__ LSE, int Hq, int Hkv, int Nq, int Nkv,
                                            float scale_log2, int causal) {
    constexpr int BM = 64 * MT * NWG, BN = 64, NT = 128 * NWG, SV = D + 8;
    constexpr int KD = D / 16, NN = BN / 8, ND = D / 8;
    constexpr unsigned LBO = 128, SBO = D * 16;
    extern __shared__ __align__(128) unsigned char att_smem[];
    bf16_t* sQ = (bf16_t*)att_smem;   // BM x D, core-matrix layout
    bf16_t* sK = sQ + BM * D;         // BN x D, core-matrix layout
    bf16_t* sV = sK + BN * D;         // BN x (D + 8) row-major, or BN x D core-matrix (PV_WG)

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int m_block = gridDim.x - 1 - blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z;
    const int hk = h / (Hq / Hkv);
    const bf16_t* q = Q + ((u64_t)b * Hq + h) * Nq * D;
    const bf16_t* k = K + ((u64_t)b * Hkv + hk) * Nkv * D;
    const bf16_t* v = V + ((u64_t)b * Hkv + hk) * Nkv * D;
    bf16_t* o = O + ((u64_t)b * Hq + h) * Nq * D;
    float* lse = LSE + ((u64_t)b * Hq + h) * Nq;
    const int m0 = m_block * BM;
    const int diag = Nkv - Nq;
    const int n_end = causal ? min(Nkv, m0 + BM + diag) : Nkv;
    const int n_blocks = n_end > 0 ? (n_end + BN - 1) / BN : 0;
    const int g = lane >> 2, tq = lane & 3;
    const int wgi = warp >> 2;            // warpgroup: rows [m0 + 64*MT*wgi, +64*MT)
    const int row0 = m0 + wgi * 64 * MT + (warp & 3) * 16 + g;  // rows row0 + 64*mt + {0, 8}

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
    if (n_blocks > 0) {
        load_tile_cm<D, NT>(sQ, q, m0, BM, Nq);
        load_tile_cm<D, NT>(sK, k, 0, BN, Nkv);
        cp_async_commit();
    }
    for (int nb = 0; nb < n_blocks; ++nb) {
        cp_async_wait<0>();
        fence_proxy_async();
        __syncthreads();  // K_nb (and Q) landed and visible to the tensor cores; V buffer free
        if (PV_WG) load_tile_cm<D, NT>(sV, v, nb * BN, BN, Nkv);
        else load_tile<D, NT>(sV, v, nb * BN, BN, Nkv);
        cp_async_commit();
        float acc_s[MT][NN][4];
        wg_fence();
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int kk = 0; kk < KD; ++kk) {
                const u64_t da = wg_desc(sQ + ((wgi * MT + mt) * 8 * (D / 8) + kk * 2) * 64, LBO, SBO);
                const u64_t db = wg_desc(sK + kk * 2 * 64, LBO, SBO);
                wgmma_m64n64k16(acc_s[mt], da, db, kk > 0);
            }
        }
        wg_commit();
        wg_wait0();
        const int n0 = nb * BN;
        const bool need_mask = (n0 + BN > Nkv) || (causal && n0 + BN - 1 > m0 + diag);
        if (need_mask) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < NN; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int j = n0 + nt * 8 + tq * 2 + (e & 1);
                        const int i = row0 + mt * 64 + (e >> 1) * 8;
                        if (j >= Nkv || (causal && j > i + diag)) acc_s[mt][nt][e] = TANDEM_NEG_INF;
                    }
        }
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
        if (PV_WG) fence_proxy_async();
        __syncthreads();  // V_nb landed; every warpgroup read of K_nb is complete (wait above)
        if (nb + 1 < n_blocks) load_tile_cm<D, NT>(sK, k, (nb + 1) * BN, BN, Nkv);
        cp_async_commit();
        if (PV_WG) {
            // O += P V on wgmma: P from registers, V N-major in shared memory (core matrices:
            // 8 d's x 8 keys; d-groups 128 bytes apart (SBO), key-groups D*16 bytes (LBO)).
            unsigned pa[MT][BN / 16][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int kk = 0; kk < BN / 16; ++kk) {
                    pa[mt][kk][0] = pack_bf16x2(acc_s[mt][2 * kk][0], acc_s[mt][2 * kk][1]);
                    pa[mt][kk][1] = pack_bf16x2(acc_s[mt][2 * kk][2], acc_s[mt][2 * kk][3]);
                    pa[mt][kk][2] = pack_bf16x2(acc_s[mt][2 * kk + 1][0], acc_s[mt][2 * kk + 1][1]);
                    pa[mt][kk][3] = pack_bf16x2(acc_s[mt][2 * kk + 1][2], acc_s[mt][2 * kk + 1][3]);
                }
            wg_fence();
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int kk = 0; kk < BN / 16; ++kk) {
                    const u64_t dv = wg_desc(sV + kk * 2 * (D / 8) * 64, D * 16, 128);
                    if constexpr (D == 128) wgmma_m64n128k16_rs(acc_o[mt], pa[mt][kk], dv);
                    else wgmma_m64n64k16_rs(acc_o[mt], pa[mt][kk], dv);
                }
            wg_commit();
            wg_wait0();
        } else {
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) {
                unsigned pa[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    pa[mt][0] = pack_bf16x2(acc_s[mt][2 * kk][0], acc_s[mt][2 * kk][1]);
                    pa[mt][1] = pack_bf16x2(acc_s[mt][2 * kk][2], acc_s[mt][2 * kk][3]);
                    pa[mt][2] = pack_bf16x2(acc_s[mt][2 * kk + 1][0], acc_s[mt][2 * kk + 1][1]);
                    pa[mt][3] = pack_bf16x2(acc_s[mt][2 * kk + 1][2], acc_s[mt][2 * kk + 1][3]);
                }
#pragma unroll
                for (int dt = 0; dt < ND; dt += 2) {
                    unsigned b0, b1, b2, b3;
                    const bf16_t* p = sV + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * SV + (dt + (lane >> 4)) * 8;
                    ldsm_x4_t(b0, b1, b2, b3, p);
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        mma_bf16(acc_o[mt][dt], pa[mt], b0, b1);
                        mma_bf16(acc_o[mt][dt + 1], pa[mt], b2, b3);
                    }
                }
            }
        }
    }
    cp_async_wait<0>();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float l = l_r[mt][r];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const int i = row0 + mt * 64 + r * 8;
            const float inv = l > 0.f ? 1.f / l : 0.f;
            if (i < Nq) {
                bf16_t* orow = o + (u64_t)i * D;
#pragma unroll
                for (int dt = 0; dt < ND; ++dt)
                    *(unsigned*)(orow + dt * 8 + tq * 2) =
                        pack_bf16x2(acc_o[mt][dt][2 * r] * inv, acc_o[mt][dt][2 * r + 1] * inv);
                if (tq == 0)
                    lse[i] = l > 0.f ? (m_r[mt][r] * scale_log2 + __log2f(l)) * 0.69314718055994531f : TANDEM_NEG_INF;
            }
        }
}

extern "C" __global__ void __launch_bounds__(128) mha_bf16_fwd_d64_wg(
        const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
        bf16_t* __restrict__ o, float* __restrict__ lse, int Hq, int Hkv, int Nq, int Nkv,
        float scale_log2, int causal) {
    attn_fwd_wg<64, false, 2>(q, k, v, o, lse, Hq, Hkv, Nq, Nkv, scale_log2, causal);
}

extern "C" __global__ void __launch_bounds__(128) mha_bf16_fwd_d128_wg(
        const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
        bf16_t* __restrict__ o, float* __restrict__ lse, int Hq, int Hkv, int Nq, int Nkv,
        float scale_log2, int causal) {
    attn_fwd_wg<128, false, 2>(q, k, v, o, lse, Hq, Hkv, Nq, Nkv, scale_log2, causal);
}

extern "C" __global__ void __launch_bounds__(128) mha_bf16_fwd_d64_wg2(
        const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
        bf16_t* __restrict__ o, float* __restrict__ lse, int Hq, int Hkv, int Nq, int Nkv,
        float scale_log2, int causal) {
    attn_fwd_wg<64, true, 2>(q, k, v, o, lse, Hq, Hkv, Nq, Nkv, scale_log2, causal);
}

extern "C" __global__ void __launch_bounds__(128) mha_bf16_fwd_d128_wg2(
        const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
        bf16_t* __restrict__ o, float* __restrict__ lse, int Hq, int Hkv, int Nq, int Nkv,
        float scale_log2, int causal) {
    attn_fwd_wg<128, true, 2>(q, k, v, o, lse, Hq, Hkv, Nq, Nkv, scale_log2, causal);
}

// One m-tile per block (64 query rows): about half the registers, so more blocks share an SM.
#define WG_ENTRY(NAME, D, PV, MT)                                                                    \
    extern "C" __global__ void __launch_bounds__(128) NAME(                                          \
            const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v, \
            bf16_t* __restrict__ o, float* __restrict__ lse, int Hq, int Hkv, int Nq, int Nkv,       \
            float scale_log2, int causal) {                                                          \
        attn_fwd_wg<D, PV, MT>(q, k, v, o, lse, Hq, Hkv, Nq, Nkv, scale_log2, causal);              \
    }
WG_ENTRY(mha_bf16_fwd_d64_wgs, 64, false, 1)
WG_ENTRY(mha_bf16_fwd_d128_wgs, 128, false, 1)
WG_ENTRY(mha_bf16_fwd_d64_wg2s, 64, true, 1)
WG_ENTRY(mha_bf16_fwd_d128_wg2s, 128, true, 1)

// Two consumer warpgroups per block (256 query rows): K and V are read once for twice the rows,
// and one warpgroup's softmax can run while the other's wgmma does.
#define WG2_ENTRY(NAME, D, PV)                                                                       \
    extern "C" __global__ void __launch_bounds__(256) NAME(                                          \
            const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v, \
            bf16_t* __restrict__ o, float* __restrict__ lse, int Hq, int Hkv, int Nq, int Nkv,       \
            float scale_log2, int causal) {                                                          \
        attn_fwd_wg<D, PV, 2, 2>(q, k, v, o, lse, Hq, Hkv, Nq, Nkv, scale_log2, causal);            \
    }
WG2_ENTRY(mha_bf16_fwd_d64_wgx2, 64, false)
WG2_ENTRY(mha_bf16_fwd_d128_wgx2, 128, false)
