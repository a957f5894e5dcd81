// Decode attention (flash-decoding, split-KV) on any sm_80+ device, bf16 and f16 storage,
// f32 math. Nq (1..16) new queries per sequence against a KV cache, contiguous
// [B, Hkv, Nmax, D] or paged [num_blocks, Hkv, block_size, D] through a block table.
//
// One kernel, a persistent grid (as many blocks as the device holds at once), DEC_WARPS warps
// a block. The work is a line of tiles (TK keys each): every (sequence, kv head, row group)
// pair's tiles, pair after pair. A row group is up to RB query rows of one kv head's group
// (the Hq/Hkv query heads x Nq new queries, rows r = h * Nq + i), so each K/V byte is read
// once per row group (once in all when the group has <= RB rows). The line is cut evenly:
// every block streams the same number of tiles, so the grid ends together whatever the
// lengths (dec_locate finds a block's share from the sequence lengths on the device). A
// block's share crosses pairs; where a pair ends it finishes its piece (dec_finish): a pair
// held whole by one block writes o and the LSE at once, a pair cut over blocks leaves each
// piece's (o, lse) in f32 scratch and the last piece to arrive merges them by their LSE.
//
// K and V stream through a ring of DEC_STAGES stages of dynamic shared memory (DecGeom::TK
// keys of K then the same keys of V per stage, DEC_TILE_ELEMS elements each: 16 KB a stage,
// 64 KB a block), filled by cp.async.cg 16-byte copies, one commit group per tile, so
// DEC_STAGES - 1 tiles are in flight while the block computes on the oldest; the ring runs on
// across pairs, so a block never drains it before its share ends. Every thread copies CPT
// 16-byte vectors of K and the same of V per tile (consecutive threads take consecutive
// vectors: a warp copies 512 contiguous bytes per instruction); in the paged cache it reads
// the block-table entry of each of its keys once for both K and V, one tile ahead of the
// copies. Keys past the sequence are zero-filled (never read from global memory).
//
// Compute from shared memory. d64 and d128 on the tensor cores (DecMathTC): each warp takes
// TK / 4 keys of a tile (16 or 8), S = Q K^T on mma m16n8k16 with the group's query rows in the
// 16-row A operand (rows past RB zero, K through ldmatrix), then the online softmax of each row
// over the warp's keys in registers, and O += P V on m16n8k8 (P packed from S's registers, V
// through ldmatrix.trans); the ring's 16-byte chunks are swizzled (chunk c of key j at
// c ^ (j % 8)) so ldmatrix's rows fall in distinct banks. d256 (16 keys a tile, 4 a warp,
// below mma's 8) on CUDA cores (DecMathCC): lanes split a key's D elements into 16-byte
// vectors (VPL per lane, LPK lanes per key, KPW = 32 / LPK keys per warp step, U steps per warp
// per tile). Either way each warp keeps an online softmax over its keys (scores in the log2
// domain, the accumulator rescaled only when the warp's running max grows); at a piece's end
// the block's warps are merged through a merge area of shared memory beside the ring.
//
// Bad values never make a read outside the cache: a length outside nq..=capacity or a
// block id outside 0..num_blocks turns the sequence's rows into NaN.

