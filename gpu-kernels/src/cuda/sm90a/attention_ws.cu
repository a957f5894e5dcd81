// Hopper (sm_90a) attention forward in FlashAttention-3's structure: a producer warp feeds
// K and V tiles through the tensor memory accelerator (TMA, `cp.async.bulk.tensor`) into a
// two-stage ring of shared-memory buffers guarded by mbarriers, and two consumer warpgroups
// (64 query rows each) run both products on wgmma:
//   S = Q K^T   wgmma m64n128k16, Q and K K-major in shared memory (128-byte swizzle);
//   O += P V    wgmma m64n{D}k16, P from registers, V N-major in shared memory.
// Each consumer overlaps its own softmax of tile j with its P V product of tile j-1 (issued
// together, waited apart), and the two consumers take turns issuing their products (named
// barriers 1 and 2), so one warpgroup's exponentials run under the other's matrix work.
// The producer gives its registers to the consumers (setmaxnreg; the producer's count plus
// the consumers' must fit the registers the block was launched with, or setmaxnreg.inc waits
// forever: static_assert below). TMA, mbarrier and wgmma helpers: sm90a/hopper.cuh (compiled
// ahead of this file).
//
// Persistent: the grid is min(tiles, SMs) blocks. A block takes tile blockIdx.x, then the next
// one from `next_tile` (a device counter the host zeroes; atomicAdd + gridDim.x). Tiles are
// numbered head-major and, within a head, the heaviest causal row blocks first, so the blocks
// running at once share K/V in L2 and the long tiles start early. The K/V ring and the Q
// buffer carry over from one tile to the next: an `empty_q` mbarrier tells the producer the
// consumers are done with Q, and the producer hands each tile's index to the consumers through
// a shared-memory slot written and read with atomics (one read a warp, then a shuffle), ordered
// by the Q mbarrier. The consumers meet at a named barrier at the end of each tile.
//
// Shared memory (1024-byte aligned, as the 128-byte swizzle needs): Q [BM x D], K[2][BN x D],
// V[2][BN x D], each as D/64 column halves of [rows][64] bf16 rows of 128 bytes, swizzled by
// the TMA (16-byte chunk c of row r lands at chunk c ^ (r % 8)); then the mbarriers.
// Tensor maps (built by the host, passed by value): dims {D, N, B*H}, boxes {64, BM or BN, 1}.

// Consumer warpgroups per block (64 query rows each) per head dim: d64's lighter registers let
// a third consumer in, so each one's softmax has two partners' GEMMs to hide under.
#define WS_NC_D256 2
#define WS_NC_D128 2
#define WS_NC_D64 3
// Key rows per tile (and K/V TMA box rows) per head dim; the host mirrors these
// (tandem_gpu_kernels::attention_ws_block_n).
// d128: 176-key tiles (FlashAttention-3's choice) measured 6% faster than 128 (v9).
// d256: 80-key tiles (FlashAttention-3's choice): Q (64 KB) and two K and two V stages (40 KB
// each) fill 225 KB of the 227 KB a block may have; S (40 registers) beside O (128) fits 240.
#define WS_BN_D256 80
#define WS_BN_D128 176
#define WS_BN_D64 128
#define WS_NC(D) ((D) == 64 ? WS_NC_D64 : (D) == 128 ? WS_NC_D128 : WS_NC_D256)
#define WS_BN(D) ((D) == 64 ? WS_BN_D64 : (D) == 128 ? WS_BN_D128 : WS_BN_D256)

// d[64x176] (+)= A[64x16] * B[176x16]^T, A and B K-major in shared memory (bf16).
__device__ __forceinline__ void ws_ss_n176_bf16(float (&d)[22][4], u64_t da, u64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %90, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n176k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87}, %88, %89, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]), "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]), "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3])
        : "l"(da), "l"(db), "r"(accumulate));
}

// d[64x64] += A[64x16] (registers) * B[16x64], B N-major in shared memory (bf16).
__device__ __forceinline__ void ws_rs_n64_bf16(float (&d)[8][4], const unsigned (&a)[4], u64_t db) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, 1, 1, 1, 1;\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

