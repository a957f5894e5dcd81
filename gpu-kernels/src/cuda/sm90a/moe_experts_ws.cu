// MoE experts on Hopper (sm_90a): the two grouped GEMMs of sm80/moe_experts.cu (same inputs,
// same block-padded permutation, same combine) as persistent kernels on wgmma fed by the TMA.
//
// Inputs (T tokens, H hidden, F ffn, E experts, k per token; slot = t*k + j):
//   A [P, K]: the activations in permuted order (xg, gathered by moe_gather_{s}, for the gate/up
//     GEMM; h, the SwiGLU output, for the down GEMM), read through the tensor map `ma`
//     (dims {K, P, 1}, boxes {64, 64, 1}: a consumer's rows, 128-byte swizzle; rows past P read
//     as zero);
//   W [E * W_ROWS, K]: the expert weights, K-major (gate_up [E, 2F, H]: W_ROWS = 2F; down
//     [E, H, F]: W_ROWS = H), through `mw` (dims {K, E * W_ROWS, 1}, boxes {64, 128, 1});
//   soff [E+1], tstart [E+1]: moe_tile_map's monotone segment bounds and the prefix count of
//     BM-row tiles per expert (from the routing's offsets on the device: no host sync);
//   sorted [P]: the slot of each permuted row (padding: anything outside 0..slots).
// Kernels (grid: one block per SM, each block walks tiles blockIdx.x, + gridDim.x, ...):
//   moe_ws_swiglu_{s}: h[p, n] = silu(A[p] . gate_e[n]) * (A[p] . up_e[n]) for the 128
//     columns n0..n0+127 of a tile: the block loads 128 gate rows and 128 up rows per k-step
//     and the SwiGLU runs on the f32 accumulators; rows past the expert's segment are not
//     stored (they belong to the next expert or to nothing).
//   moe_ws_down_{s}: rows[slot(p), n] = A[p] . down_e[n] for 256 columns a tile, stored by slot
//     (padding rows are not stored; the host zeroes `rows` first, so dropped slots add nothing
//     in moe_combine_slots_{s}).
// Tile order: expert-major, then the n-tile, then the m-tile, so the blocks running at once
// share each weight tile (one DRAM read, then L2) and one expert's activations.
// Block: a producer warpgroup (one thread issues the TMA copies into a ring of STAGES (3 or 4)
// stages, each a BM x 64 A tile and two 128 x 64 W tiles, guarded by full/empty mbarriers; it
// gives its registers away with setmaxnreg) and CONS (2 or 3) consumer warpgroups, 64 rows of
// the BM = 64 * CONS-row tile each, two wgmma m64n128k16 per 16-deep k-slice (one a W tile), or
// in the 2-consumer builds one m64n256k16 over both (they lie back to back in the stage;
// MWS_N256); A and W K-major in shared memory; one k-step's products kept in flight while the
// next stage is awaited. A consumer whose rows all lie past the expert's segment (its last
// tile) keeps its ring arrivals and issues no product. The producer runs ahead into the next
// tile while the consumers store this one. Builds: moe_ws_* (128 rows, 3 stages; also the
// e4m3 ones), moe_ws_s4_* (128, 4), moe_ws3_* (192, 3), moe_ws3_s4_* (192, 4), and the last
// two in clusters of two blocks sharing the weight tiles, moe_ws_s4_c2_* and moe_ws3_s4_c2_*
// (the pair builds, template argument CL); the host picks
// by the rows an expert (ops/moe.rs, ws_block). On an H100 at its 700 W cap, fewer operand
// bytes per product pay more than a busier tensor pipe (docs/PERF.md, sixteenth session).
// Requirements (checked by the host): K and the output width multiples of 8 (16-byte rows for
// the TMA), E <= MWS_MAX_E (the range the tests cover).
//
// e4m3 builds (moe_ws_{swiglu,down}_e4m3_{s}, the FP8 option; host: ops/moe_fp8.rs): A and W
// are e4m3 bytes quantized by moe_quant_e4m3_{s} (A per row, W per output channel, each with an
// f32 scale: scale = amax / 448, q = cvt.rn.satfinite(v * (448 / amax))). A stage's K slice is
// 128 elements (still 128 bytes a row, the same swizzle and ring), the products are wgmma
// m64n128k32.e4m3 into f32, and the epilogue multiplies each accumulator by its row's and its
// column's scale before the SwiGLU or the store. K and the output width must be multiples of
// 16 (16-byte e4m3 rows).

