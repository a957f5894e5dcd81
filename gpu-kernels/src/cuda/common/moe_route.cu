// MoE routing, two ways.
//
// The fused path (`moe_route_fused_{f32,bf16,f16}_v{1,2,4,8}`, E <= 32 * v): one persistent
// cooperative launch (grid = co-resident blocks) that does everything, with two grid-wide
// barriers; see the comment above `moe_route_fused_impl` below.
//
// The three-launch path (devices without cooperative launch):
//  1. moe_topk_softmax_f32 (bf16 logits; `_f32_f16`: f16 logits; `_f32_f32`: f32): one warp
//     per token: softmax over E experts in f32, top-k by logit (equal logits: lower expert
//     index first), optional renormalisation; per block, the expert histogram, the
//     routing-probability sums and the sum of lse^2 (for the losses).
//     Block b covers tokens [b*TPB, (b+1)*TPB), so its slots t*k+j are one contiguous range.
//  2. moe_align_scan: one block: expert counts, block-padded segment offsets, where each
//     block's slots of each expert start, the padding sentinels, aux and z losses.
//  3. moe_align_scatter: one warp per block of step 1 writes its slots into the segments in
//     ascending slot order (stable), so the permutation is deterministic.

#define ROUTE_WARPS 8
#define ROUTE_TOKENS_PER_WARP 8
#define ROUTE_TPB (ROUTE_WARPS * ROUTE_TOKENS_PER_WARP)
#define ROUTE_MAX_VPL 8  // logits per lane: E <= 256

// How logits stored as f32, bf16 or f16 are read (the math is f32 whatever the storage):
// one value (`ld`), or the values packed in 32-bit words (`words`, lowest address first).
struct RouteF32 {
    typedef float T;
    static __device__ __forceinline__ float ld(const float* p) { return __ldg(p); }
    template <int N>
    static __device__ __forceinline__ void words(const unsigned (&w)[N], float* out) {
#pragma unroll
        for (int i = 0; i < N; ++i) out[i] = __uint_as_float(w[i]);
    }
};
// 16-bit storage (CRTP): `Self::cv` widens one raw value to f32.
template <typename Self>
struct Route16 {
    typedef h16_t T;
    static __device__ __forceinline__ float ld(const h16_t* p) { return Self::cv(__ldg(p)); }
    template <int N>
    static __device__ __forceinline__ void words(const unsigned (&w)[N], float* out) {
#pragma unroll
        for (int i = 0; i < N; ++i) {
            out[2 * i] = Self::cv((h16_t)(w[i] & 0xffffu));
            out[2 * i + 1] = Self::cv((h16_t)(w[i] >> 16));
        }
    }
};
struct RouteBF16 : Route16<RouteBF16> {
    static __device__ __forceinline__ float cv(h16_t h) { return bf2f(h); }
};
struct RouteF16 : Route16<RouteF16> {
    static __device__ __forceinline__ float cv(h16_t h) { return h2f(h); }
};