// d[64x128] += A[64x16] (registers) * B[16x128], B N-major in shared memory (bf16).
__device__ __forceinline__ void ws_rs_n128_bf16(float (&d)[16][4], const unsigned (&a)[4], u64_t db) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, 1, 1, 1, 1;\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

// d[64x176] (+)= A[64x16] * B[176x16]^T, A and B K-major in shared memory (f16).
__device__ __forceinline__ void ws_ss_n176_f16(float (&d)[22][4], u64_t da, u64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %90, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n176k16.f32.f16.f16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87}, %88, %89, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]), "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]), "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3])
        : "l"(da), "l"(db), "r"(accumulate));
}

// d[64x64] += A[64x16] (registers) * B[16x64], B N-major in shared memory (f16).
__device__ __forceinline__ void ws_rs_n64_f16(float (&d)[8][4], const unsigned (&a)[4], u64_t db) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, 1, 1, 1, 1;\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

// d[64x128] += A[64x16] (registers) * B[16x128], B N-major in shared memory (f16).
__device__ __forceinline__ void ws_rs_n128_f16(float (&d)[16][4], const unsigned (&a)[4], u64_t db) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, 1, 1, 1, 1;\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

// A compile-time flag (the loop steps' shape).
// head dim 256 (80-key tiles): S is m64n80, O += P V is m64n256.
// d[64x80] (+)= A[64x16] * B[80x16]^T, A and B K-major in shared memory (bf16).
__device__ __forceinline__ void ws_ss_n80_bf16(float (&d)[10][4], u64_t da, u64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %42, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39}, %40, %41, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3])
        : "l"(da), "l"(db), "r"(accumulate));
}

// d[64x80] (+)= A[64x16] * B[80x16]^T, A and B K-major in shared memory (f16).
__device__ __forceinline__ void ws_ss_n80_f16(float (&d)[10][4], u64_t da, u64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %42, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n80k16.f32.f16.f16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39}, %40, %41, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3])
        : "l"(da), "l"(db), "r"(accumulate));
}

// d[64x256] += A[64x16] (registers) * B[16x256], B N-major in shared memory (bf16).
__device__ __forceinline__ void ws_rs_n256_bf16(float (&d)[32][4], const unsigned (&a)[4], u64_t db) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, {%128,%129,%130,%131}, %132, 1, 1, 1, 1;\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]), "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]), "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]), "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]), "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]), "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]), "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]), "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]), "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]), "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

// d[64x256] += A[64x16] (registers) * B[16x256], B N-major in shared memory (f16).
__device__ __forceinline__ void ws_rs_n256_f16(float (&d)[32][4], const unsigned (&a)[4], u64_t db) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, {%128,%129,%130,%131}, %132, 1, 1, 1, 1;\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]), "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]), "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]), "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]), "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]), "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]), "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]), "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]), "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]), "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

template <bool B>
struct ws_bool {
    static constexpr bool value = B;
};

template <bool F16, int NT>
__device__ __forceinline__ void ws_qk(float (&d)[NT][4], u64_t da, u64_t db, int acc) {
    if constexpr (NT == 22) {
        if (F16) ws_ss_n176_f16(d, da, db, acc);
        else ws_ss_n176_bf16(d, da, db, acc);
    } else if constexpr (NT == 10) {
        if (F16) ws_ss_n80_f16(d, da, db, acc);
        else ws_ss_n80_bf16(d, da, db, acc);
    } else {
        if (F16) ws_ss_n128_f16(d, da, db, acc);
        else ws_ss_n128_bf16(d, da, db, acc);
    }
}
template <bool F16, int D>
__device__ __forceinline__ void ws_pv(float (&d)[D / 8][4], const unsigned (&a)[4], u64_t db) {
    if constexpr (D == 256) {
        if (F16) ws_rs_n256_f16(d, a, db);
        else ws_rs_n256_bf16(d, a, db);
    } else if constexpr (D == 128) {
        if (F16) ws_rs_n128_f16(d, a, db);
        else ws_rs_n128_bf16(d, a, db);
    } else {
        if (F16) ws_rs_n64_f16(d, a, db);
        else ws_rs_n64_bf16(d, a, db);
    }
}