#define MWS_WG_ROWS 64  // rows of a tile each consumer warpgroup takes
#define MWS_BN 128
#define MWS_BK 64
#define MWS_STAGES 3  // the ring's depth in the default builds (the `_s4` builds: 4)
// 1: one wgmma m64n256k16 over both W tiles a k-slice in the two-consumer builds; 0: two
// m64n128k16 (one a W tile). On an H100 (2026-11-27, T4096 H4096 F14336 E8 k2, two
// interleaved runs each, the 128-row block): n128 with 3 stages 4.79 / 4.85 ms, n256 with 3
// stages 5.11 / 5.10, n128 with 4 stages 5.24 / 5.39, n256 with 4 stages 5.45 / 5.36. The
// three-consumer builds keep n128: ptxas cannot fit an m64n256k16 in their 128-register launch
// bound (C7602, 2026-11-28).
#define MWS_N256 0
#define MWS_MAX_E 256

// The block of a build with CONS consumer warpgroups (2: 128-row tiles, 3: 192-row tiles), an
// S-stage ring, and CL blocks a cluster (the pair builds keep their unit table after the
// barriers: MWS_MAX_E + 1 ints).
template <int CONS, int S, int CL>
struct MwsLayout {
    static constexpr int BM = MWS_WG_ROWS * CONS;          // rows a tile
    static constexpr unsigned TILE_A = BM * 128;           // BM rows of 128 bytes of K
    static constexpr unsigned TILE_W = MWS_BN * 128;       // 16 KiB: one 128-row weight tile
    static constexpr unsigned STAGE = TILE_A + 2 * TILE_W; // A, W0, W1
    static constexpr unsigned BARS = S * STAGE;            // full[S], then empty[S]
    static constexpr unsigned TABLE = CL > 1 ? 4 * (MWS_MAX_E + 1) : 0;
    static constexpr unsigned BYTES = BARS + 2 * 8 * S + TABLE + 1024;  // + alignment slack
};

// silu(g) = g / (1 + e^-g), the division approximate (__fdividef: about 2 ulp, and 0 where
// e^-g overflows): the IEEE division's instructions in each tile's epilogue cost the pair
// builds 2.5% and the T64 experts 3% (H200, 2026-11-29).
__device__ __forceinline__ float mws_silu(float g) { return __fdividef(g, 1.f + fast_exp2(-1.4426950408889634f * g)); }

// d[64x256] (+)= A[64x16] * B[256x16]^T, A and B K-major in shared memory (bf16).
__device__ __forceinline__ void mws_ss_n256_bf16(float (&d)[32][4], u64_t da, u64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, %128, %129, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]), "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]), "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]), "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]), "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]), "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]), "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]), "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]), "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]), "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3])
        : "l"(da), "l"(db), "r"(accumulate));
}

// d[64x256] (+)= A[64x16] * B[256x16]^T, A and B K-major in shared memory (f16).
__device__ __forceinline__ void mws_ss_n256_f16(float (&d)[32][4], u64_t da, u64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, %128, %129, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]), "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]), "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]), "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]), "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]), "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]), "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]), "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]), "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]), "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3])
        : "l"(da), "l"(db), "r"(accumulate));
}

template <bool F16>
__device__ __forceinline__ void mws_mma(float (&d)[32][4], u64_t da, u64_t db, int acc) {
    if (F16) mws_ss_n256_f16(d, da, db, acc);
    else mws_ss_n256_bf16(d, da, db, acc);
}

// d[64x128] (+)= A[64x32] * B[128x32]^T, A and B K-major in shared memory (e4m3). A 32-deep
// e4m3 k-slice is 32 bytes a row, as a 16-deep bf16 one: the descriptors advance alike.
__device__ __forceinline__ void mws_ss_n128_e4m3(float (&d)[16][4], u64_t da, u64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "l"(da), "l"(db), "r"(accumulate));
}

// A consumer warp's release of a stage: to this block's empty barrier, and in a pair build to
// the peer's too (it multicasts into this block's stage).
template <int CL>
__device__ __forceinline__ void mws_release(unsigned bar, unsigned rank) {
    mbar_arrive(bar);
    if constexpr (CL > 1) mbar_arrive_cluster(bar, rank ^ 1);
}