// Logits are stored as S::T; the softmax, top-k and sums run in f32.
template <typename S>
__device__ __forceinline__ void moe_topk_softmax_impl(
        const typename S::T* __restrict__ logits, int T, int E, int k, int renorm,
        int* __restrict__ topk_ids, float* __restrict__ topk_w,
        int* __restrict__ block_counts, float* __restrict__ block_psum, float* __restrict__ block_z) {
    extern __shared__ float route_smem[];
    float* psum = route_smem;              // [E]
    int* hist = (int*)(route_smem + E);    // [E]
    __shared__ float zacc;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int e = threadIdx.x; e < E; e += blockDim.x) { psum[e] = 0.f; hist[e] = 0; }
    if (threadIdx.x == 0) zacc = 0.f;
    __syncthreads();
    for (int i = 0; i < ROUTE_TOKENS_PER_WARP; ++i) {
        const int t = blockIdx.x * ROUTE_TPB + warp * ROUTE_TOKENS_PER_WARP + i;
        if (t >= T) break;
        const typename S::T* row = logits + (u64_t)t * E;
        float v[ROUTE_MAX_VPL];
        float mx = TANDEM_NEG_INF;
#pragma unroll
        for (int j = 0; j < ROUTE_MAX_VPL; ++j) {
            const int e = lane + 32 * j;
            v[j] = e < E ? S::ld(row + e) : TANDEM_NEG_INF;
            mx = fmaxf(mx, v[j]);
        }
        mx = warp_max(mx);
        float s = 0.f;
        float p[ROUTE_MAX_VPL];
#pragma unroll
        for (int j = 0; j < ROUTE_MAX_VPL; ++j) {
            p[j] = (lane + 32 * j) < E ? expf(v[j] - mx) : 0.f;
            s += p[j];
        }
        s = warp_sum(s);
        const float inv = 1.f / s;
#pragma unroll
        for (int j = 0; j < ROUTE_MAX_VPL; ++j) {
            const int e = lane + 32 * j;
            if (e < E) {
                p[j] *= inv;
                atomicAdd(&psum[e], p[j]);
            }
        }
        if (lane == 0) {
            const float lse = mx + logf(s);
            atomicAdd(&zacc, lse * lse);
        }
        // top-k by logit; ties to the lower index
        float wsum = 0.f, my_w = 0.f;
        int my_id = 0;
        for (int r = 0; r < k; ++r) {
            float bv = TANDEM_NEG_INF;
            int bi = 0x7fffffff;
            float bp = 0.f;
#pragma unroll
            for (int j = 0; j < ROUTE_MAX_VPL; ++j) {
                const int e = lane + 32 * j;
                if (e < E && (v[j] > bv || (v[j] == bv && e < bi))) { bv = v[j]; bi = e; bp = p[j]; }
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
                const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
                const float op = __shfl_xor_sync(0xffffffffu, bp, o);
                if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; bp = op; }
            }
            // the owner removes the winner from its candidates
            if ((bi & 31) == lane) {
#pragma unroll
                for (int j = 0; j < ROUTE_MAX_VPL; ++j)
                    if (lane + 32 * j == bi) v[j] = TANDEM_NEG_INF, p[j] = -1.f;
            }
            // ties among -inf leftovers cannot happen while k <= E: every real logit is finite
            wsum += bp;
            if (lane == r) { my_id = bi; my_w = bp; }
            if (lane == 0) atomicAdd(&hist[bi], 1);
        }
        if (lane < k) {
            topk_ids[(u64_t)t * k + lane] = my_id;
            topk_w[(u64_t)t * k + lane] = renorm ? my_w / wsum : my_w;
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        block_counts[(u64_t)blockIdx.x * E + e] = hist[e];
        block_psum[(u64_t)blockIdx.x * E + e] = psum[e];
    }
    if (threadIdx.x == 0) block_z[blockIdx.x] = zacc;
}

// f32 math on bf16 logits (`moe_topk_softmax_f32`), f16 logits (`_f32_f16`) and f32 logits
// (`_f32_f32`).
#define TOPK_ENTRY(NAME, S)                                                                     \
    extern "C" __global__ void __launch_bounds__(ROUTE_WARPS * 32) NAME(                        \
            const S::T* __restrict__ logits, int T, int E, int k, int renorm,                  \
            int* __restrict__ topk_ids, float* __restrict__ topk_w, int* __restrict__ block_counts, \
            float* __restrict__ block_psum, float* __restrict__ block_z) {                      \
        moe_topk_softmax_impl<S>(logits, T, E, k, renorm, topk_ids, topk_w, block_counts,       \
                                 block_psum, block_z);                                          \
    }
TOPK_ENTRY(moe_topk_softmax_f32, RouteBF16)
TOPK_ENTRY(moe_topk_softmax_f32_f16, RouteF16)
TOPK_ENTRY(moe_topk_softmax_f32_f32, RouteF32)

// Exclusive prefix sum over the block (blockDim.x <= 1024); `tmp` holds 32 ints of shared
// memory; returns the exclusive prefix and writes the total to *total.
__device__ __forceinline__ int block_exclusive_scan(int v, int* tmp, int* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads();
    if (lane == 31) tmp[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int w = lane < nwarps ? tmp[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += y;
        }
        if (lane < nwarps) tmp[lane] = w;  // inclusive warp totals
    }
    __syncthreads();
    const int before = warp > 0 ? tmp[warp - 1] : 0;
    *total = tmp[nwarps - 1];
    return before + x - v;
}