#define DEC_WARPS 4
#define DEC_THREADS (32 * DEC_WARPS)
#define DEC_STAGES 4
#define DEC_TILE_ELEMS 4096
#define DEC_NAN __int_as_float(0x7fc00000)
// The ring's bytes, then a header of ints (stage flags, the block's share, the merge flag).
#define DEC_RING_BYTES (DEC_STAGES * DEC_TILE_ELEMS * 2 * 2)
#define DEC_HDR_BYTES 64
// Blocks per SM the kernels are built for (registers <= 65536 / (128 * n)): 3 (<= 168
// registers) where three blocks' shared memory (ring, header, merge area) fits 227 KB, that is
// up to 4 rows and D * RB <= 512; else 2.
#define DEC_MIN_BLOCKS(D, RB) ((RB) <= 4 && (D) * (RB) <= 512 ? 3 : 2)

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
    static constexpr int TK = DEC_TILE_ELEMS / D;        // keys per tile (stage)
    static constexpr int U = TK / (KPW * DEC_WARPS);     // warp steps per tile
    static constexpr int VPR = D / 8;                    // 16-byte vectors per key row
    static constexpr int CPT = TK * VPR / DEC_THREADS;   // K (and V) copies per thread per tile
    static constexpr int KSTEP = DEC_THREADS / VPR;      // keys between a thread's copies
    static constexpr int STAGE = 2 * TK * D;             // elements per stage (K, then V)
    // Tensor cores (d64, d128): each warp takes KW = TK / DEC_WARPS keys of a tile (16 or 8)
    // and runs S = Q K^T on mma m16n8k16 and O += P V on m16n8k8, the group's query rows in
    // the 16-row A operand (rows past RB zero). d256's tiles hold 16 keys, 4 a warp, below
    // mma's 8: it keeps the CUDA-core path. The ring's 16-byte chunks are swizzled (chunk c
    // of key row j at c ^ (j % 8)) so ldmatrix's eight rows fall in different banks.
    static constexpr bool TC = D == 64 || D == 128;
    static constexpr int KW = TK / DEC_WARPS;
    static __device__ __forceinline__ int chunk(int key, int c) { return TC ? c ^ (key & 7) : c; }
    static_assert(U >= 1 && TK % (KPW * DEC_WARPS) == 0, "tile not a whole number of warp steps");
    static_assert(CPT >= 1 && CPT * DEC_THREADS == TK * VPR, "tile not a whole number of copies");
    static_assert(!(D == 64 || D == 128) || (KSTEP % 8 == 0 && TK % (8 * DEC_WARPS) == 0),
                  "swizzle or warp key split off the 8-key grid");
    static_assert(DEC_STAGES * STAGE * 2 == DEC_RING_BYTES, "ring size");
    // the warps' merge area after the ring and header: acc [DEC_WARPS][RB][D], m and l
    // [DEC_WARPS][RB]
    static constexpr int MERGE_BYTES = DEC_WARPS * RB * (D + 2) * 4;
};

// ---- the work: the pairs' tiles laid end to end, cut evenly over the grid ----
//
// Pair p = (b * hkv + g) * rgroups + rg (sequence b, kv head g, row group rg) holds its
// sequence's n_b = ceil(len_b / TK) tiles, one tile where len_b is bad (its rows come out
// NaN). Laid end to end the pairs make a line of total = H * sum_b n_b tiles (H = hkv *
// rgroups); block blk takes tiles [blk * w, blk * w + w) of it, where w = max(ceil(total /
// blocks), ceil(cap_tiles / (parts - 1))), so every block streams the same number of tiles
// and a pair is cut into at most `parts` pieces (one per block it meets).

// The launch's arguments, and the row counts they imply.
struct DecProblem {
    const h16_t* q;
    const h16_t* k;
    const h16_t* v;
    const int* seq_lens;
    const int* table;
    float* part_o;
    float* part_lse;
    h16_t* o;
    float* lse;
    int* counters;
    int nb, hq, hkv, nq, capacity, block_log2, max_blocks, num_blocks, parts;
    float scale_log2;
    int R;        // query rows per kv head: hq / hkv * nq
    int rgroups;  // row groups per kv head: ceil(R / RB)
};

// Tiles of a sequence of length len (one for a bad length).
__device__ __forceinline__ int dec_tiles(int len, int nq, int capacity, int tk) {
    return len < nq || len > capacity ? 1 : (len + tk - 1) / tk;
}

// One tile of the line: its pair and the pair's sequence.
struct DecCursor {
    int p, tp;  // pair, tile within the pair
    int n;      // tiles of the pair
    int len;    // keys of the sequence (0 for a bad length)
    int b, g, rg;
    bool bad;   // the sequence's length is outside nq..=capacity
};