// live: the consumers with rows of the expert (the others load no A and issue no product);
// split: a pair build's unit of one m-tile whose two blocks take two n-tiles (each loads its
// own weight tiles), not two m-tiles sharing one n-tile's.
struct MwsTile {
    int e, row0, row_end, nt, live, split;
};
// The expert e of unit t: starts[e] * scale <= t < starts[e + 1] * scale (the last such e
// where experts without units share a bound; starts[E] * scale > t).
__device__ __forceinline__ int mws_expert(int t, const int* starts, int scale, int E) {
    int lo = 0, hi = E;
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (starts[mid] * scale <= t) lo = mid;
        else hi = mid;
    }
    return lo;
}

// The consumers of `cons` with rows of the expert in a tile from row0 (bound row_end).
__device__ __forceinline__ int mws_live(int row0, int row_end, int cons) {
    return min(cons, max(0, (row_end - row0 + MWS_WG_ROWS - 1) / MWS_WG_ROWS));
}

// The tile `t` of this GEMM for a block of `cons` consumers and BM rows: its expert, first
// row, row bound, n-tile and live consumers (expert-major, then the n-tile, then the m-tile:
// the tiles of one n-tile consecutive, so the blocks running at once share its weight tile).
__device__ __forceinline__ MwsTile mws_tile(int t, int NT, int E, const int* soff, const int* tstart, int BM,
                                            int cons) {
    const int e = mws_expert(t, tstart, NT, E);
    const int mcount = tstart[e + 1] - tstart[e];
    const int local = t - tstart[e] * NT;
    MwsTile r;
    r.e = e;
    r.nt = local / mcount;
    r.row_end = soff[e + 1];
    r.row0 = soff[e] + (local - r.nt * mcount) * BM;
    r.live = mws_live(r.row0, r.row_end, cons);
    r.split = 0;
    return r;
}

// A pair build's units (clusters of two, `rank` 0 or 1): an expert of m BM-row tiles has
// floor(m / 2) pairs of tiles, each taken with every n-tile (NT units: the two blocks take
// tiles 2u and 2u + 1 of one n-tile and share its weight tiles), then, where m is odd, its
// last tile with the n-tiles two at a time (NU = ceil(NT / 2) split units: the blocks take
// n-tiles 2v and 2v + 1, the second perhaps past N), so no block idles for want of rows.
// tab[e]: the units before expert e (mws_pair_table). Measured on an H200 (2026-11-29): the
// pair builds without the split units, where the odd tile's partner block idled, were 6-16%
// slower than one block at T2048, T3072, T3584 and T8192.
__device__ __forceinline__ MwsTile mws_pair_tile(int t, int NT, int E, const int* soff, const int* tstart,
                                                 const int* tab, int BM, int rank, int cons) {
    const int e = mws_expert(t, tab, 1, E);
    const int m = tstart[e + 1] - tstart[e], pairs = m >> 1;
    int local = t - tab[e];
    MwsTile r;
    r.e = e;
    r.row_end = soff[e + 1];
    if (local < pairs * NT) {
        r.split = 0;
        r.nt = local / pairs;
        r.row0 = soff[e] + (2 * (local - r.nt * pairs) + rank) * BM;
    } else {
        local -= pairs * NT;
        r.split = 1;
        r.nt = 2 * local + rank;
        r.row0 = soff[e] + (m - 1) * BM;
    }
    r.live = mws_live(r.row0, r.row_end, cons);
    return r;
}

// tab[e] for e in 0..=E: the pair units of the experts before e (mws_pair_tile), by one warp
// (a scan over 32 experts a step).
__device__ __forceinline__ void mws_pair_table(int* tab, const int* tstart, int E, int NT, int lane) {
    const int NU = (NT + 1) >> 1;
    int run = 0;
    for (int e0 = 0; e0 < E; e0 += 32) {
        const int e = e0 + lane;
        int v = 0;
        if (e < E) {
            const int m = tstart[e + 1] - tstart[e];
            v = (m >> 1) * NT + (m & 1) * NU;
        }
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, v, o);
            if (lane >= o) v += y;
        }
        if (e < E) tab[e + 1] = run + v;
        run += __shfl_sync(0xffffffffu, v, 31);
    }
    if (lane == 0) tab[0] = 0;
}