// One block of 1024 threads. Thread (r, e) of R = 1024 / E groups covers routing blocks
// [r*C, (r+1)*C) for expert e. block_base[b][e]: first position in sorted_token_ids of block
// b's slots routed to expert e.
extern "C" __global__ void __launch_bounds__(1024) moe_align_scan(
        const int* __restrict__ block_counts, const float* __restrict__ block_psum,
        const float* __restrict__ block_z, int nblocks, int T, int E, int k, int bs, int P,
        int* __restrict__ block_base, int* __restrict__ expert_counts, int* __restrict__ expert_offsets,
        int* __restrict__ sorted, float* __restrict__ aux_loss, float* __restrict__ z_loss) {
    extern __shared__ int scan_smem[];
    const int R = max(1, (int)blockDim.x / E);
    const int C = (nblocks + R - 1) / R;
    int* part = scan_smem;                       // [R][E] partial counts, then group starts
    float* pps = (float*)(scan_smem + R * E);    // [R][E] partial prob sums
    int* cnt = scan_smem + 2 * R * E;            // [E]
    int* off = cnt + E;                          // [E+1]
    int* tmp = off + E + 1;                      // [32]
    float* red = (float*)(tmp + 32);             // [32]
    const int sentinel = T * k;
    const int tid = threadIdx.x;
    const int e = tid % E, r = tid / E;
    const bool worker = r < R && tid < R * E;
    if (worker) {
        int c = 0;
        float ps = 0.f;
        const int b1 = min(nblocks, (r + 1) * C);
        for (int b = r * C; b < b1; ++b) {
            c += block_counts[(u64_t)b * E + e];
            ps += block_psum[(u64_t)b * E + e];
        }
        part[r * E + e] = c;
        pps[r * E + e] = ps;
    }
    __syncthreads();
    // per expert: totals, and each group's start within the expert's segment
    int padded = 0;
    float a = 0.f;
    if (tid < E) {
        int acc = 0;
        float ps = 0.f;
        for (int g = 0; g < R; ++g) {
            const int c = part[g * E + tid];
            part[g * E + tid] = acc;
            acc += c;
            ps += pps[g * E + tid];
        }
        cnt[tid] = acc;
        expert_counts[tid] = acc;
        padded = (acc + bs - 1) / bs * bs;
        a = ((float)acc / (float)T) * (ps / (float)T);
    }
    int total;
    const int excl = block_exclusive_scan(tid < E ? padded : 0, tmp, &total);
    if (tid < E) {
        off[tid] = excl;
        expert_offsets[tid] = excl;
    }
    if (tid == 0) {
        off[E] = total;
        expert_offsets[E] = total;
    }
    __syncthreads();
    if (worker) {
        int run = off[e] + part[r * E + e];
        const int b1 = min(nblocks, (r + 1) * C);
        for (int b = r * C; b < b1; ++b) {
            block_base[(u64_t)b * E + e] = run;
            run += block_counts[(u64_t)b * E + e];
        }
    }
    // padding inside each segment, then the tail after the last one
    for (int i = tid; i < E * bs; i += blockDim.x) {
        const int x = i / bs, pos = off[x] + cnt[x] + i % bs;
        if (pos < off[x + 1]) sorted[pos] = sentinel;
    }
    for (int pos = off[E] + tid; pos < P; pos += blockDim.x) sorted[pos] = sentinel;
    // losses: aux = E * sum_e (count_e / T) * mean_t p[t, e]; z = mean_t lse_t^2
    a = block_sum(a, red);
    float z = 0.f;
    for (int b = tid; b < nblocks; b += blockDim.x) z += block_z[b];
    z = block_sum(z, red);
    if (tid == 0) {
        aux_loss[0] = T > 0 ? (float)E * a : 0.f;
        z_loss[0] = T > 0 ? z / (float)T : 0.f;
    }
}

// One warp per routing block: places the block's slots, in ascending order, into the segments.
extern "C" __global__ void __launch_bounds__(32) moe_align_scatter(
        const int* __restrict__ topk_ids, const int* __restrict__ block_base, int T, int E, int k,
        int* __restrict__ sorted) {
    extern __shared__ int next[];  // [E]
    const int lane = threadIdx.x;
    for (int e = lane; e < E; e += 32) next[e] = block_base[(u64_t)blockIdx.x * E + e];
    __syncwarp();
    const int first = blockIdx.x * ROUTE_TPB * k;
    const int last = min(T, (int)(blockIdx.x + 1) * ROUTE_TPB) * k;
    for (int s0 = first; s0 < last; s0 += 32) {
        const int s = s0 + lane;
        const bool ok = s < last;
        const int e = ok ? topk_ids[s] : -1 - lane;  // unique keys for idle lanes
        const unsigned peers = __match_any_sync(0xffffffffu, e);
        const unsigned lower = peers & ((1u << lane) - 1u);
        if (ok) sorted[next[e] + __popc(lower)] = s;
        __syncwarp();
        if (ok && lower == 0) next[e] += __popc(peers);
        __syncwarp();
    }
}

