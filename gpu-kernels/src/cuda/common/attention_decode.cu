// Decode attention (flash-decoding, split-KV) on any sm_80+ device, bf16 and f16 storage,
// f32 math. Nq (1..16) new queries per sequence against a KV cache, contiguous
// [B, Hkv, Nmax, D] or paged [num_blocks, Hkv, block_size, D] through a block table.
//
// Pass 1, decode_partial: grid (chunks, Hkv * row groups, B), DEC_WARPS warps per block. A
// block takes one chunk of one sequence's keys for one kv head, and up to RB query rows of
// that head's group (the Hq/Hkv query heads x Nq new queries, rows r = h * Nq + i), so each
// K/V byte of the chunk is read once per row group (once in all when the group has <= RB
// rows). Lanes split a key's D elements into 16-byte vectors (VPL per lane, LPK lanes per
// key, KPW = 32 / LPK keys per warp step); each warp runs an online softmax over its keys
// (scores in the log2 domain), the block's warps are merged through shared memory and the
// chunk's (o, lse) written to f32 scratch.
//
// Pass 2, decode_merge: one block per query row combines the chunks' partials by their LSE
// and writes o in the storage precision and the natural-log LSE.
//
// Bad values never make a read outside the cache: a length outside nq..=capacity or a
// block id outside 0..num_blocks turns the sequence's partials into NaN, and the merge writes
// NaN for its rows.

#define DEC_WARPS 4
#define DEC_THREADS (32 * DEC_WARPS)
#define DEC_NAN __int_as_float(0x7fc00000)