template <int TK>
__device__ __forceinline__ void dec_at(DecCursor& c, const DecProblem& P, int p, int tp) {
    c.p = p;
    c.tp = tp;
    c.b = p / (P.hkv * P.rgroups);
    c.g = p / P.rgroups % P.hkv;
    c.rg = p % P.rgroups;
    const int l = c.b < P.nb ? P.seq_lens[c.b] : 0;  // past the last pair: a bad one, never read
    c.bad = l < P.nq || l > P.capacity;
    c.len = c.bad ? 0 : l;
    c.n = dec_tiles(l, P.nq, P.capacity, TK);
}
template <int TK>
__device__ __forceinline__ void dec_next(DecCursor& c, const DecProblem& P) {
    if (++c.tp == c.n) dec_at<TK>(c, P, c.p + 1, 0);
}

// The block's share of the line, found by warp 0 and left in the header of shared memory:
// hdr[5] its first pair, hdr[6] that pair's first tile it takes, hdr[7] its tiles (0: none),
// hdr[8] w.
template <int TK>
__device__ __forceinline__ void dec_locate(const DecProblem& P, int* hdr) {
    const int lane = threadIdx.x & 31;
    const int H = P.hkv * P.rgroups;
    int sum = 0;  // sum of n_b
    for (int b0 = 0; b0 < P.nb; b0 += 32) {
        const int b = b0 + lane;
        int n = b < P.nb ? dec_tiles(P.seq_lens[b], P.nq, P.capacity, TK) : 0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) n += __shfl_xor_sync(0xffffffffu, n, o);
        sum += n;
    }
    const int total = H * sum;
    const int cap_tiles = (P.capacity + TK - 1) / TK;
    const int blocks = gridDim.x;
    const int w = max((total + blocks - 1) / blocks, (cap_tiles + P.parts - 2) / (P.parts - 1));
    const int s = blockIdx.x * w;
    int base = 0;  // sum of n_b over the chunks before
    for (int b0 = 0; b0 < P.nb && s < total; b0 += 32) {
        const int b = b0 + lane;
        const int n = b < P.nb ? dec_tiles(P.seq_lens[b], P.nq, P.capacity, TK) : 0;
        int incl = n;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += y;
        }
        const int lo = H * (base + incl - n), hi = H * (base + incl);
        if (n > 0 && lo <= s && s < hi) {
            hdr[5] = b * H + (s - lo) / n;
            hdr[6] = (s - lo) % n;
        }
        base += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0) {
        hdr[7] = s < total ? min(w, total - s) : 0;
        hdr[8] = w;
    }
}

// ---- the math of one row group over a stream of tiles ----

// d64 and d128 on the tensor cores: lane (gq, tq) of the mma layouts holds row gq of the
// 16-row tile (the group's rows past RB and R are zero), key/dim pairs 2 tq, 2 tq + 1.
template <typename S, int D, int RB>
struct DecMathTC {
    typedef DecGeom<D, RB> G;
    static constexpr int KD = D / 16, ND = D / 8, NKT = G::KW / 8;
    unsigned qa[KD][2];  // A of S: row gq, dims kk * 16 + 2 tq (+8)
    float acc[ND][4];
    float mr, lr;  // row gq's running max (log2 domain) and this lane's sum
    int seen;      // keys below this are visible to row gq (padding rows: all)