// ---------------------------------------------------------------------------------------------
// The fused path: one cooperative launch of FR_THREADS-thread blocks, G = gridDim.x of them all
// co-resident (the host sizes the grid from the occupancy and launches it cooperatively, so
// the spin barriers below cannot dead-lock). Block b owns the contiguous tokens
// [b*C, (b+1)*C), C = ceil(T / G); warp w of it the contiguous sub-range
// [b*C + w*Cw, b*C + (w+1)*Cw), Cw = ceil(C / W) for W warps a block (16 in the shipped
// builds; the probe and the emulator also instantiate 8). So the slots t*k+j of a warp, of a
// block, are one contiguous range each, and placing each warp's slots in ascending order
// after the slots of the warps and blocks before it keeps every expert's segment in slot
// order (stable, as the reference's counting sort).
//  phase 1  per token (one warp; lane l holds experts l*V .. l*V+V-1): softmax in f32, top-k
//           by logit (equal logits: lower expert first) from each lane's candidates sorted
//           once in registers (each round: the warp's largest head, its lane pops it),
//           optional renormalisation; per warp the expert histogram (shared), per lane the
//           summed probabilities of its experts and lse^2 (registers). Per block: counts and
//           probability sums to cnt[e][b], ps[e][b], lse^2 sum to zs[b].
//  barrier
//  phase 2a block b, for experts e = b, b+G, ...: exclusive scan of cnt[e][0..G) in place
//           (where block b's slots of expert e start within the segment), the total count
//           and the summed probability; the last block sums zs.
//  barrier
//  phase 2b every block: padded segment offsets from the totals (one block scan); block 0
//           writes expert_counts, expert_offsets and the losses; the padding sentinels are
//           written by the blocks that own each expert, the tail grid-stride.
//  phase 3  every warp places its slots: cursor = offset + block's start + earlier warps'
//           counts, ranks among equal experts in 32-slot steps by __match_any_sync.
// Sums are reduced in a fixed order for a given G (deterministic on a given device).

// 512 threads: against 256, a block a multiprocessor fewer for the same warps, so shorter
// barriers and columns (benches/peers/route_probe.cu, an H200, 2026-11-28: 0.3-3 us less on
// each of issue 15's routing rows).
#define FR_THREADS 512
#define FR_WARPS (FR_THREADS / 32)
#define FR_MAX_E 256

// A total order on finite floats as unsigned keys (larger float, larger key); -0 is keyed as
// +0 so the two tie, as the f32 comparison of the reference has them. 0 is below every key
// of a float, so it marks "no candidate".
__device__ __forceinline__ unsigned route_key(float v) {
    unsigned u = __float_as_uint(v);
    if (u == 0x80000000u) u = 0u;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float route_unkey(unsigned k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// ---- ptx (gpu-kernels/emu/route_main.cpp stands in for this section)
__device__ __forceinline__ unsigned route_ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
// ---- end ptx

// Grid-wide barrier number `n` (1, 2, ...) on the counter *bar (zero before the launch).
__device__ __forceinline__ void route_grid_sync(unsigned* bar, unsigned n) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned target = n * gridDim.x;
        __threadfence();
        atomicAdd(bar, 1u);
        unsigned seen;
        do {
            seen = route_ld_acquire(bar);
        } while (seen < target);
        __threadfence();
    }
    __syncthreads();
}

// The barrier of the `_g` builds: a module global that every barrier leaves as it found it,
// so nothing zeroes it before a launch (no memset). Block 0 adds 2^31 - (G - 1), the others
// 1 each: after the last arrival the word has gained exactly 2^31, so its top bit has flipped
// and its low bits are back where they were (zero since the module was loaded). Each block
// waits for the top bit to differ from the value its own arrival saw (the flip happens only
// at the last arrival, so every arrival sees the old top bit). Launches of the routing
// kernels on one device are ordered on its one compute stream, so no two use it at once.
__device__ unsigned route_gen_bar;

__device__ __forceinline__ void route_grid_sync_gen(unsigned* bar) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned inc = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1u) : 1u;
        __threadfence();
        const unsigned old = atomicAdd(bar, inc);
        while (((route_ld_acquire(bar) ^ old) & 0x80000000u) == 0u) {
        }
        __threadfence();
    }
    __syncthreads();
}

// Phase stamps for benches/peers/route_probe.cu (never in the shipped builds): thread 0 of
// each block writes %globaltimer at the kernel's start, around each grid barrier and at its end.
#ifdef TANDEM_ROUTE_PROBE
__device__ unsigned long long route_probe_stamps[4096 * 6];
#define ROUTE_STAMP(i)                                                                          \
    do {                                                                                        \
        if (threadIdx.x == 0 && blockIdx.x < 4096) {                                            \
            unsigned long long t_;                                                              \
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_));                              \
            route_probe_stamps[blockIdx.x * 6 + (i)] = t_;                                      \
        }                                                                                       \
    } while (0)
#else
#define ROUTE_STAMP(i) \
    do {               \
    } while (0)
#endif