// The shared-memory bytes a build needs (the host mirrors this: attention.rs).
template <int D, int BN, int NC>
struct WsLayout {
    static constexpr unsigned TILE = BN * D * 2;  // one K or V stage
    static constexpr unsigned Q = 0, K = 64 * NC * D * 2, V = K + 2 * TILE, BARS = V + 2 * TILE;
    static constexpr unsigned BYTES = BARS + 128 + 1024;  // + mbarriers + alignment slack
};

// CSKIP (the d64 causal build): a consumer skips the key tiles wholly masked for its rows. A
// template argument, so the non-causal code stays as it is (with the branch in it, it measured
// 1% slower).
template <int D, int BN, int NC, bool F16, bool CSKIP>
__device__ __forceinline__ void attn_fwd_ws(const tma_map_t* mq, const tma_map_t* mk, const tma_map_t* mv,
                                            unsigned short* __restrict__ O, float* __restrict__ LSE, int Hq,
                                            int Hkv, int Nq, int Nkv, float scale_log2, int causal, int B,
                                            int* __restrict__ next_tile) {
    constexpr int BM = 64 * NC, HALVES = D / 64, NS = BN / 8, ND = D / 8;
    // registers: the producer keeps PRODUCER_REGS, the consumers share the rest of what the
    // block was launched with (its __launch_bounds__: 168 a thread for 384 threads, 128 for
    // 512): setmaxnreg.inc waits for registers the block does not have, so the two must add up
    // to no more (d128: 24 + 2 x 240 = 504 = 3 x 168; d64: 32 + 3 x 160 = 512 = 4 x 128)
    constexpr int PRODUCER_REGS = NC == 2 ? 24 : 32;
    constexpr int CONSUMER_REGS = NC == 2 ? 240 : 160;
    static_assert(PRODUCER_REGS + NC * CONSUMER_REGS <= (NC + 1) * (65536 / (128 * (NC + 1)) / 8 * 8),
                  "setmaxnreg budget beyond the launch's registers");
    using L = WsLayout<D, BN, NC>;
    extern __shared__ __align__(1024) unsigned char ws_smem[];
    const unsigned base = (smem_addr(ws_smem) + 1023u) & ~1023u;
    const unsigned sQ = base + L::Q, sK = base + L::K, sV = base + L::V, bars = base + L::BARS;
    // mbarriers: Q full; K full[2], V full[2] (producer arrives + TMA bytes); K empty[2], V
    // empty[2] (the 4 * NC consumer warps arrive once they no longer read the stage); Q empty
    // (the consumer warps arrive once their last S of a tile is done).
    const unsigned full_q = bars, full_k = bars + 8, full_v = bars + 24, empty_k = bars + 40, empty_v = bars + 56,
                   empty_q = bars + 72, tile_slot = bars + 80;

    // Persistent: block blockIdx.x takes tile blockIdx.x of the m_blocks x Hq x B tiles, then
    // whichever is next when its producer is ready for one (`next_tile`, zeroed by the host,
    // counts the tiles taken past the first gridDim.x), so the causal tiles' unequal work
    // balances itself. The K/V ring and the Q buffer carry on from one tile to the next: the
    // next tile's first K/V tiles and its Q load while this one's last products and stores run.
    const int m_blocks = (Nq + BM - 1) / BM, heads = Hq * B, tiles = m_blocks * heads;
    const int diag = Nkv - Nq;  // causal: key j is visible to query i when j <= i + diag
    struct Tile {
        int m0, bh_q, bh_kv, n_blocks;
    };
    auto tile_of = [&](int t) {
        Tile r;
        // head-major (the blocks running at once share a head's K and V in L2), the heaviest
        // causal row blocks of each head first
        const int bh = t / m_blocks, mb = m_blocks - 1 - t % m_blocks, h = bh % Hq, b = bh / Hq;
        r.m0 = mb * BM;
        r.bh_q = bh;
        r.bh_kv = b * Hkv + h / (Hq / Hkv);
        const int n_end = causal ? min(Nkv, r.m0 + BM + diag) : Nkv;
        r.n_blocks = n_end > 0 ? (n_end + BN - 1) / BN : 0;
        return r;
    };
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wg = warp >> 2;

    if (threadIdx.x == 0) {
        mbar_init(full_q, 1);
#pragma unroll
        for (int s = 0; s < 2; ++s) {
            mbar_init(full_k + 8 * s, 1);
            mbar_init(full_v + 8 * s, 1);
            mbar_init(empty_k + 8 * s, 4 * NC);
            mbar_init(empty_v + 8 * s, 4 * NC);
        }
        mbar_init(empty_q, 4 * NC);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {
        // Producer: one thread issues every copy.
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGS) : "memory");
        if (threadIdx.x == 0) {
            int g = 0, qi = 0;  // K/V tiles and Q tiles loaded so far (ring and buffer positions)
            // Tells the consumers their next tile (t; tiles or more: none left) once the Q buffer
            // is free, with its Q load (or a plain arrival where the tile has no key tile or
            // there is no tile).
            auto announce = [&](int t, int m0, int bh_q, bool load) {
                if (qi > 0) mbar_wait(empty_q, (qi - 1) & 1);
                // an atomic store, as the consumers' reads are atomic (the mbarrier below orders
                // them)
                atomicExch((int*)(ws_smem + (tile_slot - smem_addr(ws_smem))), t);
                if (load) {
                    mbar_expect_tx(full_q, BM * D * 2);
#pragma unroll
                    for (int hh = 0; hh < HALVES; ++hh) tma_load_3d(sQ + hh * BM * 128, mq, full_q, hh * 64, m0, bh_q);
                } else {
                    mbar_arrive(full_q);
                }
                ++qi;
            };
            for (int t = blockIdx.x;; t = atomicAdd(next_tile, 1) + gridDim.x) {
                if (t >= tiles) {
                    announce(t, 0, 0, false);
                    break;
                }
                const Tile tl = tile_of(t);
                if (tl.n_blocks == 0) announce(t, 0, 0, false);
                for (int j = 0; j < tl.n_blocks; ++j, ++g) {
                    const int s = g & 1;
                    const unsigned ph = ((g >> 1) & 1) ^ 1;  // the first use of a stage does not wait
                    mbar_wait(empty_k + 8 * s, ph);
                    mbar_expect_tx(full_k + 8 * s, L::TILE);
#pragma unroll
                    for (int hh = 0; hh < HALVES; ++hh)
                        tma_load_3d(sK + s * L::TILE + hh * BN * 128, mk, full_k + 8 * s, hh * 64, j * BN, tl.bh_kv);
                    // Q after the first K: the buffer frees when the last tile's S are done
                    if (j == 0) announce(t, tl.m0, tl.bh_q, true);
                    mbar_wait(empty_v + 8 * s, ph);
                    mbar_expect_tx(full_v + 8 * s, L::TILE);
#pragma unroll
                    for (int hh = 0; hh < HALVES; ++hh)
                        tma_load_3d(sV + s * L::TILE + hh * BN * 128, mv, full_v + 8 * s, hh * 64, j * BN, tl.bh_kv);
                }
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS) : "memory");
        const int cw = wg - 1;  // consumer 0 .. NC-1: query rows m0 + 64 * cw + [0, 64)
        const int g = lane >> 2, tq = lane & 3;
        int gk = 0, qi = 0;  // K/V tiles and Q tiles consumed so far (as the producer counts)
        for (;;) {
            mbar_wait(full_q, qi & 1);
            // one atomic read a warp (atomic, so racecheck sees no plain read racing the
            // producer's store; one a warp, as a block's 384 or 512 on one word serialise)
            int t = 0;
            if (lane == 0) t = atomicOr((int*)(ws_smem + (tile_slot - smem_addr(ws_smem))), 0);
            t = __shfl_sync(0xffffffffu, t, 0);
            if (t >= tiles) break;
            const Tile tl = tile_of(t);
            const int m0 = tl.m0, n_blocks = tl.n_blocks;
            const int row0 = m0 + cw * 64 + (warp & 3) * 16 + g;  // this thread's rows: row0, row0 + 8
            float acc_o[ND][4], acc_s[NS][4];
            unsigned pa[BN / 16][4];
#pragma unroll
            for (int i = 0; i < ND; ++i) acc_o[i][0] = acc_o[i][1] = acc_o[i][2] = acc_o[i][3] = 0.f;
#pragma unroll
            for (int i = 0; i < BN / 16; ++i) pa[i][0] = pa[i][1] = pa[i][2] = pa[i][3] = 0u;
            float m_r[2] = {TANDEM_NEG_INF, TANDEM_NEG_INF}, l_r[2] = {0.f, 0.f};
#pragma unroll
            for (int i = 0; i < NS; ++i) acc_s[i][0] = acc_s[i][1] = acc_s[i][2] = acc_s[i][3] = 0.f;
            if (n_blocks == 0 && lane == 0) mbar_arrive(empty_q);  // no S: the Q buffer is free
            if (n_blocks > 0) {
                // Turn-taking: barrier 1 + c is consumer c's turn to issue; consumer 0 starts.
                if (cw == NC - 1) named_arrive(1, 256);
                const unsigned qa = sQ + cw * 64 * 128;
                // One step of the loop over key tiles: S of tile j (HS) and P V of tile j - 1 (HP);
                // gj = gk + j is tile j's place in the K/V ring.
                // The first step has no P V and the last no S; each step's shape is a template
                // argument so no wgmma sits in a branch the compiler cannot prove uniform (it
                // would serialise them: ptxas C7520).
                auto step = [&](auto hs, auto hp, int j, auto hm) {
                    constexpr bool has_s = decltype(hs)::value, has_pv = decltype(hp)::value;
                    constexpr bool more = decltype(hm)::value;
                    const int gj = gk + j;
                    const int s = gj & 1, sp = (gj + 1) & 1;
                    if constexpr (has_s) mbar_wait(full_k + 8 * s, (gj >> 1) & 1);
                    if constexpr (has_pv) mbar_wait(full_v + 8 * sp, ((gj - 1) >> 1) & 1);
                    named_sync(1 + cw, 256);
                    ws_fence();
                    if constexpr (has_s) {
#pragma unroll
                        for (int kk = 0; kk < D / 16; ++kk) {
                            const unsigned col = (kk & 3) * 32;
                            ws_qk<F16>(acc_s, desc_sw128(qa + (kk >> 2) * BM * 128 + col, 16, 1024),
                                       desc_sw128(sK + s * L::TILE + (kk >> 2) * BN * 128 + col, 16, 1024), kk > 0);
                        }
                        ws_commit();
                    }
                    if constexpr (has_pv) {
#pragma unroll
                        for (int kk = 0; kk < BN / 16; ++kk)
                            ws_pv<F16, D>(acc_o, pa[kk], desc_sw128(sV + sp * L::TILE + kk * 16 * 128, BN * 128, 1024));
                        ws_commit();
                    }
                    // Hand the turn to the next consumer (the last one's final hand-over would have no
                    // taker). A d64 consumer that skips the tile's last key tiles (causal) takes a
                    // step without S before the tile's last one (`hm`: more steps follow), and
                    // the others still take turns.
                    if (cw < NC - 1 || has_s || more) named_arrive(1 + (cw + 1) % NC, 256);
                    float alpha[2] = {1.f, 1.f};  // O's rescale factor from this tile's softmax
                    if constexpr (has_s) {
                        if constexpr (has_pv) ws_wait<1>();
                        else ws_wait<0>();
                        pin(acc_s);
                        if (lane == 0) mbar_arrive(empty_k + 8 * s);
                        const int n0 = j * BN;
                        if (n0 + BN > Nkv || (causal && n0 + BN - 1 > m0 + cw * 64 + diag)) {
#pragma unroll
                            for (int nt = 0; nt < NS; ++nt)
#pragma unroll
                                for (int e = 0; e < 4; ++e) {
                                    const int key = n0 + nt * 8 + tq * 2 + (e & 1);
                                    const int i = row0 + (e >> 1) * 8;
                                    if (key >= Nkv || (causal && key > i + diag)) acc_s[nt][e] = TANDEM_NEG_INF;
                                }
                        }
#pragma unroll
                        for (int r = 0; r < 2; ++r) {
                            // four partial maxima and sums: short dependency chains
                            float mp[4] = {m_r[r], TANDEM_NEG_INF, TANDEM_NEG_INF, TANDEM_NEG_INF};
#pragma unroll
                            for (int nt = 0; nt < NS; ++nt)
                                mp[nt & 3] = fmaxf(mp[nt & 3], fmaxf(acc_s[nt][2 * r], acc_s[nt][2 * r + 1]));
                            float mx = fmaxf(fmaxf(mp[0], mp[1]), fmaxf(mp[2], mp[3]));
                            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                            const float m_use = mx == TANDEM_NEG_INF ? 0.f : mx;
                            alpha[r] = fast_exp2((m_r[r] - m_use) * scale_log2);
                            m_r[r] = mx;
                            const float mb = m_use * scale_log2;
                            float sp[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                            for (int nt = 0; nt < NS; ++nt) {
                                acc_s[nt][2 * r] = fast_exp2(fmaf(acc_s[nt][2 * r], scale_log2, -mb));
                                acc_s[nt][2 * r + 1] = fast_exp2(fmaf(acc_s[nt][2 * r + 1], scale_log2, -mb));
                                sp[nt & 3] += acc_s[nt][2 * r] + acc_s[nt][2 * r + 1];
                            }
                            const float rs = (sp[0] + sp[1]) + (sp[2] + sp[3]);
                            l_r[r] = l_r[r] * alpha[r] + rs;
                        }
                    }
                    if constexpr (has_pv) {
                        ws_wait<0>();
                        pin(acc_o);
                        pin(pa);
                        if (lane == 0) mbar_arrive(empty_v + 8 * sp);
                    }
                    if constexpr (has_s) {
#pragma unroll
                        for (int dt = 0; dt < ND; ++dt) {
                            acc_o[dt][0] *= alpha[0];
                            acc_o[dt][1] *= alpha[0];
                            acc_o[dt][2] *= alpha[1];
                            acc_o[dt][3] *= alpha[1];
                        }
#pragma unroll
                        for (int kk = 0; kk < BN / 16; ++kk) {
                            pa[kk][0] = ws_pack<F16>(acc_s[2 * kk][0], acc_s[2 * kk][1]);
                            pa[kk][1] = ws_pack<F16>(acc_s[2 * kk][2], acc_s[2 * kk][3]);
                            pa[kk][2] = ws_pack<F16>(acc_s[2 * kk + 1][0], acc_s[2 * kk + 1][1]);
                            pa[kk][3] = ws_pack<F16>(acc_s[2 * kk + 1][2], acc_s[2 * kk + 1][3]);
                        }
                    }
                };
                // d64 only (NC 3; the d128 build compiles without these branches: it measured 1-2%
                // slower with the first, and its 128-row blocks waste less):
                // - idle: all 64 of this consumer's rows lie past Nq (a head's last row block), so it
                //   has no product to take;
                // - causal: the tile's key tiles end at its last row's diagonal; this consumer's
                //   rows see only the first n_c of them, the rest are wholly masked for it.
                // Either way it keeps its turns and its ring arrivals (the others' barriers and the
                // ring's counts hold) and issues nothing for the tiles it skips.
                const bool idle = NC == 3 && m0 + cw * 64 >= Nq;
                int n_c = n_blocks;
                if constexpr (CSKIP) {
                    const int end = m0 + cw * 64 + 64 + diag;  // keys below end: visible to a row
                    n_c = end > 0 ? min(n_blocks, (end + BN - 1) / BN) : 0;
                }
                auto idle_step = [&](bool has_s, bool has_pv, int j) {
                    const int gj = gk + j;
                    const int s = gj & 1, sp = (gj + 1) & 1;
                    if (has_s) mbar_wait(full_k + 8 * s, (gj >> 1) & 1);
                    if (has_pv) mbar_wait(full_v + 8 * sp, ((gj - 1) >> 1) & 1);
                    named_sync(1 + cw, 256);
                    if (cw < NC - 1 || has_s) named_arrive(1 + (cw + 1) % NC, 256);
                    if (has_s && lane == 0) mbar_arrive(empty_k + 8 * s);
                    if (has_pv && lane == 0) mbar_arrive(empty_v + 8 * sp);
                };
                if (idle || n_c == 0) {
                    idle_step(true, false, 0);
                    for (int j = 1; j < n_blocks; ++j) idle_step(true, true, j);
                    if (lane == 0) mbar_arrive(empty_q);
                    idle_step(false, true, n_blocks);
                } else if (n_c < n_blocks) {
                    step(ws_bool<true>(), ws_bool<false>(), 0, ws_bool<false>());
                    for (int j = 1; j < n_c; ++j) step(ws_bool<true>(), ws_bool<true>(), j, ws_bool<false>());
                    if (lane == 0) mbar_arrive(empty_q);  // this consumer's S are done
                    step(ws_bool<false>(), ws_bool<true>(), n_c, ws_bool<true>());  // P V of tile n_c - 1
                    {  // tile n_c's K, not read
                        const int gj = gk + n_c;
                        mbar_wait(full_k + 8 * (gj & 1), (gj >> 1) & 1);
                        if (lane == 0) mbar_arrive(empty_k + 8 * (gj & 1));
                    }
                    for (int j = n_c + 1; j < n_blocks; ++j) idle_step(true, true, j);
                    idle_step(false, true, n_blocks);
                } else {
                    step(ws_bool<true>(), ws_bool<false>(), 0, ws_bool<false>());
                    for (int j = 1; j < n_blocks; ++j) step(ws_bool<true>(), ws_bool<true>(), j, ws_bool<false>());
                    // every S of this tile is done: the producer may load the next Q
                    if (lane == 0) mbar_arrive(empty_q);
                    step(ws_bool<false>(), ws_bool<true>(), n_blocks, ws_bool<false>());
                }
                gk += n_blocks;
                // every consumer is past its last turn before the next tile's first hand-over
                named_sync(1 + NC, 128 * NC);
            }
            unsigned short* o = O + (u64_t)tl.bh_q * Nq * D;
            float* lse = LSE + (u64_t)tl.bh_q * Nq;
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                float l = l_r[r];
                l += __shfl_xor_sync(0xffffffffu, l, 1);
                l += __shfl_xor_sync(0xffffffffu, l, 2);
                const int i = row0 + r * 8;
                const float inv = l > 0.f ? 1.f / l : 0.f;
                if (i < Nq) {
                    unsigned short* orow = o + (u64_t)i * D;
#pragma unroll
                    for (int dt = 0; dt < ND; ++dt)
                        *(unsigned*)(orow + dt * 8 + tq * 2) =
                            ws_pack<F16>(acc_o[dt][2 * r] * inv, acc_o[dt][2 * r + 1] * inv);
                    if (tq == 0)
                        lse[i] = l > 0.f ? (m_r[r] * scale_log2 + __log2f(l)) * 0.69314718055994531f : TANDEM_NEG_INF;
                }
            }
            ++qi;
        }
    }
}