    __device__ __forceinline__ void begin(const DecProblem& P, const DecCursor& c, int lane) {
        const int gq = lane >> 2, tq = lane & 3;
        const int r = c.rg * RB + gq;
        seen = c.len;
        if (gq < RB && r < P.R) {
            const int h = c.g * (P.hq / P.hkv) + r / P.nq, i = r % P.nq;
            seen = min(c.len - P.nq + i + 1, c.len);
            const h16_t* qp = P.q + (((long long)c.b * P.hq + h) * P.nq + i) * D;
#pragma unroll
            for (int kk = 0; kk < KD; ++kk) {
                qa[kk][0] = *reinterpret_cast<const unsigned*>(qp + kk * 16 + 2 * tq);
                qa[kk][1] = *reinterpret_cast<const unsigned*>(qp + kk * 16 + 8 + 2 * tq);
            }
        } else {
#pragma unroll
            for (int kk = 0; kk < KD; ++kk) qa[kk][0] = qa[kk][1] = 0u;
        }
#pragma unroll
        for (int nt = 0; nt < ND; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
        mr = TANDEM_NEG_INF;
        lr = 0.f;
    }

    // One tile: keys key0 + [0, TK) of the sequence in sk / sv; each warp takes KW of them.
    __device__ __forceinline__ void step(const h16_t* sk, const h16_t* sv, int key0, float scale_log2,
                                         int warp, int lane) {
        const int tq = lane & 3;
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
        const int j0 = key0 + kb + 2 * tq;
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

    // The warp's (acc, max, sum) of its rows into the merge area.
    __device__ __forceinline__ void stash(float* s_acc, float* s_m, float* s_l, int warp, int lane) {
        const int gq = lane >> 2, tq = lane & 3;
        lr += __shfl_xor_sync(0xffffffffu, lr, 1);
        lr += __shfl_xor_sync(0xffffffffu, lr, 2);
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
    }
};

// d256 on CUDA cores: lanes split a key's D elements into 16-byte vectors (VPL per lane, LPK
// lanes per key, KPW keys per warp step, U steps per warp per tile).
template <typename S, int D, int RB>
struct DecMathCC {
    typedef DecGeom<D, RB> G;
    static constexpr int VPL = G::VPL, LPK = G::LPK, KPW = G::KPW, U = G::U;
    float qf[RB][8 * VPL];  // this lane's q values, scaled into the log2 domain
    float acc[RB][8 * VPL];
    float m[RB], l[RB];
    int seen[RB];

    __device__ __forceinline__ void begin(const DecProblem& P, const DecCursor& c, int lane) {
        const int sl = lane % LPK;
#pragma unroll
        for (int rr = 0; rr < RB; ++rr) {
            const int r = c.rg * RB + rr;
            if (r < P.R) {
                const int h = c.g * (P.hq / P.hkv) + r / P.nq, i = r % P.nq;
                seen[rr] = min(c.len - P.nq + i + 1, c.len);
                const h16_t* qp = P.q + (((long long)c.b * P.hq + h) * P.nq + i) * D;
#pragma unroll
                for (int vv = 0; vv < VPL; ++vv) {
                    const uint4 w = *reinterpret_cast<const uint4*>(qp + (vv * LPK + sl) * 8);
                    unpack8_as<S>(w, &qf[rr][vv * 8]);
#pragma unroll
                    for (int e = 0; e < 8; ++e) qf[rr][vv * 8 + e] *= P.scale_log2;
                }
            } else {
                seen[rr] = 0;
#pragma unroll
                for (int e = 0; e < 8 * VPL; ++e) qf[rr][e] = 0.f;
            }
            m[rr] = TANDEM_NEG_INF;
            l[rr] = 0.f;
#pragma unroll
            for (int e = 0; e < 8 * VPL; ++e) acc[rr][e] = 0.f;
        }
    }

    __device__ __forceinline__ void step(const h16_t* sk, const h16_t* sv, int key0, float,
                                         int warp, int lane) {
        const int sg = lane / LPK, sl = lane % LPK;
        // scores
        float sc[U][RB];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int kt = (u * DEC_WARPS + warp) * KPW + sg;
            const int j = key0 + kt;
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

    // Sums the warp's key subgroups (they share the warp's max), then stashes them.
    __device__ __forceinline__ void stash(float* s_acc, float* s_m, float* s_l, int warp, int lane) {
        const int sg = lane / LPK, sl = lane % LPK;
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
                    for (int e = 0; e < 8; ++e)
                        s_acc[(warp * RB + rr) * D + (x * LPK + sl) * 8 + e] = acc[rr][x * 8 + e];
                if (sl == 0) {
                    s_m[warp * RB + rr] = m[rr];
                    s_l[warp * RB + rr] = l[rr];
                }
            }
        }
    }
};

template <typename S, int D, int RB, bool TC = DecGeom<D, RB>::TC>
struct DecMathOf {
    typedef DecMathTC<S, D, RB> T;
};
template <typename S, int D, int RB>
struct DecMathOf<S, D, RB, false> {
    typedef DecMathCC<S, D, RB> T;
};

// ---- one kernel: stream the block's tiles, finish each piece of a pair as it ends ----

// The end of a piece of pair c.p (its first tile is tile F of the line): the warps' stashes are
// merged; a pair in one piece writes o and lse; otherwise the piece goes to part_o / part_lse
// (slot blk - F / w) and the last piece to arrive (counters[p]) merges them all by their LSE,
// writes o and lse, and resets the counter for the next launch.
template <typename S, int D, int RB>
__device__ __forceinline__ void dec_finish(const DecProblem& P, const DecCursor& c, bool bad, int F, int w,
                                           const float* s_acc, const float* s_m, const float* s_l,
                                           int* hdr) {
    const int first = F / w, nparts = (F + c.n - 1) / w - first + 1, slot = blockIdx.x - first;
    for (int idx = threadIdx.x; idx < RB * D; idx += DEC_THREADS) {
        const int rr = idx / D, d = idx % D, r = c.rg * RB + rr;
        if (r >= P.R) continue;
        float M = TANDEM_NEG_INF;
#pragma unroll
        for (int wp = 0; wp < DEC_WARPS; ++wp) M = fmaxf(M, s_m[wp * RB + rr]);
        float o = 0.f, L = 0.f;
        if (M != TANDEM_NEG_INF) {
#pragma unroll
            for (int wp = 0; wp < DEC_WARPS; ++wp) {
                const float f = fast_exp2(s_m[wp * RB + rr] - M);
                o += f * s_acc[(wp * RB + rr) * D + d];
                L += f * s_l[wp * RB + rr];
            }
        }
        const long long row = ((long long)c.b * P.hkv + c.g) * P.R + r;
        const bool empty = L == 0.f;
        if (nparts == 1) {
            P.o[row * D + d] = S::from_f(bad ? DEC_NAN : empty ? 0.f : o / L);
            if (d == 0)
                P.lse[row] = bad ? DEC_NAN : empty ? TANDEM_NEG_INF : (M + __log2f(L)) * 0.69314718055994531f;
        } else {
            P.part_o[(row * P.parts + slot) * D + d] = bad ? DEC_NAN : empty ? 0.f : o / L;
            if (d == 0) P.part_lse[row * P.parts + slot] = bad ? DEC_NAN : empty ? TANDEM_NEG_INF : M + __log2f(L);
        }
    }
    if (nparts == 1) return;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) hdr[4] = atomicAdd(P.counters + c.p, 1) == nparts - 1;
    __syncthreads();
    if (!hdr[4]) return;
    __threadfence();
    for (int idx = threadIdx.x; idx < RB * D; idx += DEC_THREADS) {
        const int rr = idx / D, d = idx % D, r = c.rg * RB + rr;
        if (r >= P.R) continue;
        const long long row = ((long long)c.b * P.hkv + c.g) * P.R + r;
        const float* pl = P.part_lse + row * P.parts;
        float M = TANDEM_NEG_INF;
        bool nan = false;
        for (int j = 0; j < nparts; ++j) {
            const float x = __ldcg(pl + j);
            nan |= x != x;
            M = fmaxf(M, x);
        }
        float L = 0.f, acc = 0.f;
        if (!nan && M != TANDEM_NEG_INF)
            for (int j = 0; j < nparts; ++j) {
                const float f = fast_exp2(__ldcg(pl + j) - M);
                L += f;
                if (f != 0.f) acc += f * __ldcg(P.part_o + (row * P.parts + j) * D + d);
            }
        P.o[row * D + d] = S::from_f(nan ? DEC_NAN : L > 0.f ? acc / L : 0.f);
        if (d == 0)
            P.lse[row] = nan ? DEC_NAN : L > 0.f ? (M + __log2f(L)) * 0.69314718055994531f : TANDEM_NEG_INF;
    }
    if (threadIdx.x == 0) P.counters[c.p] = 0;
}