// Lane `lane`'s V logits of token t, experts lane * V .. lane * V + V - 1 (absent ones 0).
// `whole`: E == 32 V and the logits 16-byte aligned, so each lane's run is one aligned block
// of V values, read 16, 8 or 4 bytes at a time.
template <typename S, int V>
__device__ __forceinline__ void route_ld_token(const typename S::T* __restrict__ logits, int t,
                                               int E, int lane, bool whole, float (&v)[V]) {
    const typename S::T* p = logits + (u64_t)t * E + lane * V;
    constexpr int NW = V * (int)sizeof(typename S::T) / 4;  // 32-bit words in a lane's run
    constexpr int PER_WORD = 4 / (int)sizeof(typename S::T);
    if (whole) {
        if constexpr (NW >= 4) {
#pragma unroll
            for (int q = 0; q < NW / 4; ++q) {
                const uint4 x = __ldg((const uint4*)p + q);
                const unsigned w[4] = {x.x, x.y, x.z, x.w};
                S::words(w, v + q * 4 * PER_WORD);
            }
            return;
        } else if constexpr (NW == 2) {
            const uint2 x = __ldg((const uint2*)p);
            const unsigned w[2] = {x.x, x.y};
            S::words(w, v);
            return;
        } else if constexpr (NW == 1) {
            const unsigned w[1] = {__ldg((const unsigned*)p)};
            S::words(w, v);
            return;
        }
    }
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = lane * V + j < E ? S::ld(p + j) : 0.f;
}

// Sorts a[0..V) (V 1, 2, 4 or 8) into descending order in registers: Batcher's odd-even merge
// sort written out (19 compare-exchanges at V 8), so every index is a constant and `a` never
// leaves registers.
template <int I, int J, int V>
__device__ __forceinline__ void route_cx(u64_t (&a)[V]) {
    const u64_t x = a[I], y = a[J];
    a[I] = x > y ? x : y;
    a[J] = x > y ? y : x;
}
template <int V>
__device__ __forceinline__ void route_sort_desc(u64_t (&a)[V]) {
    static_assert(V == 1 || V == 2 || V == 4 || V == 8, "V is 1, 2, 4 or 8");
    if constexpr (V == 2) {
        route_cx<0, 1>(a);
    } else if constexpr (V == 4) {
        route_cx<0, 1>(a); route_cx<2, 3>(a);
        route_cx<0, 2>(a); route_cx<1, 3>(a);
        route_cx<1, 2>(a);
    } else if constexpr (V == 8) {
        route_cx<0, 1>(a); route_cx<2, 3>(a); route_cx<4, 5>(a); route_cx<6, 7>(a);
        route_cx<0, 2>(a); route_cx<1, 3>(a); route_cx<4, 6>(a); route_cx<5, 7>(a);
        route_cx<1, 2>(a); route_cx<5, 6>(a);
        route_cx<0, 4>(a); route_cx<1, 5>(a); route_cx<2, 6>(a); route_cx<3, 7>(a);
        route_cx<2, 4>(a); route_cx<3, 5>(a);
        route_cx<1, 2>(a); route_cx<3, 4>(a); route_cx<5, 6>(a);
    }
}

