// MoE router: per token, the top-k of E int16 (Q7.8) logits, ROUTER_LANES logits per cycle:
// lane l keeps the top-k of the logits l, l + L, ... in its own register insertion network
// (ties: lower expert index first) and the lanes' lists are merged (larger value, then lower
// index); a fixed-point softmax over the k selected (exp2 by shift + 256-entry LUT, one
// reciprocal 2^30 / S per token; with renormalize = 0, S sums the exps of every expert of the
// row, a second pass over it) and the per-expert histogram. Bit-exact with
// fpga::golden::router (whatever the lane count); same memory layout as the RTL kernel: logits
// rows padded to 4 int16, routes rows padded to 2 slots (weight << 16 | id), the histogram
// padded to 2 counters.
#include "tandem_hls.h"

static const uint16_t ROUTER_LUT[256] = {
#include "exp2_lut.inc"
};

static uint32_t router_exp_neg(uint32_t d) {
#pragma HLS INLINE
    uint32_t u = (d * 23637u) >> 14;
    uint32_t sh = u >> 8;
    return sh >= 16 ? 0u : ((uint32_t)ROUTER_LUT[u & 255] >> sh);
}

// a beats b: valid, and b is not, or a is larger, or equal with the lower expert index
static bool router_beats(bool ak, int16_t av, uint16_t ai, bool bk, int16_t bv, uint16_t bi) {
#pragma HLS INLINE
    return ak && (!bk || av > bv || (av == bv && ai < bi));
}

template <int L>
static int router_body(const int16_t *logits, uint32_t *routes, uint32_t *hist, int tokens,
                       int experts, int top_k, int renormalize) {
    if (tokens < 0 || experts < 1 || experts > ROUTER_MAX_E || top_k < 1 || top_k > ROUTER_MAX_K ||
        top_k > experts || renormalize < 0 || renormalize > 1)
        return -1;
    const int epad = (experts + 3) / 4 * 4;
    const int kpad = (top_k + 1) / 2 * 2;
    const int hpad = (experts + 1) / 2 * 2;
    uint32_t counts[ROUTER_MAX_E];
#pragma HLS BIND_STORAGE variable = counts type = ram_t2p impl = bram
clear_hist:
    for (int e = 0; e < experts; e++) {
#pragma HLS PIPELINE II = 1
        counts[e] = 0;
    }
token:
    for (int t = 0; t < tokens; t++) {
        const int16_t *row = logits + (int64_t)t * epad;
        int16_t tv[L][ROUTER_MAX_K];
        uint16_t ti[L][ROUTER_MAX_K];
        bool tk[L][ROUTER_MAX_K];
#pragma HLS ARRAY_PARTITION variable = tv complete dim = 0
#pragma HLS ARRAY_PARTITION variable = ti complete dim = 0
#pragma HLS ARRAY_PARTITION variable = tk complete dim = 0
        for (int l = 0; l < L; l++) {
#pragma HLS UNROLL
            for (int j = 0; j < ROUTER_MAX_K; j++) {
#pragma HLS UNROLL
                tk[l][j] = false;
                tv[l][j] = 0;
                ti[l][j] = 0;
            }
        }
    insert:
        for (int e0 = 0; e0 < experts; e0 += L) {
#pragma HLS PIPELINE II = 1
#pragma HLS LOOP_TRIPCOUNT min = 1 max = ROUTER_MAX_E
            for (int l = 0; l < L; l++) {
#pragma HLS UNROLL
                const int e = e0 + l;
                if (e >= experts) continue;
                const int16_t v = row[e];
                // Entry j keeps its place if it is >= v; the first entry < v takes v and the
                // rest shift down by one (all compares in parallel).
                bool ge[ROUTER_MAX_K];
#pragma HLS ARRAY_PARTITION variable = ge complete
                for (int j = 0; j < ROUTER_MAX_K; j++) {
#pragma HLS UNROLL
                    ge[j] = tk[l][j] && tv[l][j] >= v;
                }
                for (int j = ROUTER_MAX_K - 1; j >= 0; j--) {
#pragma HLS UNROLL
                    if (j >= top_k || ge[j]) continue;
                    if (j == 0 || ge[j - 1]) {
                        tv[l][j] = v;
                        ti[l][j] = (uint16_t)e;
                        tk[l][j] = true;
                    } else {
                        tv[l][j] = tv[l][j - 1];
                        ti[l][j] = ti[l][j - 1];
                        tk[l][j] = tk[l][j - 1];
                    }
                }
            }
        }
        // merge the lanes' lists: k times the best head
        int16_t sv[ROUTER_MAX_K];
        uint16_t si[ROUTER_MAX_K];
        int head[L];
#pragma HLS ARRAY_PARTITION variable = sv complete
#pragma HLS ARRAY_PARTITION variable = si complete
#pragma HLS ARRAY_PARTITION variable = head complete
        for (int l = 0; l < L; l++) {
#pragma HLS UNROLL
            head[l] = 0;
        }
    merge:
        for (int j = 0; j < top_k; j++) {
#pragma HLS PIPELINE II = 1
#pragma HLS LOOP_TRIPCOUNT min = 1 max = ROUTER_MAX_K
            int best = 0;
            bool bk = false;
            int16_t bv = 0;
            uint16_t bi = 0;
            for (int l = 0; l < L; l++) {
#pragma HLS UNROLL
                const int h = head[l];
                const bool hk = h < ROUTER_MAX_K && tk[l][h];
                const int16_t hv = hk ? tv[l][h] : (int16_t)0;
                const uint16_t hi = hk ? ti[l][h] : (uint16_t)0;
                if (router_beats(hk, hv, hi, bk, bv, bi)) {
                    best = l;
                    bk = true;
                    bv = hv;
                    bi = hi;
                }
            }
            sv[j] = bv;
            si[j] = bi;
            head[best]++;
        }
        uint32_t ex[ROUTER_MAX_K];
#pragma HLS ARRAY_PARTITION variable = ex complete
        uint64_t s = 0;
        for (int j = 0; j < ROUTER_MAX_K; j++) {
#pragma HLS UNROLL
            ex[j] = j < top_k ? router_exp_neg((uint32_t)((int32_t)sv[0] - (int32_t)sv[j])) : 0u;
            s += ex[j];
        }
        if (!renormalize) {
            // the softmax over every expert: a second pass over the row, L exps per cycle
            s = 0;
        all_experts:
            for (int e0 = 0; e0 < experts; e0 += L) {
#pragma HLS PIPELINE II = 1
#pragma HLS LOOP_TRIPCOUNT min = 1 max = ROUTER_MAX_E
                for (int l = 0; l < L; l++) {
#pragma HLS UNROLL
                    const int e = e0 + l;
                    if (e < experts)
                        s += router_exp_neg((uint32_t)((int32_t)sv[0] - (int32_t)row[e]));
                }
            }
        }
        uint64_t r = ((uint64_t)1 << 30) / s;
    write_routes:
        for (int j = 0; j < kpad; j++) {
#pragma HLS PIPELINE II = 1
            uint32_t slot = 0;
            if (j < top_k) {
                uint32_t w = (uint32_t)(((uint64_t)ex[j] * r + (1u << 14)) >> 15);
                slot = (w << 16) | si[j];
                counts[si[j]] += 1;
            }
            routes[(int64_t)t * kpad + j] = slot;
        }
    }
write_hist:
    for (int e = 0; e < hpad; e++) {
#pragma HLS PIPELINE II = 1
        hist[e] = e < experts ? counts[e] : 0u;
    }
    return 0;
}