// SWIGLU: out = h [P, N] (N = F, W_ROWS = 2F); else out = rows [slots, N] (N = H, W_ROWS = H).
// F16: the outputs (and, unless FP8, the operands) are f16, else bf16. FP8: A and W are e4m3
// (128 elements, 128 bytes, a row of a stage) with f32 scales, sa[p] per row of A and sw[row]
// per weight row (output channel): the products are scaled by sa[p] * sw[row] in the epilogue.
// CONS: consumer warpgroups, 64 rows of a tile each (the tile map's block is 64 * CONS);
// STAGES: the ring's depth. CL: blocks a cluster (1, or 2 for the pair builds: the two blocks
// take two BM-row tiles of one expert and n-tile, and each loads one of the stage's two weight
// tiles and multicasts it into both blocks' stages, so a block reads half the weight bytes
// from L2; an expert's odd last tile is split by n-tiles instead (mws_pair_tile); a stage is
// refilled once both blocks' consumers released it).
template <bool SWIGLU, bool F16, bool FP8, int CONS, int STAGES, int CL>
__device__ __forceinline__ void moe_ws_gemm(const tma_map_t* ma, const tma_map_t* mw, unsigned short* __restrict__ out,
                                            const int* __restrict__ sorted, const int* __restrict__ soff_g,
                                            const int* __restrict__ tstart_g, int E, int N, int K, int slots,
                                            const float* __restrict__ sa, const float* __restrict__ sw) {
    constexpr int BK = FP8 ? 2 * MWS_BK : MWS_BK;  // elements of K a stage (128 bytes a row)
    using L = MwsLayout<CONS, STAGES, CL>;
    extern __shared__ __align__(1024) unsigned char mws_smem[];
    const unsigned base = (smem_addr(mws_smem) + 1023u) & ~1023u;
    const unsigned full = base + L::BARS, empty = full + 8 * STAGES;
    // the pair builds' unit table (after the barriers)
    int* tab = reinterpret_cast<int*>(mws_smem + (base - smem_addr(mws_smem)) + L::BARS + 16 * STAGES);
    // the tile tables are read where moe_tile_map wrote them (a few L1-resident ints a tile)
    const int* soff = soff_g;
    const int* tstart = tstart_g;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wg = warp >> 2;
    const int w_rows = SWIGLU ? 2 * N : N;
    const int tile_n = SWIGLU ? MWS_BN : 2 * MWS_BN;  // output columns a tile
    const int NT = (N + tile_n - 1) / tile_n;
    if constexpr (CL > 1)
        if (warp == 1) mws_pair_table(tab, tstart, E, NT, lane);

    if (threadIdx.x == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full + 8 * s, 1);
            mbar_init(empty + 8 * s, 4 * CONS * CL);  // the consumer warps (of both blocks)
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    // a pair's blocks arrive on each other's barriers: both initialised before either runs
    if constexpr (CL > 1) cluster_sync();
    else __syncthreads();
    const unsigned rank = CL > 1 ? cluster_rank() : 0;
    const int first = CL > 1 ? (int)cluster_id_x() : (int)blockIdx.x;
    const int stride = CL > 1 ? (int)cluster_count_x() : (int)gridDim.x;

    const int total = CL > 1 ? tab[E] : tstart[E] * NT;  // units (tiles when CL is 1)
    const int KC = (K + BK - 1) / BK;

    if (wg == 0) {
        // 128 * (CONS + 1) threads launched with 65536 / that registers each: the producer gives
        // its share to the consumers (40 + 2 * 232 = 3 * 168; 32 + 3 * 160 = 4 * 128)
        if constexpr (CONS == 2) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        else asm volatile("setmaxnreg.dec.sync.aligned.u32 32;\n" ::: "memory");
        if (threadIdx.x == 0) {
            int it = 0;
            for (int t = first; t < total; t += stride) {
                const MwsTile tl = CL > 1 ? mws_pair_tile(t, NT, E, soff, tstart, tab, L::BM, (int)rank, CONS)
                                          : mws_tile(t, NT, E, soff, tstart, L::BM, CONS);
                const bool has_n = tl.nt < NT;  // a split unit's second n-tile may lie past N
                const int n0 = tl.nt * tile_n;
                const int w0 = tl.e * w_rows + n0;
                const int w1 = SWIGLU ? w0 + N : w0 + MWS_BN;  // up rows / the next 128 rows
                for (int c = 0; c < KC; ++c, ++it) {
                    const int s = it % STAGES;
                    const unsigned ph = ((it / STAGES) & 1) ^ 1;  // a stage's first use does not wait
                    const unsigned st = base + s * L::STAGE;
                    mbar_wait(empty + 8 * s, ph);
                    // A in 64-row boxes, one a consumer: none for a consumer whose rows all lie
                    // past the expert's segment (it issues no product), so an expert's last
                    // tile reads only the rows it uses
                    mbar_expect_tx(full + 8 * s, tl.live * MWS_WG_ROWS * 128 + (has_n ? 2 * L::TILE_W : 0));
                    for (int i = 0; i < tl.live; ++i)
                        tma_load_3d(st + i * MWS_WG_ROWS * 128, ma, full + 8 * s, c * BK, tl.row0 + i * MWS_WG_ROWS, 0);
                    if (CL > 1 && !tl.split) {
                        // this block's weight tile, into both blocks' stages
                        tma_load_3d_multicast(st + L::TILE_A + rank * L::TILE_W, mw, full + 8 * s, c * BK,
                                              rank ? w1 : w0, 0, (unsigned short)3);
                    } else if (has_n) {
                        tma_load_3d(st + L::TILE_A, mw, full + 8 * s, c * BK, w0, 0);
                        tma_load_3d(st + L::TILE_A + L::TILE_W, mw, full + 8 * s, c * BK, w1, 0);
                    }
                }
            }
        }
    } else {
        if constexpr (CONS == 2) asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
        else asm volatile("setmaxnreg.inc.sync.aligned.u32 160;\n" ::: "memory");
        const int cw = wg - 1;  // rows 64 * cw .. + 63 of each tile
        const int g = lane >> 2, tq = lane & 3;
        const int rw = cw * MWS_WG_ROWS + (warp & 3) * 16 + g;  // this thread's rows: rw, rw + 8
        int it = 0;
        for (int t = first; t < total; t += stride) {
            const MwsTile tl = CL > 1 ? mws_pair_tile(t, NT, E, soff, tstart, tab, L::BM, (int)rank, CONS)
                                      : mws_tile(t, NT, E, soff, tstart, L::BM, CONS);
            // columns 0..127: gate (W0) / the first 128 outputs; 128..255: up (W1) / the next 128
            float acc[32][4];
#pragma unroll
            for (int i = 0; i < 32; ++i)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[i][e] = 0.f;
            // idle: all 64 of this consumer's rows lie past the expert's segment (its last
            // tile), or a split unit's n-tile lies past N: it keeps its ring arrivals and issues
            // no product (the loop is whole on each side of the branch, so no wgmma sits in a
            // divergent path)
            if (cw >= tl.live || tl.nt >= NT) {
                for (int c = 0; c < KC; ++c, ++it) {
                    const int s = it % STAGES;
                    mbar_wait(full + 8 * s, (it / STAGES) & 1);
                    if (lane == 0) mws_release<CL>(empty + 8 * s, rank);
                }
                continue;
            }
            for (int c = 0; c < KC; ++c, ++it) {
                const int s = it % STAGES;
                const unsigned st = base + s * L::STAGE;
                mbar_wait(full + 8 * s, (it / STAGES) & 1);
                ws_fence();
#pragma unroll
                for (int kk = 0; kk < MWS_BK / 16; ++kk) {
                    const u64_t da = desc_sw128(st + cw * MWS_WG_ROWS * 128 + kk * 32, 16, 1024);
                    float(&lo)[16][4] = *reinterpret_cast<float(*)[16][4]>(&acc[0]);
                    float(&hi)[16][4] = *reinterpret_cast<float(*)[16][4]>(&acc[16]);
                    if constexpr (FP8) {
                        mws_ss_n128_e4m3(lo, da, desc_sw128(st + L::TILE_A + kk * 32, 16, 1024), 1);
                        mws_ss_n128_e4m3(hi, da, desc_sw128(st + L::TILE_A + L::TILE_W + kk * 32, 16, 1024), 1);
                    } else if constexpr (MWS_N256 && CONS == 2) {
                        // W0 and W1 lie back to back: one 256-row operand
                        mws_mma<F16>(acc, da, desc_sw128(st + L::TILE_A + kk * 32, 16, 1024), 1);
                    } else if (F16) {
                        ws_ss_n128_f16(lo, da, desc_sw128(st + L::TILE_A + kk * 32, 16, 1024), 1);
                        ws_ss_n128_f16(hi, da, desc_sw128(st + L::TILE_A + L::TILE_W + kk * 32, 16, 1024), 1);
                    } else {
                        ws_ss_n128_bf16(lo, da, desc_sw128(st + L::TILE_A + kk * 32, 16, 1024), 1);
                        ws_ss_n128_bf16(hi, da, desc_sw128(st + L::TILE_A + L::TILE_W + kk * 32, 16, 1024), 1);
                    }
                }
                ws_commit();
                // the previous k-step's products are done: its stage can be refilled
                ws_wait<1>();
                if (c > 0 && lane == 0) mws_release<CL>(empty + 8 * ((it - 1) % STAGES), rank);
            }
            ws_wait<0>();
            pin(acc);
            if (KC > 0 && lane == 0) mws_release<CL>(empty + 8 * ((it - 1) % STAGES), rank);

            const int n0 = tl.nt * tile_n;
            if constexpr (FP8) {
                // acc *= sa[row] * sw[channel]: columns 0..127 are the weight rows w0 + j * 8 +
                // tq * 2 (+1), 128..255 the rows w1 + the same
                const int w0 = tl.e * w_rows + n0, w1 = SWIGLU ? w0 + N : w0 + MWS_BN;
                const int wlim = (tl.e + 1) * w_rows;
                float ra[2];
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int p = tl.row0 + rw + r * 8;
                    ra[r] = p < tl.row_end ? sa[p] : 0.f;
                }
#pragma unroll
                for (int j = 0; j < 16; ++j)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int c0 = (h ? w1 : w0) + j * 8 + tq * 2;
                        const float s0 = c0 < wlim ? sw[c0] : 0.f, s1 = c0 + 1 < wlim ? sw[c0 + 1] : 0.f;
#pragma unroll
                        for (int r = 0; r < 2; ++r) {
                            acc[j + 16 * h][2 * r] *= ra[r] * s0;
                            acc[j + 16 * h][2 * r + 1] *= ra[r] * s1;
                        }
                    }
            }
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int p = tl.row0 + rw + r * 8;
                if (p >= tl.row_end) continue;
                if (SWIGLU) {
                    unsigned short* orow = out + (u64_t)p * N;
#pragma unroll
                    for (int j = 0; j < 16; ++j) {
                        const int col = n0 + j * 8 + tq * 2;
                        if (col < N) {
                            const float h0 = mws_silu(acc[j][2 * r]) * acc[j + 16][2 * r];
                            const float h1 = mws_silu(acc[j][2 * r + 1]) * acc[j + 16][2 * r + 1];
                            *(unsigned*)(orow + col) = ws_pack<F16>(h0, h1);
                        }
                    }
                } else {
                    const int slot = sorted[p];
                    if (slot < 0 || slot >= slots) continue;
                    unsigned short* orow = out + (u64_t)slot * N;
#pragma unroll
                    for (int j = 0; j < 16; ++j) {
                        const int col = n0 + j * 8 + tq * 2;
                        if (col < N) *(unsigned*)(orow + col) = ws_pack<F16>(acc[j][2 * r], acc[j][2 * r + 1]);
                        if (col + MWS_BN < N)
                            *(unsigned*)(orow + col + MWS_BN) = ws_pack<F16>(acc[j + 16][2 * r], acc[j + 16][2 * r + 1]);
                    }
                }
            }
        }
    }
    // the peer may still arrive on this block's barriers or write into its ring
    if constexpr (CL > 1) cluster_sync();
}