__device__ __forceinline__ uint4 dec_ld(const h16_t* p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

template <int D, int RB>
struct DecGeom {
    // 16-byte vectors per lane per key (at most 2): q and acc take 2 * RB * 8 * VPL registers
    // (<= 128), the tile's K and V vectors 8 * U * VPL
    static constexpr int VPL0 = (8 / RB) < (D / 64) ? (8 / RB) : (D / 64);
    static constexpr int VPL1 = VPL0 < 2 ? VPL0 : 2;
    static constexpr int VPL = VPL1 < 1 ? 1 : VPL1;
    static constexpr int LPK = D / (8 * VPL);  // lanes per key
    static constexpr int KPW = 32 / LPK;       // keys per warp step
    static constexpr int U = RB <= 4 ? 4 : 2;  // warp steps per tile (loads in flight)
    static constexpr int KEYS_PER_TILE = U * KPW * DEC_WARPS;
};

// part_o: [rows_total, chunks, D] f32, part_lse: [rows_total, chunks] (log2 domain), where
// rows_total = B * Hq * Nq and row id = (b * Hkv + g) * R + r.
template <typename S, int D, int RB, bool PAGED>
__device__ __forceinline__ void decode_partial(
    const h16_t* __restrict__ q, const h16_t* __restrict__ k, const h16_t* __restrict__ v,
    const int* __restrict__ seq_lens, const int* __restrict__ block_table,
    float* __restrict__ part_o, float* __restrict__ part_lse,
    int hq, int hkv, int nq, int capacity, int block_log2, int max_blocks, int num_blocks,
    int chunk_len, float scale_log2) {
    typedef DecGeom<D, RB> G;
    constexpr int VPL = G::VPL, LPK = G::LPK, KPW = G::KPW, U = G::U;
    __shared__ float s_acc[DEC_WARPS][RB][D];
    __shared__ float s_m[DEC_WARPS][RB];
    __shared__ float s_l[DEC_WARPS][RB];

    const int chunk = blockIdx.x, chunks = gridDim.x;
    const int rgroups = gridDim.y / hkv;
    const int g = blockIdx.y / rgroups, rg = blockIdx.y % rgroups;
    const int b = blockIdx.z;
    const int R = hq / hkv * nq;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int sg = lane / LPK, sl = lane % LPK;
    const int len = seq_lens[b];
    const bool bad_len = len < nq || len > capacity;
    const int c0 = chunk * chunk_len;
    const int c1 = min(c0 + chunk_len, bad_len ? 0 : len);

    // Rows of this block: r = rg * RB + rr (valid while < R).
    auto write_const = [&](float o_val, float lse_val) {
        for (int idx = threadIdx.x; idx < RB * D; idx += DEC_THREADS) {
            const int rr = idx / D, d = idx % D, r = rg * RB + rr;
            if (r >= R) continue;
            const long long row = (long long)(b * hkv + g) * R + r;
            part_o[(row * chunks + chunk) * D + d] = o_val;
            if (d == 0) part_lse[row * chunks + chunk] = lse_val;
        }
    };
    if (bad_len) {
        write_const(DEC_NAN, DEC_NAN);
        return;
    }
    if (c0 >= c1) {
        write_const(0.f, TANDEM_NEG_INF);
        return;
    }

    // This lane's q values (scaled into the log2 domain) and the keys each row sees.
    float qf[RB][8 * VPL];
    int seen[RB];
#pragma unroll
    for (int rr = 0; rr < RB; ++rr) {
        const int r = rg * RB + rr;
        if (r < R) {
            const int h = g * (hq / hkv) + r / nq, i = r % nq;
            seen[rr] = len - nq + i + 1;
            const h16_t* qp = q + (((long long)b * hq + h) * nq + i) * D;
#pragma unroll
            for (int vv = 0; vv < VPL; ++vv) {
                const uint4 w = *reinterpret_cast<const uint4*>(qp + (vv * LPK + sl) * 8);
                unpack8_as<S>(w, &qf[rr][vv * 8]);
#pragma unroll
                for (int e = 0; e < 8; ++e) qf[rr][vv * 8 + e] *= scale_log2;
            }
        } else {
            seen[rr] = 0;
#pragma unroll
            for (int e = 0; e < 8 * VPL; ++e) qf[rr][e] = 0.f;
        }
    }

    float acc[RB][8 * VPL];
    float m[RB], l[RB];
#pragma unroll
    for (int rr = 0; rr < RB; ++rr) {
        m[rr] = TANDEM_NEG_INF;
        l[rr] = 0.f;
#pragma unroll
        for (int e = 0; e < 8 * VPL; ++e) acc[rr][e] = 0.f;
    }
    int bad_block = 0;
    const long long head_stride = PAGED ? (1LL << block_log2) * D : (long long)capacity * D;

    for (int t0 = c0; t0 < c1; t0 += G::KEYS_PER_TILE) {
        uint4 kv[U][VPL], vv4[U][VPL];
        int key[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int j = t0 + (u * DEC_WARPS + warp) * KPW + sg;
            key[u] = j;
            long long base = -1;
            if (j < c1) {
                if (PAGED) {
                    const int blk = block_table[(long long)b * max_blocks + (j >> block_log2)];
                    if (blk < 0 || blk >= num_blocks) {
                        bad_block = 1;
                    } else {
                        base = ((long long)blk * hkv + g) * head_stride +
                               (long long)(j & ((1 << block_log2) - 1)) * D;
                    }
                } else {
                    base = ((long long)b * hkv + g) * head_stride + (long long)j * D;
                }
            }
#pragma unroll
            for (int x = 0; x < VPL; ++x) {
                if (base >= 0) {
                    kv[u][x] = dec_ld(k + base + (x * LPK + sl) * 8);
                    vv4[u][x] = dec_ld(v + base + (x * LPK + sl) * 8);
                } else {
                    kv[u][x] = make_uint4(0, 0, 0, 0);
                    vv4[u][x] = make_uint4(0, 0, 0, 0);
                }
            }
            if (base < 0) key[u] = 0x7fffffff;  // masked for every row
        }
        // scores
        float sc[U][RB];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            float kf[8 * VPL];
#pragma unroll
            for (int x = 0; x < VPL; ++x) unpack8_as<S>(kv[u][x], &kf[x * 8]);
#pragma unroll
            for (int rr = 0; rr < RB; ++rr) {
                float s = 0.f;
#pragma unroll
                for (int e = 0; e < 8 * VPL; ++e) s = fmaf(qf[rr][e], kf[e], s);
#pragma unroll
                for (int o = LPK / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
                sc[u][rr] = key[u] < seen[rr] ? s : TANDEM_NEG_INF;
            }
        }
        // online softmax step per row, the max shared by the whole warp
#pragma unroll
        for (int rr = 0; rr < RB; ++rr) {
            float mx = sc[0][rr];
#pragma unroll
            for (int u = 1; u < U; ++u) mx = fmaxf(mx, sc[u][rr]);
#pragma unroll
            for (int o = 16; o >= LPK; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            const float m_new = fmaxf(m[rr], mx);
            if (m_new == TANDEM_NEG_INF) {
#pragma unroll
                for (int u = 0; u < U; ++u) sc[u][rr] = 0.f;
                continue;
            }
            const float corr = fast_exp2(m[rr] - m_new);
            m[rr] = m_new;
            float sum = 0.f;
#pragma unroll
            for (int u = 0; u < U; ++u) {
                sc[u][rr] = fast_exp2(sc[u][rr] - m_new);
                sum += sc[u][rr];
            }
            l[rr] = l[rr] * corr + sum;
#pragma unroll
            for (int e = 0; e < 8 * VPL; ++e) acc[rr][e] *= corr;
        }
        // P V
#pragma unroll
        for (int u = 0; u < U; ++u) {
            float vf[8 * VPL];
#pragma unroll
            for (int x = 0; x < VPL; ++x) unpack8_as<S>(vv4[u][x], &vf[x * 8]);
#pragma unroll
            for (int rr = 0; rr < RB; ++rr) {
#pragma unroll
                for (int e = 0; e < 8 * VPL; ++e) acc[rr][e] = fmaf(sc[u][rr], vf[e], acc[rr][e]);
            }
        }
    }

    // Sum the key subgroups of the warp (they share the warp's max), then merge the warps.
#pragma unroll
    for (int rr = 0; rr < RB; ++rr) {
#pragma unroll
        for (int o = 16; o >= LPK; o >>= 1) {
            l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], o);
#pragma unroll
            for (int e = 0; e < 8 * VPL; ++e)
                acc[rr][e] += __shfl_xor_sync(0xffffffffu, acc[rr][e], o);
        }
        if (sg == 0) {
#pragma unroll
            for (int x = 0; x < VPL; ++x)
#pragma unroll
                for (int e = 0; e < 8; ++e) s_acc[warp][rr][(x * LPK + sl) * 8 + e] = acc[rr][x * 8 + e];
            if (sl == 0) {
                s_m[warp][rr] = m[rr];
                s_l[warp][rr] = l[rr];
            }
        }
    }
    const int any_bad = __syncthreads_or(bad_block);
    if (any_bad) {
        write_const(DEC_NAN, DEC_NAN);
        return;
    }
    for (int idx = threadIdx.x; idx < RB * D; idx += DEC_THREADS) {
        const int rr = idx / D, d = idx % D, r = rg * RB + rr;
        if (r >= R) continue;
        float M = TANDEM_NEG_INF;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; ++w) M = fmaxf(M, s_m[w][rr]);
        float o = 0.f, L = 0.f;
        if (M != TANDEM_NEG_INF) {
#pragma unroll
            for (int w = 0; w < DEC_WARPS; ++w) {
                const float f = fast_exp2(s_m[w][rr] - M);
                o += f * s_acc[w][rr][d];
                L += f * s_l[w][rr];
            }
        }
        const long long row = (long long)(b * hkv + g) * R + r;
        const bool empty = L == 0.f;
        part_o[(row * chunks + chunk) * D + d] = empty ? 0.f : o / L;
        if (d == 0) part_lse[row * chunks + chunk] = empty ? TANDEM_NEG_INF : M + __log2f(L);
    }
}

