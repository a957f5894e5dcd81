// MoE routing in three launches:
//  1. moe_topk_softmax_f32 (bf16 logits; `moe_topk_softmax_f32_f16`: f16 logits): one warp
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

// Logits are stored as S (bf16 or f16); the softmax, top-k and sums run in f32.
template <typename S>
__device__ __forceinline__ void moe_topk_softmax_impl(
        const h16_t* __restrict__ logits, int T, int E, int k, int renorm,
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
        const h16_t* row = logits + (u64_t)t * E;
        float v[ROUTE_MAX_VPL];
        float mx = TANDEM_NEG_INF;
#pragma unroll
        for (int j = 0; j < ROUTE_MAX_VPL; ++j) {
            const int e = lane + 32 * j;
            v[j] = e < E ? S::to_f(row[e]) : TANDEM_NEG_INF;
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

// f32 math on bf16 logits (`moe_topk_softmax_f32`) and on f16 logits (`_f32_f16`).
#define TOPK_ENTRY(NAME, S)                                                                     \
    extern "C" __global__ void __launch_bounds__(ROUTE_WARPS * 32) NAME(                        \
            const h16_t* __restrict__ logits, int T, int E, int k, int renorm,                  \
            int* __restrict__ topk_ids, float* __restrict__ topk_w, int* __restrict__ block_counts, \
            float* __restrict__ block_psum, float* __restrict__ block_z) {                      \
        moe_topk_softmax_impl<S>(logits, T, E, k, renorm, topk_ids, topk_w, block_counts,       \
                                 block_psum, block_z);                                          \
    }
TOPK_ENTRY(moe_topk_softmax_f32, BF16)
TOPK_ENTRY(moe_topk_softmax_f32_f16, F16)

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