// part_o: [rows_total, parts, D] f32, part_lse: [rows_total, parts] (log2 domain), counters:
// [pairs] ints, zero before the launch (and after it), where rows_total = B * Hq * Nq and row
// id = (b * Hkv + g) * R + r = (b * Hq + h) * Nq + i (the layout of o). Dynamic shared memory:
// the ring (DEC_RING_BYTES), a 64-byte header, the warps' merge area (DecGeom::MERGE_BYTES).
template <typename S, int D, int RB, bool PAGED>
__device__ __forceinline__ void decode_stream(const DecProblem& P) {
    typedef DecGeom<D, RB> G;
    typedef typename DecMathOf<S, D, RB>::T Math;
    constexpr int TK = G::TK, CPT = G::CPT, KSTEP = G::KSTEP, STAGE = G::STAGE;
    extern __shared__ __align__(16) unsigned char dec_smem[];
    h16_t* const ring = reinterpret_cast<h16_t*>(dec_smem);
    // hdr[0..DEC_STAGES): the tile + 1 whose copies met a bad block id, per stage; hdr[4]: this
    // block merges the pair; hdr[5..9): dec_locate
    int* const hdr = reinterpret_cast<int*>(dec_smem + DEC_RING_BYTES);
    float* const s_acc = reinterpret_cast<float*>(dec_smem + DEC_RING_BYTES + DEC_HDR_BYTES);
    float* const s_m = s_acc + DEC_WARPS * RB * D;  // [DEC_WARPS][RB][D], then m, l [DEC_WARPS][RB]
    float* const s_l = s_m + DEC_WARPS * RB;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

    if (warp == 0) dec_locate<TK>(P, hdr);
    if (threadIdx.x < DEC_STAGES) hdr[threadIdx.x] = 0;
    __syncthreads();
    const int my_tiles = hdr[7], w = hdr[8];
    if (my_tiles == 0) return;
    const int s0 = blockIdx.x * w;  // the block's first tile on the line
    DecCursor ic, cc;               // the tile to issue next, the tile to compute next
    dec_at<TK>(ic, P, hdr[5], hdr[6]);
    cc = ic;

    // The copies of this thread: vector cv of keys ck + i * KSTEP of each tile.
    const int cv = threadIdx.x % G::VPR, ck = threadIdx.x / G::VPR;
    const int bmask = (1 << P.block_log2) - 1;
    const long long blk_stride = (long long)P.hkv * (bmask + 1) * D;
    int blk[CPT];  // paged: the physical block of each key this thread copies in tile ic
    auto load_table = [&]() {
        const int* const table = P.table + (long long)ic.b * P.max_blocks;
#pragma unroll
        for (int i = 0; i < CPT; ++i) {
            const int j = ic.tp * TK + ck + i * KSTEP;
            blk[i] = j < ic.len ? table[j >> P.block_log2] : 0;
        }
    };
    // Tile ic into its stage (nothing past the block's tiles); one commit group per call.
    int issued = 0;
    auto issue = [&]() {
        if (issued < my_tiles) {
            const int st = issued % DEC_STAGES;
            // every key this thread copies has the same key % 8 (KSTEP is a multiple of 8)
            h16_t* const sk = ring + st * STAGE + ck * D + G::chunk(ck, cv) * 8;
            h16_t* const sv = sk + TK * D;
            // contiguous: this (b, g)'s rows; paged: element offset of (kv head g, vector cv) in a block
            const long long head = PAGED ? (long long)ic.g * (bmask + 1) * D + cv * 8
                                         : ((long long)ic.b * P.hkv + ic.g) * P.capacity * D + cv * 8;
            bool bad = false;
#pragma unroll
            for (int i = 0; i < CPT; ++i) {
                const int j = ic.tp * TK + ck + i * KSTEP;
                long long off = -1;
                if (j < ic.len) {
                    if (PAGED) {
                        if (blk[i] < 0 || blk[i] >= P.num_blocks)
                            bad = true;
                        else
                            off = (long long)blk[i] * blk_stride + head + (long long)(j & bmask) * D;
                    } else {
                        off = head + (long long)j * D;
                    }
                }
                dec_cp_async16(sk + i * KSTEP * D, off >= 0 ? P.k + off : P.k, off >= 0);
                dec_cp_async16(sv + i * KSTEP * D, off >= 0 ? P.v + off : P.v, off >= 0);
            }
            if (PAGED && bad) hdr[st] = issued + 1;
            ++issued;
            dec_next<TK>(ic, P);
            if (PAGED && issued < my_tiles) load_table();
        }
        dec_cp_async_commit();
    };
    if (PAGED) load_table();
#pragma unroll
    for (int s = 0; s < DEC_STAGES - 1; ++s) issue();

    Math m;
    bool seg_bad = false;
    for (int t = 0; t < my_tiles; ++t) {
        // Tile t has landed (this thread's copies; the barrier makes everyone's visible), and
        // every warp is done with tile t - 1, whose stage the next issue refills.
        dec_cp_async_wait<DEC_STAGES - 2>();
        __syncthreads();
        issue();
        if (t == 0 || cc.tp == 0) {
            m.begin(P, cc, lane);
            seg_bad = cc.bad;
        }
        if (PAGED) seg_bad |= hdr[t % DEC_STAGES] == t + 1;
        const h16_t* const sk = ring + (t % DEC_STAGES) * STAGE;
        m.step(sk, sk + TK * D, cc.tp * TK, P.scale_log2, warp, lane);
        if (cc.tp == cc.n - 1 || t == my_tiles - 1) {
            m.stash(s_acc, s_m, s_l, warp, lane);
            __syncthreads();
            dec_finish<S, D, RB>(P, cc, seg_bad, s0 + t - cc.tp, w, s_acc, s_m, s_l, hdr);
        }
        dec_next<TK>(cc, P);
    }
    dec_cp_async_wait<0>();  // only empty groups can remain
}