// Pass 2: one block per query row (threads over the D columns).
template <typename S, int D>
__device__ __forceinline__ void decode_merge(const float* __restrict__ part_o,
                                             const float* __restrict__ part_lse,
                                             h16_t* __restrict__ o, float* __restrict__ lse,
                                             int chunks) {
    // Row ids follow the layout of o directly: (b * Hkv + g) * R + r = (b * Hq + h) * Nq + i.
    const long long row = blockIdx.x;
    const float* pl = part_lse + row * chunks;
    float M = TANDEM_NEG_INF;
    bool nan = false;
    for (int c = 0; c < chunks; ++c) {
        const float x = pl[c];
        nan |= x != x;
        M = fmaxf(M, x);
    }
    float L = 0.f;
    if (!nan && M != TANDEM_NEG_INF)
        for (int c = 0; c < chunks; ++c) L += fast_exp2(pl[c] - M);
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float acc = 0.f;
        if (!nan && L > 0.f) {
            for (int c = 0; c < chunks; ++c) {
                const float w = fast_exp2(pl[c] - M);
                if (w != 0.f) acc += w * part_o[(row * chunks + c) * D + d];
            }
            acc /= L;
        }
        o[row * D + d] = S::from_f(nan ? DEC_NAN : acc);
    }
    if (threadIdx.x == 0)
        lse[row] = nan ? DEC_NAN : (L > 0.f ? (M + __log2f(L)) * 0.69314718055994531f : TANDEM_NEG_INF);
}