#define MWS_ENTRY(NAME, SWIGLU, F16, CONS, STAGES)                                                       \
    extern "C" __global__ void __launch_bounds__(128 * (CONS + 1), 1)                                    \
        NAME(const __grid_constant__ tma_map_t ma, const __grid_constant__ tma_map_t mw,                 \
             unsigned short* __restrict__ out, const int* __restrict__ sorted, const int* __restrict__ soff, \
             const int* __restrict__ tstart, int E, int N, int K, int slots) {                           \
        moe_ws_gemm<SWIGLU, F16, false, CONS, STAGES, 1>(&ma, &mw, out, sorted, soff, tstart, E, N, K, slots, nullptr, nullptr); \
    }
// The pair builds: clusters of two blocks sharing each stage's weight tiles.
#define MWS_PAIR_ENTRY(NAME, SWIGLU, F16, CONS, STAGES)                                                  \
    extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(128 * (CONS + 1), 1)          \
        NAME(const __grid_constant__ tma_map_t ma, const __grid_constant__ tma_map_t mw,                 \
             unsigned short* __restrict__ out, const int* __restrict__ sorted, const int* __restrict__ soff, \
             const int* __restrict__ tstart, int E, int N, int K, int slots) {                           \
        moe_ws_gemm<SWIGLU, F16, false, CONS, STAGES, 2>(&ma, &mw, out, sorted, soff, tstart, E, N, K, slots, nullptr, nullptr); \
    }