extern "C" int router_kernel(const int16_t *logits, uint32_t *routes, uint32_t *hist, int tokens,
                             int experts, int top_k, int renormalize) {
#pragma HLS INTERFACE m_axi port = logits offset = slave bundle = gmem0 max_read_burst_length = 64
#pragma HLS INTERFACE m_axi port = routes offset = slave bundle = gmem1
#pragma HLS INTERFACE m_axi port = hist offset = slave bundle = gmem1
#pragma HLS INTERFACE s_axilite port = tokens
#pragma HLS INTERFACE s_axilite port = experts
#pragma HLS INTERFACE s_axilite port = top_k
#pragma HLS INTERFACE s_axilite port = renormalize
#pragma HLS INTERFACE s_axilite port = return
    return router_body<ROUTER_LANES>(logits, routes, hist, tokens, experts, top_k, renormalize);
}

extern "C" int router_kernel_lanes(const int16_t *logits, uint32_t *routes, uint32_t *hist,
                                   int tokens, int experts, int top_k, int renormalize,
                                   int lanes) {
    switch (lanes) {
    case 1:
        return router_body<1>(logits, routes, hist, tokens, experts, top_k, renormalize);
    case 2:
        return router_body<2>(logits, routes, hist, tokens, experts, top_k, renormalize);
    case 4:
        return router_body<4>(logits, routes, hist, tokens, experts, top_k, renormalize);
    case 8:
        return router_body<8>(logits, routes, hist, tokens, experts, top_k, renormalize);
    default:
        return -1;
    }
}