// V logits per lane: E <= 32 * V. Scratch (ws): cnt [E][G] ints, ps [E][G] floats, zs [G],
// tot_cnt [E], tot_p [E], tot_z [1]; bar: one counter, zeroed before the launch (GEN false),
// or the self-resetting word of route_grid_sync_gen (GEN true).
template <typename S, int V, bool GEN, int W = FR_WARPS>
__device__ __forceinline__ void moe_route_fused_impl(
        const typename S::T* __restrict__ logits, int T, int E, int k, int renorm, int bs, int P,
        int* __restrict__ topk_ids, float* __restrict__ topk_w, int* __restrict__ expert_counts,
        int* __restrict__ sorted, int* __restrict__ expert_offsets, float* __restrict__ aux_loss,
        float* __restrict__ z_loss, int* cnt, float* ps, float* zs, int* tot_cnt, float* tot_p,
        float* tot_z, unsigned* bar) {
    __shared__ int hist[W][FR_MAX_E];    // per-warp counts, then per-warp cursors
    __shared__ float psw[W][FR_MAX_E];   // per-warp probability sums
    __shared__ int off[FR_MAX_E + 1];
    __shared__ int ecnt[FR_MAX_E];
    __shared__ float zw[W];
    __shared__ int itmp[32];
    __shared__ float red[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, tid = threadIdx.x;
    const int G = gridDim.x, b = blockIdx.x;
    const unsigned full = 0xffffffffu;
    constexpr int NT = W * 32;  // threads a block
    static_assert(NT >= FR_MAX_E, "phase 2b/3 give each thread at most one expert");
    ROUTE_STAMP(0);

    // ---- phase 1
    const long long C = ((long long)T + G - 1) / G;
    const int c0 = (int)min((long long)T, (long long)b * C);
    const int c1 = (int)min((long long)T, (long long)c0 + C);
    const int cw = (c1 - c0 + W - 1) / W;
    const int t0 = min(c1, c0 + warp * cw), t1 = min(c1, t0 + cw);
    for (int e = lane; e < FR_MAX_E; e += 32) hist[warp][e] = 0;
    __syncwarp();
    float acc[V];
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] = 0.f;
    float zacc = 0.f;
    // Lane `lane` holds experts lane * V + j: a contiguous run, so among equal logits at the
    // heads of the lanes' lists the lowest lane holds the lowest expert.
    const bool whole = E == 32 * V && ((u64_t)logits & 15u) == 0;
    const float L2E = 1.4426950408889634f;  // exp(x) = 2^(x log2 e), on the MUFU unit
    float nv[V];
    if (t0 < t1) route_ld_token<S, V>(logits, t0, E, lane, whole, nv);
    for (int t = t0; t < t1; ++t) {
        float v[V];
#pragma unroll
        for (int j = 0; j < V; ++j) v[j] = nv[j];
        // the next token's logits load while this one is routed
        if (t + 1 < t1) route_ld_token<S, V>(logits, t + 1, E, lane, whole, nv);
        // the lane's candidates, largest key first (equal keys: lower j first); 0 = none
        u64_t a[V];
#pragma unroll
        for (int j = 0; j < V; ++j)
            a[j] = lane * V + j < E ? ((u64_t)route_key(v[j]) << 32) | (unsigned)(V - 1 - j) : 0ull;
        route_sort_desc<V>(a);
        const unsigned m0 = __reduce_max_sync(full, (unsigned)(a[0] >> 32));
        const float mx = route_unkey(m0);
        // k rounds: the largest head wins (equal heads: the lowest lane) and its lane pops it.
        // k <= 32: lane r keeps place r's expert and key; the weights come after the loop.
        float wsum = 0.f;
        unsigned my_key = 0u;
        int my_id = 0;
        for (int r = 0; r < k; ++r) {
            const unsigned hk = (unsigned)(a[0] >> 32);
            const unsigned m = r == 0 ? m0 : __reduce_max_sync(full, hk);
            const int wl = __ffs(__ballot_sync(full, hk == m)) - 1;
            const int win = wl * V + __shfl_sync(full, V - 1 - (int)(a[0] & 0xffu), wl);
            if (lane == wl) {
#pragma unroll
                for (int j = 0; j + 1 < V; ++j) a[j] = a[j + 1];
                a[V - 1] = 0ull;
            }
            if (lane == r) { my_id = win; my_key = m; }
            if (k > 32) {  // more places than lanes: written as they are found, unnormalised
                const float w = fast_exp2((route_unkey(m) - mx) * L2E);
                wsum += w;
                if (lane == 0) {
                    topk_ids[(u64_t)t * k + r] = win;
                    topk_w[(u64_t)t * k + r] = w;
                    atomicAdd(&hist[warp][win], 1);
                }
            }
        }
        // the softmax's sum and the top-k weights' sum, reduced together
        float s = 0.f, ex[V];
#pragma unroll
        for (int j = 0; j < V; ++j) {
            ex[j] = lane * V + j < E ? fast_exp2((v[j] - mx) * L2E) : 0.f;
            s += ex[j];
        }
        const float wk = k <= 32 && lane < k ? fast_exp2((route_unkey(my_key) - mx) * L2E) : 0.f;
        float ws = wk;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            s += __shfl_xor_sync(full, s, o);
            ws += __shfl_xor_sync(full, ws, o);
        }
        const float inv = 1.f / s;
#pragma unroll
        for (int j = 0; j < V; ++j) acc[j] += ex[j] * inv;
        if (lane == 0) {
            const float lse = mx + logf(s);
            zacc += lse * lse;
        }
        if (k <= 32) {
            if (lane < k) {
                topk_ids[(u64_t)t * k + lane] = my_id;
                topk_w[(u64_t)t * k + lane] = renorm ? wk / ws : wk * inv;
                atomicAdd(&hist[warp][my_id], 1);
            }
        } else {
            __syncwarp();
            for (int r = lane; r < k; r += 32) {
                const float w = topk_w[(u64_t)t * k + r];
                topk_w[(u64_t)t * k + r] = renorm ? w / wsum : w * inv;
            }
        }
    }