#define DECODE_ENTRY(name, S, D, RB, PAGED)                                                      \
    extern "C" __global__ void __launch_bounds__(DEC_THREADS, DEC_MIN_BLOCKS(D, RB)) name(      \
        const h16_t* q, const h16_t* k, const h16_t* v, const int* seq_lens,                    \
        const int* block_table, float* part_o, float* part_lse, h16_t* o, float* lse,           \
        int* counters, int nb, int hq, int hkv, int nq, int capacity, int block_log2,           \
        int max_blocks, int num_blocks, int parts, float scale_log2) {                          \
        const DecProblem P{q, k, v, seq_lens, block_table, part_o, part_lse, o, lse, counters,  \
                           nb, hq, hkv, nq, capacity, block_log2, max_blocks, num_blocks, parts, \
                           scale_log2, hq / hkv * nq, (hq / hkv * nq + (RB) - 1) / (RB)};       \
        decode_stream<S, D, RB, PAGED>(P);                                                      \
    }

DECODE_ENTRY(attn_decode_bf16_d64_r1, BF16, 64, 1, false)
DECODE_ENTRY(attn_decode_bf16_d64_r2, BF16, 64, 2, false)
DECODE_ENTRY(attn_decode_bf16_d64_r4, BF16, 64, 4, false)
DECODE_ENTRY(attn_decode_bf16_d64_r8, BF16, 64, 8, false)
DECODE_ENTRY(attn_decode_paged_bf16_d64_r1, BF16, 64, 1, true)
DECODE_ENTRY(attn_decode_paged_bf16_d64_r2, BF16, 64, 2, true)
DECODE_ENTRY(attn_decode_paged_bf16_d64_r4, BF16, 64, 4, true)
DECODE_ENTRY(attn_decode_paged_bf16_d64_r8, BF16, 64, 8, true)
DECODE_ENTRY(attn_decode_bf16_d128_r1, BF16, 128, 1, false)
DECODE_ENTRY(attn_decode_bf16_d128_r2, BF16, 128, 2, false)
DECODE_ENTRY(attn_decode_bf16_d128_r4, BF16, 128, 4, false)
DECODE_ENTRY(attn_decode_bf16_d128_r8, BF16, 128, 8, false)
DECODE_ENTRY(attn_decode_paged_bf16_d128_r1, BF16, 128, 1, true)
DECODE_ENTRY(attn_decode_paged_bf16_d128_r2, BF16, 128, 2, true)
DECODE_ENTRY(attn_decode_paged_bf16_d128_r4, BF16, 128, 4, true)
DECODE_ENTRY(attn_decode_paged_bf16_d128_r8, BF16, 128, 8, true)
DECODE_ENTRY(attn_decode_bf16_d256_r1, BF16, 256, 1, false)
DECODE_ENTRY(attn_decode_bf16_d256_r2, BF16, 256, 2, false)
DECODE_ENTRY(attn_decode_bf16_d256_r4, BF16, 256, 4, false)
DECODE_ENTRY(attn_decode_bf16_d256_r8, BF16, 256, 8, false)
DECODE_ENTRY(attn_decode_paged_bf16_d256_r1, BF16, 256, 1, true)
DECODE_ENTRY(attn_decode_paged_bf16_d256_r2, BF16, 256, 2, true)
DECODE_ENTRY(attn_decode_paged_bf16_d256_r4, BF16, 256, 4, true)
DECODE_ENTRY(attn_decode_paged_bf16_d256_r8, BF16, 256, 8, true)
DECODE_ENTRY(attn_decode_f16_d64_r1, F16, 64, 1, false)
DECODE_ENTRY(attn_decode_f16_d64_r2, F16, 64, 2, false)
DECODE_ENTRY(attn_decode_f16_d64_r4, F16, 64, 4, false)
DECODE_ENTRY(attn_decode_f16_d64_r8, F16, 64, 8, false)
DECODE_ENTRY(attn_decode_paged_f16_d64_r1, F16, 64, 1, true)
DECODE_ENTRY(attn_decode_paged_f16_d64_r2, F16, 64, 2, true)
DECODE_ENTRY(attn_decode_paged_f16_d64_r4, F16, 64, 4, true)
DECODE_ENTRY(attn_decode_paged_f16_d64_r8, F16, 64, 8, true)
DECODE_ENTRY(attn_decode_f16_d128_r1, F16, 128, 1, false)
DECODE_ENTRY(attn_decode_f16_d128_r2, F16, 128, 2, false)
DECODE_ENTRY(attn_decode_f16_d128_r4, F16, 128, 4, false)
DECODE_ENTRY(attn_decode_f16_d128_r8, F16, 128, 8, false)
DECODE_ENTRY(attn_decode_paged_f16_d128_r1, F16, 128, 1, true)
DECODE_ENTRY(attn_decode_paged_f16_d128_r2, F16, 128, 2, true)
DECODE_ENTRY(attn_decode_paged_f16_d128_r4, F16, 128, 4, true)
DECODE_ENTRY(attn_decode_paged_f16_d128_r8, F16, 128, 8, true)
DECODE_ENTRY(attn_decode_f16_d256_r1, F16, 256, 1, false)
DECODE_ENTRY(attn_decode_f16_d256_r2, F16, 256, 2, false)
DECODE_ENTRY(attn_decode_f16_d256_r4, F16, 256, 4, false)
DECODE_ENTRY(attn_decode_f16_d256_r8, F16, 256, 8, false)
DECODE_ENTRY(attn_decode_paged_f16_d256_r1, F16, 256, 1, true)
DECODE_ENTRY(attn_decode_paged_f16_d256_r2, F16, 256, 2, true)
DECODE_ENTRY(attn_decode_paged_f16_d256_r4, F16, 256, 4, true)
DECODE_ENTRY(attn_decode_paged_f16_d256_r8, F16, 256, 8, true)
