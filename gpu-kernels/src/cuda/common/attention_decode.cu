// Decode attention (flash-decoding, split-KV) on any sm_80+ device, bf16 and f16 storage,
// f32 math. Nq (1..16) new queries per sequence against a KV cache, contiguous
// [B, Hkv, Nmax, D] or paged [num_blocks, Hkv, block_size, D] through a block table.
//
// Pass 1, decode_partial: grid (chunks, Hkv * row groups, B), DEC_WARPS warps per block. A
// block takes one chunk of one sequence's keys for one kv head, and up to RB query rows of
// that head's group (the Hq/Hkv query heads x Nq new queries, rows r = h * Nq + i), so each
// K/V byte of the chunk is read once per row group (once in all when the group has <= RB
// rows).
//
// K and V stream through a ring of NS stages of dynamic shared memory (DecGeom::TK keys of K
// then the same keys of V per stage, DEC_TILE_ELEMS elements each: by default 32 KB a stage,
// 4 stages (128 KB, one block a SM) contiguous and 3 (96 KB, two blocks a SM) paged; 16 KB and
// 4 stages for the heavy builds, see DEC_HEAVY), filled
// by cp.async.cg 16-byte copies, one commit group per tile, so NS - 1 tiles are in flight
// while the block computes on the oldest. Every thread
// copies CPT 16-byte vectors of K and the same of V per tile (consecutive threads take
// consecutive vectors: a warp copies 512 contiguous bytes per instruction); in the paged
// cache it reads the block-table entry of each of its keys once for both K and V, one tile
// ahead of the copies. Keys past the chunk are zero-filled (never read from global memory).
//
// Compute from shared memory. d64 and d128 on the tensor cores: each warp takes TK / 4 keys of
// a tile (32 or 16 by default), S = Q K^T on mma m16n8k16 with the group's query rows in the 16-row A
// operand (rows past RB zero, K through ldmatrix), then the online softmax of each row over
// the warp's keys in registers, and O += P V on m16n8k8 (P packed from S's registers, V
// through ldmatrix.trans); the ring's 16-byte chunks are swizzled (chunk c of key j at
// c ^ (j % 8)) so ldmatrix's rows fall in distinct banks. d256 (its accumulators would not
// fit the mma layout's registers) on CUDA cores: lanes split a key's D elements into 16-byte vectors (VPL per
// lane, LPK lanes per key, KPW = 32 / LPK keys per warp step, U steps per warp per tile).
// Either way each warp keeps an online softmax over its keys (scores in the log2 domain, the
// accumulator rescaled only when the warp's running max grows), then the block's warps are
// merged through shared memory (the drained ring) and the chunk's (o, lse) written to f32
// scratch.
//
// Pass 2, decode_merge: one block per query row combines the chunks' partials by their LSE
// and writes o in the storage precision and the natural-log LSE. With one chunk (o_out set)
// pass 1 writes those itself and there is no pass 2.
//
// Bad values never make a read outside the cache: a length outside nq..=capacity or a
// block id outside 0..num_blocks turns the sequence's partials into NaN, and the merge writes
// NaN for its rows.

#define DEC_WARPS 4
#define DEC_THREADS (32 * DEC_WARPS)
// The ring (DecodeRing in gpu-kernels/src/lib.rs): these defaults, or -D options. The paged
// kernels take their own stage count (their block-table reads want two blocks a SM).
#ifndef DEC_STAGES
#define DEC_STAGES 4
#endif
#ifndef DEC_PAGED_STAGES
#define DEC_PAGED_STAGES 3
#endif
#ifndef DEC_TILE_ELEMS
#define DEC_TILE_ELEMS 8192
#endif
#define DEC_MIN_STAGES (DEC_STAGES < DEC_PAGED_STAGES ? DEC_STAGES : DEC_PAGED_STAGES)
// Builds whose math is heavy for their bytes (8 query rows, or d 256 on the CUDA cores) keep a
// ring of 8 KB tiles and 4 stages (64 KB, so as many blocks a SM as their registers allow:
// they need the other blocks' warps to hide their math); the ring above is for the others.
#define DEC_HEAVY(D, RB) ((RB) == 8 || (D) == 256)
#define DEC_HEAVY_TILE_ELEMS 4096
#define DEC_HEAVY_STAGES 4
#define DEC_NAN __int_as_float(0x7fc00000)
// Blocks per SM the partial kernels are built for (registers <= 65536 / (128 * n)): 3 (<= 168
// registers, as many as 227 KB of shared memory holds) up to 4 rows, 2 for 8 rows.
#define DEC_MIN_BLOCKS(RB) ((RB) <= 4 ? 3 : 2)