#define DECODE_ENTRY(name, S, D, RB, PAGED)                                                      \
    extern "C" __global__ void __launch_bounds__(DEC_THREADS) name(                            \
        const h16_t* q, const h16_t* k, const h16_t* v, const int* seq_lens,                    \
        const int* block_table, float* part_o, float* part_lse, int hq, int hkv, int nq,        \
        int capacity, int block_log2, int max_blocks, int num_blocks, int chunk_len,            \
        float scale_log2) {                                                                     \
        decode_partial<S, D, RB, PAGED>(q, k, v, seq_lens, block_table, part_o, part_lse, hq,  \
                                        hkv, nq, capacity, block_log2, max_blocks, num_blocks,  \
                                        chunk_len, scale_log2);                                 \
    }

#define DECODE_MERGE_ENTRY(name, S, D)                                                        \
    extern "C" __global__ void __launch_bounds__(128) name(                                     \
        const float* part_o, const float* part_lse, h16_t* o, float* lse, int chunks) {         \
        decode_merge<S, D>(part_o, part_lse, o, lse, chunks);                                   \
    }

DECODE_ENTRY(attn_decode_bf16_d64_r1, BF16, 64, 1, false)
DECODE_ENTRY(attn_decode_bf16_d64_r2, BF16, 64, 2, false)
DECODE_ENTRY(attn_decode_bf16_d64_r4, BF16, 64, 4, false)
DECODE_ENTRY(attn_decode_bf16_d64_r8, BF16, 64, 8, false)
DECODE_ENTRY(attn_decode_paged_bf16_d64_r1, BF16, 64, 1, true)
DECODE_ENTRY(attn_decode_paged_bf16_d64_r2, BF16, 64, 2, true)
DECODE_ENTRY(attn_decode_paged_bf16_d64_r4, BF16, 64, 4, true)
DECODE_ENTRY(attn_decode_paged_bf16_d64_r8, BF16, 64, 8, true)
DECODE_MERGE_ENTRY(attn_decode_merge_bf16_d64, BF16, 64)
DECODE_ENTRY(attn_decode_bf16_d128_r1, BF16, 128, 1, false)
DECODE_ENTRY(attn_decode_bf16_d128_r2, BF16, 128, 2, false)
DECODE_ENTRY(attn_decode_bf16_d128_r4, BF16, 128, 4, false)
DECODE_ENTRY(attn_decode_bf16_d128_r8, BF16, 128, 8, false)
DECODE_ENTRY(attn_decode_paged_bf16_d128_r1, BF16, 128, 1, true)
DECODE_ENTRY(attn_decode_paged_bf16_d128_r2, BF16, 128, 2, true)
DECODE_ENTRY(attn_decode_paged_bf16_d128_r4, BF16, 128, 4, true)
DECODE_ENTRY(attn_decode_paged_bf16_d128_r8, BF16, 128, 8, true)
DECODE_MERGE_ENTRY(attn_decode_merge_bf16_d128, BF16, 128)
DECODE_ENTRY(attn_decode_bf16_d256_r1, BF16, 256, 1, false)
DECODE_ENTRY(attn_decode_bf16_d256_r2, BF16, 256, 2, false)
DECODE_ENTRY(attn_decode_bf16_d256_r4, BF16, 256, 4, false)
DECODE_ENTRY(attn_decode_bf16_d256_r8, BF16, 256, 8, false)
DECODE_ENTRY(attn_decode_paged_bf16_d256_r1, BF16, 256, 1, true)
DECODE_ENTRY(attn_decode_paged_bf16_d256_r2, BF16, 256, 2, true)
DECODE_ENTRY(attn_decode_paged_bf16_d256_r4, BF16, 256, 4, true)
DECODE_ENTRY(attn_decode_paged_bf16_d256_r8, BF16, 256, 8, true)
DECODE_MERGE_ENTRY(attn_decode_merge_bf16_d256, BF16, 256)
DECODE_ENTRY(attn_decode_f16_d64_r1, F16, 64, 1, false)
DECODE_ENTRY(attn_decode_f16_d64_r2, F16, 64, 2, false)
DECODE_ENTRY(attn_decode_f16_d64_r4, F16, 64, 4, false)
DECODE_ENTRY(attn_decode_f16_d64_r8, F16, 64, 8, false)
DECODE_ENTRY(attn_decode_paged_f16_d64_r1, F16, 64, 1, true)
DECODE_ENTRY(attn_decode_paged_f16_d64_r2, F16, 64, 2, true)
DECODE_ENTRY(attn_decode_paged_f16_d64_r4, F16, 64, 4, true)
DECODE_ENTRY(attn_decode_paged_f16_d64_r8, F16, 64, 8, true)
DECODE_MERGE_ENTRY(attn_decode_merge_f16_d64, F16, 64)
DECODE_ENTRY(attn_decode_f16_d128_r1, F16, 128, 1, false)
DECODE_ENTRY(attn_decode_f16_d128_r2, F16, 128, 2, false)
DECODE_ENTRY(attn_decode_f16_d128_r4, F16, 128, 4, false)
DECODE_ENTRY(attn_decode_f16_d128_r8, F16, 128, 8, false)
DECODE_ENTRY(attn_decode_paged_f16_d128_r1, F16, 128, 1, true)
DECODE_ENTRY(attn_decode_paged_f16_d128_r2, F16, 128, 2, true)
DECODE_ENTRY(attn_decode_paged_f16_d128_r4, F16, 128, 4, true)
DECODE_ENTRY(attn_decode_paged_f16_d128_r8, F16, 128, 8, true)
DECODE_MERGE_ENTRY(attn_decode_merge_f16_d128, F16, 128)
DECODE_ENTRY(attn_decode_f16_d256_r1, F16, 256, 1, false)
DECODE_ENTRY(attn_decode_f16_d256_r2, F16, 256, 2, false)
DECODE_ENTRY(attn_decode_f16_d256_r4, F16, 256, 4, false)
DECODE_ENTRY(attn_decode_f16_d256_r8, F16, 256, 8, false)
DECODE_ENTRY(attn_decode_paged_f16_d256_r1, F16, 256, 1, true)
DECODE_ENTRY(attn_decode_paged_f16_d256_r2, F16, 256, 2, true)
DECODE_ENTRY(attn_decode_paged_f16_d256_r4, F16, 256, 4, true)
DECODE_ENTRY(attn_decode_paged_f16_d256_r8, F16, 256, 8, true)
DECODE_MERGE_ENTRY(attn_decode_merge_f16_d256, F16, 256)