// 128-row tiles, two consumers (384 threads)
MWS_ENTRY(moe_ws_swiglu_bf16, true, false, 2, 3)
MWS_ENTRY(moe_ws_down_bf16, false, false, 2, 3)
MWS_ENTRY(moe_ws_swiglu_f16, true, true, 2, 3)
MWS_ENTRY(moe_ws_down_f16, false, true, 2, 3)
// the same with a 4-stage ring
MWS_ENTRY(moe_ws_s4_swiglu_bf16, true, false, 2, 4)
MWS_ENTRY(moe_ws_s4_down_bf16, false, false, 2, 4)
MWS_ENTRY(moe_ws_s4_swiglu_f16, true, true, 2, 4)
MWS_ENTRY(moe_ws_s4_down_f16, false, true, 2, 4)
// 192-row tiles, three consumers (512 threads)
MWS_ENTRY(moe_ws3_swiglu_bf16, true, false, 3, 3)
MWS_ENTRY(moe_ws3_down_bf16, false, false, 3, 3)
MWS_ENTRY(moe_ws3_swiglu_f16, true, true, 3, 3)
MWS_ENTRY(moe_ws3_down_f16, false, true, 3, 3)
// the same with a 4-stage ring (224 KiB)
MWS_ENTRY(moe_ws3_s4_swiglu_bf16, true, false, 3, 4)
MWS_ENTRY(moe_ws3_s4_down_bf16, false, false, 3, 4)
MWS_ENTRY(moe_ws3_s4_swiglu_f16, true, true, 3, 4)
MWS_ENTRY(moe_ws3_s4_down_f16, false, true, 3, 4)
// clusters of two (the pair builds) on the 4-stage rings
MWS_PAIR_ENTRY(moe_ws_s4_c2_swiglu_bf16, true, false, 2, 4)
MWS_PAIR_ENTRY(moe_ws_s4_c2_down_bf16, false, false, 2, 4)
MWS_PAIR_ENTRY(moe_ws_s4_c2_swiglu_f16, true, true, 2, 4)
MWS_PAIR_ENTRY(moe_ws_s4_c2_down_f16, false, true, 2, 4)
MWS_PAIR_ENTRY(moe_ws3_s4_c2_swiglu_bf16, true, false, 3, 4)
MWS_PAIR_ENTRY(moe_ws3_s4_c2_down_bf16, false, false, 3, 4)
MWS_PAIR_ENTRY(moe_ws3_s4_c2_swiglu_f16, true, true, 3, 4)
MWS_PAIR_ENTRY(moe_ws3_s4_c2_down_f16, false, true, 3, 4)