// ---- ptx (gpu-kernels/emu/shim.h has CPU stand-ins of this section) ----
__device__ __forceinline__ void dec_cp_async16(void* smem, const void* gmem, bool pred) {
    const unsigned s = smem_addr(smem);
    const int n = pred ? 16 : 0;  // 0: nothing is read, 16 zero bytes are written
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n)
                 : "memory");
}
__device__ __forceinline__ void dec_cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void dec_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void dec_ldsm_x4(unsigned (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void dec_ldsm_x4_t(unsigned (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
// c += a b: m16n8k16 (S = Q K^T; a's rows 8..15 are zero: a1 = a3 = 0) and m16n8k8 (O += P V;
// a1 = 0), f32 accumulate, in storage S.
template <typename S>
__device__ __forceinline__ void dec_mma16(float (&c)[4], unsigned a0, unsigned a2, unsigned b0, unsigned b1);
template <>
__device__ __forceinline__ void dec_mma16<BF16>(float (&c)[4], unsigned a0, unsigned a2, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void dec_mma16<F16>(float (&c)[4], unsigned a0, unsigned a2, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}
template <typename S>
__device__ __forceinline__ void dec_mma8(float (&c)[4], unsigned a0, unsigned b0);
template <>
__device__ __forceinline__ void dec_mma8<BF16>(float (&c)[4], unsigned a0, unsigned b0) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(0u), "r"(b0));
}
template <>
__device__ __forceinline__ void dec_mma8<F16>(float (&c)[4], unsigned a0, unsigned b0) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(0u), "r"(b0));
}
// ---- end ptx ----

template <int D, int RB>
struct DecGeom {
    // 16-byte vectors per lane per key (at most 2): q and acc take 2 * RB * 8 * VPL registers
    // (<= 128)
    static constexpr int VPL0 = (8 / RB) < (D / 64) ? (8 / RB) : (D / 64);
    static constexpr int VPL1 = VPL0 < 2 ? VPL0 : 2;
    static constexpr int VPL = VPL1 < 1 ? 1 : VPL1;
    static constexpr int LPK = D / (8 * VPL);  // lanes per key
    static constexpr int KPW = 32 / LPK;       // keys per warp step
    static constexpr bool HEAVY = DEC_HEAVY(D, RB);
    static constexpr int TK = (HEAVY ? DEC_HEAVY_TILE_ELEMS : DEC_TILE_ELEMS) / D;  // keys per tile
    static constexpr int U = TK / (KPW * DEC_WARPS);     // warp steps per tile
    static constexpr int VPR = D / 8;                    // 16-byte vectors per key row
    static constexpr int CPT = TK * VPR / DEC_THREADS;   // K (and V) copies per thread per tile
    static constexpr int KSTEP = DEC_THREADS / VPR;      // keys between a thread's copies
    static constexpr int STAGE = 2 * TK * D;             // elements per stage (K, then V)
    // Tensor cores (d64, d128): each warp takes KW = TK / DEC_WARPS keys of a tile (a multiple
    // of 8) and runs S = Q K^T on mma m16n8k16 and O += P V on m16n8k8, the group's query rows
    // in the 16-row A operand (rows past RB zero). d256 keeps the CUDA-core path (its 32 x 4
    // accumulator registers a lane would not fit beside the rest). The ring's 16-byte chunks are swizzled (chunk c
    // of key row j at c ^ (j % 8)) so ldmatrix's eight rows fall in different banks.
    static constexpr bool TC = D == 64 || D == 128;
    static constexpr int KW = TK / DEC_WARPS;
    static __device__ __forceinline__ int chunk(int key, int c) { return TC ? c ^ (key & 7) : c; }
    static_assert(U >= 1 && TK % (KPW * DEC_WARPS) == 0, "tile not a whole number of warp steps");
    static_assert(CPT >= 1 && CPT * DEC_THREADS == TK * VPR, "tile not a whole number of copies");
    static_assert(!(D == 64 || D == 128) || (KSTEP % 8 == 0 && TK % (8 * DEC_WARPS) == 0),
                  "swizzle or warp key split off the 8-key grid");
    // the warps' merge reuses the ring: acc [DEC_WARPS][RB][D], m and l [DEC_WARPS][RB]
    static_assert(DEC_WARPS * RB * (D + 2) * 4 <= (HEAVY ? DEC_HEAVY_STAGES : DEC_MIN_STAGES) * STAGE * 2,
                  "merge does not fit");
};

// part_o: [rows_total, chunks, D] f32, part_lse: [rows_total, chunks] (log2 domain), where
// rows_total = B * Hq * Nq and row id = (b * Hkv + g) * R + r. Dynamic shared memory:
// NS * STAGE * 2 bytes (DecodeRing::smem_bytes).
template <typename S, int D, int RB, bool PAGED>
__device__ __forceinline__ void decode_partial(
    const h16_t* __restrict__ q, const h16_t* __restrict__ k, const h16_t* __restrict__ v,
    const int* __restrict__ seq_lens, const int* __restrict__ block_table,
    float* __restrict__ part_o, float* __restrict__ part_lse, h16_t* __restrict__ o_out,
    float* __restrict__ lse_out, int hq, int hkv, int nq, int capacity, int block_log2,
    int max_blocks, int num_blocks, int chunk_len, float scale_log2) {
    typedef DecGeom<D, RB> G;
    constexpr int VPL = G::VPL, LPK = G::LPK, KPW = G::KPW, U = G::U, TK = G::TK;
    constexpr int CPT = G::CPT, KSTEP = G::KSTEP, STAGE = G::STAGE;
    // stages of the ring
    constexpr int NS = G::HEAVY ? DEC_HEAVY_STAGES : PAGED ? DEC_PAGED_STAGES : DEC_STAGES;
    extern __shared__ __align__(16) unsigned char dec_smem[];
    h16_t* const ring = reinterpret_cast<h16_t*>(dec_smem);

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

    // One chunk (o_out set): the block's result is final, written as the merge would (o in
    // the storage precision, the LSE in natural log), and there is no merge.
    const bool direct = o_out != nullptr;
    // Writes (o, lse in the log2 domain) of element d of row `row` of this chunk.
    auto put = [&](long long row, int d, float o_val, float lse_val) {
        if (direct) {
            o_out[row * D + d] = S::from_f(o_val);
            if (d == 0) lse_out[row] = lse_val * 0.69314718055994531f;
        } else {
            part_o[(row * chunks + chunk) * D + d] = o_val;
            if (d == 0) part_lse[row * chunks + chunk] = lse_val;
        }
    };
    // Rows of this block: r = rg * RB + rr (valid while < R).
    auto write_const = [&](float o_val, float lse_val) {
        for (int idx = threadIdx.x; idx < RB * D; idx += DEC_THREADS) {
            const int rr = idx / D, d = idx % D, r = rg * RB + rr;
            if (r >= R) continue;
            put((long long)(b * hkv + g) * R + r, d, o_val, lse_val);
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

    // The copies of this thread: vector cv of keys ck + i * KSTEP of each tile.
    const int cv = threadIdx.x % G::VPR, ck = threadIdx.x / G::VPR;
    const int ntiles = (c1 - c0 + TK - 1) / TK;
    const int bmask = (1 << block_log2) - 1;
    // contiguous: this (b, g)'s rows; paged: element offset of (kv head g, vector cv) in a block
    const long long head_base = PAGED ? (long long)g * (bmask + 1) * D + cv * 8
                                      : ((long long)b * hkv + g) * capacity * D + cv * 8;
    const long long blk_stride = (long long)hkv * (bmask + 1) * D;
    const int* const table = block_table + (long long)b * max_blocks;
    int blk[CPT];  // paged: the physical block of each key this thread copies in the next tile
    int bad_block = 0;
    auto load_table = [&](int tile) {
#pragma unroll
        for (int i = 0; i < CPT; ++i) {
            const int j = c0 + tile * TK + ck + i * KSTEP;
            blk[i] = j < c1 ? table[j >> block_log2] : 0;
        }
    };
    // Tile `tile` into its stage (nothing past the chunk's tiles); one commit group per call.
    auto issue = [&](int tile) {
        if (tile < ntiles) {
            // every key this thread copies has the same key % 8 (KSTEP is a multiple of 8)
            h16_t* const sk = ring + (tile % NS) * STAGE + ck * D + G::chunk(ck, cv) * 8;
            h16_t* const sv = sk + TK * D;
#pragma unroll
            for (int i = 0; i < CPT; ++i) {
                const int j = c0 + tile * TK + ck + i * KSTEP;
                long long off = -1;
                if (j < c1) {
                    if (PAGED) {
                        if (blk[i] < 0 || blk[i] >= num_blocks)
                            bad_block = 1;
                        else
                            off = (long long)blk[i] * blk_stride + head_base +
                                  (long long)(j & bmask) * D;
                    } else {
                        off = head_base + (long long)j * D;
                    }
                }
                dec_cp_async16(sk + i * KSTEP * D, off >= 0 ? k + off : k, off >= 0);
                dec_cp_async16(sv + i * KSTEP * D, off >= 0 ? v + off : v, off >= 0);
            }
            if (PAGED) load_table(tile + 1);
        }
        dec_cp_async_commit();
    };
    if (PAGED) load_table(0);
#pragma unroll
    for (int s = 0; s < NS - 1; ++s) issue(s);

    // the warps' merge area, reusing the drained ring
    float* const s_acc = reinterpret_cast<float*>(dec_smem);  // [DEC_WARPS][RB][D]
    float* const s_m = s_acc + DEC_WARPS * RB * D;             // [DEC_WARPS][RB]
    float* const s_l = s_m + DEC_WARPS * RB;
    if constexpr (G::TC) {
        // Lane (gq, tq) of the mma layouts: row gq of the 16-row tile (the group's rows past
        // RB and R are zero), key/dim pairs 2 tq, 2 tq + 1.
        constexpr int KD = D / 16, ND = D / 8, NKT = G::KW / 8;
        const int gq = lane >> 2, tq = lane & 3;
        const int r = rg * RB + gq;
        const bool real = gq < RB && r < R;
        unsigned qa[KD][2];  // A of S: row gq, dims kk * 16 + 2 tq (+8)
        int seen = c1;       // keys below this are visible to row gq (padding rows: all)
        if (real) {
            const int h = g * (hq / hkv) + r / nq, i = r % nq;
            seen = min(len - nq + i + 1, c1);
            const h16_t* qp = q + (((long long)b * hq + h) * nq + i) * D;
#pragma unroll
            for (int kk = 0; kk < KD; ++kk) {
                qa[kk][0] = *reinterpret_cast<const unsigned*>(qp + kk * 16 + 2 * tq);
                qa[kk][1] = *reinterpret_cast<const unsigned*>(qp + kk * 16 + 8 + 2 * tq);
            }
        } else {
#pragma unroll
            for (int kk = 0; kk < KD; ++kk) qa[kk][0] = qa[kk][1] = 0u;
        }
        float acc[ND][4];
#pragma unroll
        for (int nt = 0; nt < ND; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
        float mr = TANDEM_NEG_INF, lr = 0.f;  // row gq's running max (log2 domain) and this lane's sum
        for (int t = 0; t < ntiles; ++t) {
            dec_cp_async_wait<NS - 2>();
            __syncthreads();
            issue(t + NS - 1);
            const h16_t* const sk = ring + (t % NS) * STAGE;
            const h16_t* const sv = sk + TK * D;
            const int kb = warp * G::KW;  // this warp's first key in the tile
            float sc[NKT][4];
#pragma unroll
            for (int kt = 0; kt < NKT; ++kt) {
                sc[kt][0] = sc[kt][1] = sc[kt][2] = sc[kt][3] = 0.f;
                const int key = kb + kt * 8 + (lane & 7);
#pragma unroll
                for (int kk = 0; kk < KD; kk += 2) {
                    unsigned bk[4];  // dims kk * 16 + [0, 32) of keys kb + kt * 8 + [0, 8)
                    dec_ldsm_x4(bk, sk + key * D + G::chunk(key, 2 * kk + (lane >> 3)) * 8);
                    dec_mma16<S>(sc[kt], qa[kk][0], qa[kk][1], bk[0], bk[1]);
                    dec_mma16<S>(sc[kt], qa[kk + 1][0], qa[kk + 1][1], bk[2], bk[3]);
                }
            }
            // row gq's softmax step over the warp's keys (c0, c1; c2, c3 are the zero rows)
            const int j0 = c0 + t * TK + kb + 2 * tq;
            float mx = TANDEM_NEG_INF;
#pragma unroll
            for (int kt = 0; kt < NKT; ++kt)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float x = j0 + kt * 8 + e < seen ? sc[kt][e] * scale_log2 : TANDEM_NEG_INF;
                    sc[kt][e] = x;
                    mx = fmaxf(mx, x);
                }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            unsigned pa[NKT];
            if (mx == TANDEM_NEG_INF) {  // no key of this step for this row
#pragma unroll
                for (int kt = 0; kt < NKT; ++kt) pa[kt] = 0u;
            } else {
                if (mx > mr) {
                    const float corr = fast_exp2(mr - mx);
                    mr = mx;
                    lr *= corr;
#pragma unroll
                    for (int nt = 0; nt < ND; ++nt) {
                        acc[nt][0] *= corr;
                        acc[nt][1] *= corr;
                    }
                }
#pragma unroll
                for (int kt = 0; kt < NKT; ++kt) {
                    const float p0 = fast_exp2(sc[kt][0] - mr), p1 = fast_exp2(sc[kt][1] - mr);
                    lr += p0 + p1;
                    pa[kt] = S::pack2(p0, p1);
                }
            }
            // O += P V: keys kb + kt * 8 + [0, 8) x dims nc * 8 + [0, 32)
#pragma unroll
            for (int kt = 0; kt < NKT; ++kt) {
                const int key = kb + kt * 8 + (lane & 7);
#pragma unroll
                for (int nc = 0; nc < ND; nc += 4) {
                    unsigned bv[4];
                    dec_ldsm_x4_t(bv, sv + key * D + G::chunk(key, nc + (lane >> 3)) * 8);
#pragma unroll
                    for (int x = 0; x < 4; ++x) dec_mma8<S>(acc[nc + x], pa[kt], bv[x]);
                }
            }
        }
        dec_cp_async_wait<0>();  // only empty groups can remain
        lr += __shfl_xor_sync(0xffffffffu, lr, 1);
        lr += __shfl_xor_sync(0xffffffffu, lr, 2);
        const int any_bad = __syncthreads_or(bad_block);
        if (any_bad) {
            write_const(DEC_NAN, DEC_NAN);
            return;
        }
        if (gq < RB) {
#pragma unroll
            for (int nt = 0; nt < ND; ++nt) {
                s_acc[(warp * RB + gq) * D + nt * 8 + 2 * tq] = acc[nt][0];
                s_acc[(warp * RB + gq) * D + nt * 8 + 2 * tq + 1] = acc[nt][1];
            }
            if (tq == 0) {
                s_m[warp * RB + gq] = mr;
                s_l[warp * RB + gq] = lr;
            }
        }
    } else {
        // This lane's q values (scaled into the log2 domain) and the keys each row sees.
        float qf[RB][8 * VPL];
        int seen[RB];
    #pragma unroll
        for (int rr = 0; rr < RB; ++rr) {
            const int r = rg * RB + rr;
            if (r < R) {
                const int h = g * (hq / hkv) + r / nq, i = r % nq;
                seen[rr] = min(len - nq + i + 1, c1);
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

        for (int t = 0; t < ntiles; ++t) {
            // Tile t has landed (this thread's copies; the barrier makes everyone's visible), and
            // every warp is done with tile t - 1, whose stage the next issue refills.
            dec_cp_async_wait<NS - 2>();
            __syncthreads();
            issue(t + NS - 1);
            const h16_t* const sk = ring + (t % NS) * STAGE;
            const h16_t* const sv = sk + TK * D;
            const int t0 = c0 + t * TK;
            // scores
            float sc[U][RB];
    #pragma unroll
            for (int u = 0; u < U; ++u) {
                const int kt = (u * DEC_WARPS + warp) * KPW + sg;
                const int j = t0 + kt;
                float kf[8 * VPL];
    #pragma unroll
                for (int x = 0; x < VPL; ++x)
                    unpack8_as<S>(*reinterpret_cast<const uint4*>(sk + kt * D + (x * LPK + sl) * 8),
                                  &kf[x * 8]);
    #pragma unroll
                for (int rr = 0; rr < RB; ++rr) {
                    float s = 0.f;
    #pragma unroll
                    for (int e = 0; e < 8 * VPL; ++e) s = fmaf(qf[rr][e], kf[e], s);
    #pragma unroll
                    for (int o = LPK / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
                    sc[u][rr] = j < seen[rr] ? s : TANDEM_NEG_INF;
                }
            }
            // online softmax step per row, the max shared by the whole warp (so is the branch)
    #pragma unroll
            for (int rr = 0; rr < RB; ++rr) {
                float mx = sc[0][rr];
    #pragma unroll
                for (int u = 1; u < U; ++u) mx = fmaxf(mx, sc[u][rr]);
    #pragma unroll
                for (int o = 16; o >= LPK; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
                if (mx == TANDEM_NEG_INF) {  // no key of this step for this row
    #pragma unroll
                    for (int u = 0; u < U; ++u) sc[u][rr] = 0.f;
                    continue;
                }
                if (mx > m[rr]) {
                    const float corr = fast_exp2(m[rr] - mx);
                    m[rr] = mx;
                    l[rr] *= corr;
    #pragma unroll
                    for (int e = 0; e < 8 * VPL; ++e) acc[rr][e] *= corr;
                }
                float sum = 0.f;
    #pragma unroll
                for (int u = 0; u < U; ++u) {
                    sc[u][rr] = fast_exp2(sc[u][rr] - m[rr]);
                    sum += sc[u][rr];
                }
                l[rr] += sum;
            }
            // P V
    #pragma unroll
            for (int u = 0; u < U; ++u) {
                const int kt = (u * DEC_WARPS + warp) * KPW + sg;
                float vf[8 * VPL];
    #pragma unroll
                for (int x = 0; x < VPL; ++x)
                    unpack8_as<S>(*reinterpret_cast<const uint4*>(sv + kt * D + (x * LPK + sl) * 8),
                                  &vf[x * 8]);
    #pragma unroll
                for (int rr = 0; rr < RB; ++rr) {
    #pragma unroll
                    for (int e = 0; e < 8 * VPL; ++e) acc[rr][e] = fmaf(sc[u][rr], vf[e], acc[rr][e]);
                }
            }
        }
        dec_cp_async_wait<0>();  // only empty groups can remain

        // Sum the key subgroups of the warp (they share the warp's max), then merge the warps
        // through the ring, once every warp is done with it.
    #pragma unroll
        for (int rr = 0; rr < RB; ++rr) {
    #pragma unroll
            for (int o = 16; o >= LPK; o >>= 1) {
                l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], o);
    #pragma unroll
                for (int e = 0; e < 8 * VPL; ++e)
                    acc[rr][e] += __shfl_xor_sync(0xffffffffu, acc[rr][e], o);
            }
        }
        const int any_bad = __syncthreads_or(bad_block);
        if (any_bad) {
            write_const(DEC_NAN, DEC_NAN);
            return;
        }
    #pragma unroll
        for (int rr = 0; rr < RB; ++rr) {
            if (sg == 0) {
    #pragma unroll
                for (int x = 0; x < VPL; ++x)
    #pragma unroll
                    for (int e = 0; e < 8; ++e)
                        s_acc[(warp * RB + rr) * D + (x * LPK + sl) * 8 + e] = acc[rr][x * 8 + e];
                if (sl == 0) {
                    s_m[warp * RB + rr] = m[rr];
                    s_l[warp * RB + rr] = l[rr];
                }
            }
        }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < RB * D; idx += DEC_THREADS) {
        const int rr = idx / D, d = idx % D, r = rg * RB + rr;
        if (r >= R) continue;
        float M = TANDEM_NEG_INF;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; ++w) M = fmaxf(M, s_m[w * RB + rr]);
        float o = 0.f, L = 0.f;
        if (M != TANDEM_NEG_INF) {
#pragma unroll
            for (int w = 0; w < DEC_WARPS; ++w) {
                const float f = fast_exp2(s_m[w * RB + rr] - M);
                o += f * s_acc[(w * RB + rr) * D + d];
                L += f * s_l[w * RB + rr];
            }
        }
        const bool empty = L == 0.f;
        put((long long)(b * hkv + g) * R + r, d, empty ? 0.f : o / L,
            empty ? TANDEM_NEG_INF : M + __log2f(L));
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
    extern "C" __global__ void __launch_bounds__(DEC_THREADS, DEC_MIN_BLOCKS(RB)) name(      \
        const h16_t* q, const h16_t* k, const h16_t* v, const int* seq_lens,                    \
        const int* block_table, float* part_o, float* part_lse, h16_t* o_out, float* lse_out,   \
        int hq, int hkv, int nq, int capacity, int block_log2, int max_blocks, int num_blocks,  \
        int chunk_len, float scale_log2) {                                                      \
        decode_partial<S, D, RB, PAGED>(q, k, v, seq_lens, block_table, part_o, part_lse,      \
                                        o_out, lse_out, hq, hkv, nq, capacity, block_log2,      \
                                        max_blocks, num_blocks, chunk_len, scale_log2);         \
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