#define WS_ENTRY(NAME, D, F16)                                                                        \
    extern "C" __global__ void __launch_bounds__(128 * (1 + WS_NC(D)), 1) NAME(                        \
            const __grid_constant__ tma_map_t mq, const __grid_constant__ tma_map_t mk,                \
            const __grid_constant__ tma_map_t mv, unsigned short* __restrict__ o, float* __restrict__ lse, \
            int Hq, int Hkv, int Nq, int Nkv, float scale_log2, int causal, int B, int* next_tile) {   \
        constexpr int BN = WS_BN(D), NC = WS_NC(D);                                                    \
        if (NC == 3 && causal)                                                                         \
            attn_fwd_ws<D, BN, NC, F16, NC == 3>(&mq, &mk, &mv, o, lse, Hq, Hkv, Nq, Nkv, scale_log2,  \
                                                  causal, B, next_tile);                               \
        else                                                                                           \
            attn_fwd_ws<D, BN, NC, F16, false>(&mq, &mk, &mv, o, lse, Hq, Hkv, Nq, Nkv, scale_log2,    \
                                               causal, B, next_tile);                                  \
    }
WS_ENTRY(mha_bf16_fwd_d64_ws, 64, false)
WS_ENTRY(mha_bf16_fwd_d128_ws, 128, false)
WS_ENTRY(mha_bf16_fwd_d256_ws, 256, false)
WS_ENTRY(mha_f16_fwd_d64_ws, 64, true)
WS_ENTRY(mha_f16_fwd_d128_ws, 128, true)
WS_ENTRY(mha_f16_fwd_d256_ws, 256, true)