// The e4m3 builds (outputs in the storage precision named last): A and W are e4m3 with f32
// scales sa [P] and sw [E * W_ROWS] (moe_quant_e4m3_{s}); K a multiple of 16.
#define MWS_FP8_ENTRY(NAME, SWIGLU, F16, CONS, STAGES)                                                   \
    extern "C" __global__ void __launch_bounds__(128 * (CONS + 1), 1)                                    \
        NAME(const __grid_constant__ tma_map_t ma, const __grid_constant__ tma_map_t mw,                 \
             unsigned short* __restrict__ out, const int* __restrict__ sorted, const int* __restrict__ soff, \
             const int* __restrict__ tstart, int E, int N, int K, int slots, const float* __restrict__ sa, \
             const float* __restrict__ sw) {                                                             \
        moe_ws_gemm<SWIGLU, F16, true, CONS, STAGES, 1>(&ma, &mw, out, sorted, soff, tstart, E, N, K, slots, sa, sw); \
    }
MWS_FP8_ENTRY(moe_ws_swiglu_e4m3_bf16, true, false, 2, 3)
MWS_FP8_ENTRY(moe_ws_down_e4m3_bf16, false, false, 2, 3)
MWS_FP8_ENTRY(moe_ws_swiglu_e4m3_f16, true, true, 2, 3)
MWS_FP8_ENTRY(moe_ws_down_e4m3_f16, false, true, 2, 3)
// the 128-row block with a 4-stage ring (the 192-row block's e4m3 down GEMM spills: 580 bytes
// with its scale epilogue in 160 registers, 2026-11-28)
MWS_FP8_ENTRY(moe_ws_s4_swiglu_e4m3_bf16, true, false, 2, 4)
MWS_FP8_ENTRY(moe_ws_s4_down_e4m3_bf16, false, false, 2, 4)
MWS_FP8_ENTRY(moe_ws_s4_swiglu_e4m3_f16, true, true, 2, 4)
MWS_FP8_ENTRY(moe_ws_s4_down_e4m3_f16, false, true, 2, 4)