#pragma unroll
    for (int j = 0; j < V; ++j) {
        const int e = lane * V + j;
        if (e < E) psw[warp][e] = acc[j];
    }
    if (lane == 0) zw[warp] = zacc;
    __syncthreads();
    for (int e = tid; e < E; e += NT) {
        int c = 0;
        float p = 0.f;
#pragma unroll
        for (int w = 0; w < W; ++w) { c += hist[w][e]; p += psw[w][e]; }
        cnt[(u64_t)e * G + b] = c;
        ps[(u64_t)e * G + b] = p;
    }
    if (tid == 0) {
        float z = 0.f;
#pragma unroll
        for (int w = 0; w < W; ++w) z += zw[w];
        zs[b] = z;
    }
    ROUTE_STAMP(1);
    if (GEN) route_grid_sync_gen(bar);
    else route_grid_sync(bar, 1);
    ROUTE_STAMP(2);

    // ---- phase 2a
    const int ipt = (G + NT - 1) / NT;
    const int g0 = min(G, tid * ipt), g1 = min(G, g0 + ipt);
    for (int e = b; e < E; e += G) {
        int* col = cnt + (u64_t)e * G;
        const float* pcol = ps + (u64_t)e * G;
        // a thread's first KEEP counts stay in registers between the scan's two passes (one
        // L2 round trip, not two, while G <= KEEP * threads)
        constexpr int KEEP = 4;
        int xs[KEEP];
        int c = 0;
        float p = 0.f;
#pragma unroll
        for (int i = 0; i < KEEP; ++i) {
            xs[i] = g0 + i < g1 ? __ldcg(col + g0 + i) : 0;
            p += g0 + i < g1 ? __ldcg(pcol + g0 + i) : 0.f;
            c += xs[i];
        }
        for (int g = g0 + KEEP; g < g1; ++g) { c += __ldcg(col + g); p += __ldcg(pcol + g); }
        int total;
        int at = block_exclusive_scan(c, itmp, &total);
#pragma unroll
        for (int i = 0; i < KEEP; ++i) {
            if (g0 + i < g1) {
                __stcg(col + g0 + i, at);
                at += xs[i];
            }
        }
        for (int g = g0 + KEEP; g < g1; ++g) {
            const int x = __ldcg(col + g);
            __stcg(col + g, at);
            at += x;
        }
        p = block_sum(p, red);
        if (tid == 0) { tot_cnt[e] = total; tot_p[e] = p; }
    }
    if (b == G - 1) {
        float z = 0.f;
        for (int g = tid; g < G; g += NT) z += __ldcg(zs + g);
        z = block_sum(z, red);
        if (tid == 0) tot_z[0] = z;
    }
    ROUTE_STAMP(3);
    if (GEN) route_grid_sync_gen(bar);
    else route_grid_sync(bar, 2);
    ROUTE_STAMP(4);

    // ---- phase 2b
    const int sentinel = T * k;
    // phase 3's loads issued first, so their latency overlaps the scan below: where this
    // block's slots of expert tid start within the segment (W * 32 >= FR_MAX_E: one
    // expert a thread), and the first 32 slots of this warp
    const int my_start = tid < E ? __ldcg(cnt + (u64_t)tid * G + b) : 0;
    const int last = t1 * k;
    int e_next = t0 * k + lane < last ? __ldcg(topk_ids + t0 * k + lane) : -1 - lane;
    int padded = 0, mine = 0;
    if (tid < E) {
        mine = __ldcg(tot_cnt + tid);
        ecnt[tid] = mine;
        padded = (mine + bs - 1) / bs * bs;
    }
    int total;
    const int excl = block_exclusive_scan(padded, itmp, &total);
    if (tid < E) off[tid] = excl;
    if (tid == 0) off[E] = total;
    __syncthreads();
    if (b == 0) {
        float a = 0.f;
        if (tid < E) {
            expert_counts[tid] = mine;
            expert_offsets[tid] = excl;
            a = T > 0 ? ((float)mine / (float)T) * (__ldcg(tot_p + tid) / (float)T) : 0.f;
        }
        if (tid == 0) expert_offsets[E] = total;
        a = block_sum(a, red);
        if (tid == 0) {
            aux_loss[0] = T > 0 ? (float)E * a : 0.f;
            z_loss[0] = T > 0 ? __ldcg(tot_z) / (float)T : 0.f;
        }
    }
    for (int e = b; e < E; e += G)
        for (int pos = off[e] + ecnt[e] + tid; pos < off[e + 1]; pos += NT)
            sorted[pos] = sentinel;
    for (long long pos = (long long)off[E] + (long long)b * NT + tid; pos < P;
         pos += (long long)G * NT)
        sorted[pos] = sentinel;

    // ---- phase 3: per-warp cursors, then the stable scatter
    if (tid < E) {
        int run = off[tid] + my_start;
#pragma unroll
        for (int w = 0; w < W; ++w) {
            const int h = hist[w][tid];
            hist[w][tid] = run;
            run += h;
        }
    }
    __syncthreads();
    const unsigned below = (1u << lane) - 1u;
    for (int s0 = t0 * k; s0 < last; s0 += 32) {
        const int s = s0 + lane;
        const bool ok = s < last;
        const int e = e_next;  // unique keys (-1 - lane) for idle lanes
        if (s0 + 32 < last)    // the next step's experts load while this one is placed
            e_next = s + 32 < last ? __ldcg(topk_ids + s + 32) : -1 - lane;
        const unsigned peers = __match_any_sync(full, e);
        const unsigned lower = peers & below;
        if (ok) sorted[hist[warp][e] + __popc(lower)] = s;
        __syncwarp();
        if (ok && lower == 0) hist[warp][e] += __popc(peers);
        __syncwarp();
    }
    ROUTE_STAMP(5);
}