// Row-wise e4m3 quantization (the FP8 experts' activations and weights): for each row r of
// `rows` x `cols` (storage S), with src row i = r, or, given `sorted`, only for a real slot
// sorted[r] in 0..sentinel, with i = sorted[r] / k if `gather` (the gate/up GEMM's permuted x),
// else i = r (h, whose padding rows are never written); other rows are written as zeros with
// scale 0:
//   amax = max |src[i, :]|, scale[r] = amax / 448, dst[r, c] = e4m3_rn_satfinite(src[i, c] *
//   (448 / amax)) (0 where amax is 0), with correctly rounded f32 division and product, so the
//   host reproduces every byte. One block of 256 threads a row.
template <typename S>
__device__ __forceinline__ void moe_quant_e4m3_impl(const h16_t* __restrict__ src, const int* __restrict__ sorted,
                                                    unsigned char* __restrict__ dst, float* __restrict__ scale,
                                                    int rows, int cols, int k, int sentinel, int gather) {
    __shared__ float red[8];
    const int r = blockIdx.x;
    if (r >= rows) return;
    int i = r;
    if (sorted) {
        const int s = sorted[r];
        i = (s >= 0 && s < sentinel) ? (gather ? s / k : r) : -1;
    }
    unsigned char* d = dst + (u64_t)r * cols;
    if (i < 0) {
        for (int c = threadIdx.x; c < cols; c += blockDim.x) d[c] = 0;
        if (threadIdx.x == 0) scale[r] = 0.f;
        return;
    }
    const h16_t* x = src + (u64_t)i * cols;
    const bool vec = (cols & 7) == 0;  // 16-byte loads, 8-byte stores
    float m = 0.f;
    if (vec) {
        for (int c = 8 * threadIdx.x; c < cols; c += 8 * blockDim.x) {
            const uint4 v = *(const uint4*)(x + c);
            const h16_t* e = (const h16_t*)&v;
#pragma unroll
            for (int j = 0; j < 8; ++j) m = fmaxf(m, fabsf(S::to_f(e[j])));
        }
    } else {
        for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, fabsf(S::to_f(x[c])));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    m = red[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); ++w) m = fmaxf(m, red[w]);
    const float inv = m > 0.f ? __fdiv_rn(448.f, m) : 0.f;
    if (threadIdx.x == 0) scale[r] = __fdiv_rn(m, 448.f);
    if (vec) {
        for (int c = 8 * threadIdx.x; c < cols; c += 8 * blockDim.x) {
            const uint4 v = *(const uint4*)(x + c);
            const h16_t* e = (const h16_t*)&v;
            unsigned short q[4];
#pragma unroll
            for (int j = 0; j < 4; ++j)
                asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;"
                    : "=h"(q[j])
                    : "f"(__fmul_rn(S::to_f(e[2 * j + 1]), inv)), "f"(__fmul_rn(S::to_f(e[2 * j]), inv)));
            *(uint2*)(d + c) = make_uint2(q[0] | ((unsigned)q[1] << 16), q[2] | ((unsigned)q[3] << 16));
        }
        return;
    }
    for (int c = 2 * threadIdx.x; c < cols; c += 2 * blockDim.x) {
        const float a = __fmul_rn(S::to_f(x[c]), inv);
        const float b = c + 1 < cols ? __fmul_rn(S::to_f(x[c + 1]), inv) : 0.f;
        unsigned short q;
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(q) : "f"(b), "f"(a));
        d[c] = (unsigned char)(q & 0xff);
        if (c + 1 < cols) d[c + 1] = (unsigned char)(q >> 8);
    }
}

#define QUANT_ENTRY(NAME, S)                                                                        \
    extern "C" __global__ void __launch_bounds__(256) NAME(const h16_t* __restrict__ src, const int* __restrict__ sorted, \
                                                           unsigned char* __restrict__ dst, float* __restrict__ scale, \
                                                           int rows, int cols, int k, int sentinel, int gather) { \
        moe_quant_e4m3_impl<S>(src, sorted, dst, scale, rows, cols, k, sentinel, gather);              \
    }
QUANT_ENTRY(moe_quant_e4m3_bf16, BF16)
QUANT_ENTRY(moe_quant_e4m3_f16, F16)