// `moe_route_fused_{s}_v{V}`: the barrier counter in `bar`, zeroed by the host before the
// launch (a memset); `moe_route_fused_{s}_v{V}_g`: the self-resetting module-global barrier
// (`bar` is not read; no memset).
#define FUSED_ENTRY(NAME, S, V, GEN)                                                            \
    extern "C" __global__ void __launch_bounds__(FR_THREADS) NAME(                              \
            const S::T* __restrict__ logits, int T, int E, int k, int renorm, int bs, int P,    \
            int* __restrict__ topk_ids, float* __restrict__ topk_w,                             \
            int* __restrict__ expert_counts, int* __restrict__ sorted,                          \
            int* __restrict__ expert_offsets, float* __restrict__ aux_loss,                     \
            float* __restrict__ z_loss, int* cnt, float* ps, float* zs, int* tot_cnt,           \
            float* tot_p, float* tot_z, unsigned* bar) {                                        \
        moe_route_fused_impl<S, V, GEN>(logits, T, E, k, renorm, bs, P, topk_ids, topk_w,       \
                                        expert_counts, sorted, expert_offsets, aux_loss,        \
                                        z_loss, cnt, ps, zs, tot_cnt, tot_p, tot_z,             \
                                        GEN ? &route_gen_bar : bar);                            \
    }
FUSED_ENTRY(moe_route_fused_f32_v1, RouteF32, 1, false)
FUSED_ENTRY(moe_route_fused_f32_v1_g, RouteF32, 1, true)
FUSED_ENTRY(moe_route_fused_f32_v2, RouteF32, 2, false)
FUSED_ENTRY(moe_route_fused_f32_v2_g, RouteF32, 2, true)
FUSED_ENTRY(moe_route_fused_f32_v4, RouteF32, 4, false)
FUSED_ENTRY(moe_route_fused_f32_v4_g, RouteF32, 4, true)
FUSED_ENTRY(moe_route_fused_f32_v8, RouteF32, 8, false)
FUSED_ENTRY(moe_route_fused_f32_v8_g, RouteF32, 8, true)
FUSED_ENTRY(moe_route_fused_bf16_v1, RouteBF16, 1, false)
FUSED_ENTRY(moe_route_fused_bf16_v1_g, RouteBF16, 1, true)
FUSED_ENTRY(moe_route_fused_bf16_v2, RouteBF16, 2, false)
FUSED_ENTRY(moe_route_fused_bf16_v2_g, RouteBF16, 2, true)
FUSED_ENTRY(moe_route_fused_bf16_v4, RouteBF16, 4, false)
FUSED_ENTRY(moe_route_fused_bf16_v4_g, RouteBF16, 4, true)
FUSED_ENTRY(moe_route_fused_bf16_v8, RouteBF16, 8, false)
FUSED_ENTRY(moe_route_fused_bf16_v8_g, RouteBF16, 8, true)
FUSED_ENTRY(moe_route_fused_f16_v1, RouteF16, 1, false)
FUSED_ENTRY(moe_route_fused_f16_v1_g, RouteF16, 1, true)
FUSED_ENTRY(moe_route_fused_f16_v2, RouteF16, 2, false)
FUSED_ENTRY(moe_route_fused_f16_v2_g, RouteF16, 2, true)
FUSED_ENTRY(moe_route_fused_f16_v4, RouteF16, 4, false)
FUSED_ENTRY(moe_route_fused_f16_v4_g, RouteF16, 4, true)
FUSED_ENTRY(moe_route_fused_f16_v8, RouteF16, 8, false)
FUSED_ENTRY(moe_route_fused_f16_v8_g, RouteF16, 8, true)
