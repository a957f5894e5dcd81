// MoE router: per token, the top-k of E int16 (Q7.8) logits kept in a register insertion
// network (ties: lower expert index first), a fixed-point softmax over the k selected
// (exp2 by shift + 256-entry LUT, one reciprocal 2^30 / S per token) and the per-expert
// histogram. Bit-exact with fpga::golden::router; same memory layout as the RTL kernel:
// logits rows padded to 4 int16, routes rows padded to 2 slots (weight << 16 | id), the
// histogram padded to 2 counters.
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

extern "C" int router_kernel(const int16_t *logits, uint32_t *routes, uint32_t *hist, int tokens,
                             int experts, int top_k) {
#pragma HLS INTERFACE m_axi port = logits offset = slave bundle = gmem0 max_read_burst_length = 64
#pragma HLS INTERFACE m_axi port = routes offset = slave bundle = gmem1
#pragma HLS INTERFACE m_axi port = hist offset = slave bundle = gmem1
#pragma HLS INTERFACE s_axilite port = tokens
#pragma HLS INTERFACE s_axilite port = experts
#pragma HLS INTERFACE s_axilite port = top_k
#pragma HLS INTERFACE s_axilite port = return
    if (tokens < 0 || experts < 1 || experts > ROUTER_MAX_E || top_k < 1 || top_k > ROUTER_MAX_K ||
        top_k > experts)
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
        int16_t tv[ROUTER_MAX_K];
        uint16_t ti[ROUTER_MAX_K];
        bool tk[ROUTER_MAX_K];
#pragma HLS ARRAY_PARTITION variable = tv complete
#pragma HLS ARRAY_PARTITION variable = ti complete
#pragma HLS ARRAY_PARTITION variable = tk complete
        for (int j = 0; j < ROUTER_MAX_K; j++) {
#pragma HLS UNROLL
            tk[j] = false;
            tv[j] = 0;
            ti[j] = 0;
        }
    insert:
        for (int e = 0; e < experts; e++) {
#pragma HLS PIPELINE II = 1
#pragma HLS LOOP_TRIPCOUNT min = 1 max = ROUTER_MAX_E
            int16_t v = logits[(int64_t)t * epad + e];
            // Entry j keeps its place if it is >= v; the first entry < v takes v and the rest
            // shift down by one (all compares in parallel).
            bool ge[ROUTER_MAX_K];
#pragma HLS ARRAY_PARTITION variable = ge complete
            for (int j = 0; j < ROUTER_MAX_K; j++) {
#pragma HLS UNROLL
                ge[j] = tk[j] && tv[j] >= v;
            }
            for (int j = ROUTER_MAX_K - 1; j >= 0; j--) {
#pragma HLS UNROLL
                if (j >= top_k || ge[j]) continue;
                if (j == 0 || ge[j - 1]) {
                    tv[j] = v;
                    ti[j] = (uint16_t)e;
                    tk[j] = true;
                } else {
                    tv[j] = tv[j - 1];
                    ti[j] = ti[j - 1];
                    tk[j] = tk[j - 1];
                }
            }
        }
        uint32_t ex[ROUTER_MAX_K];
#pragma HLS ARRAY_PARTITION variable = ex complete
        uint64_t s = 0;
        for (int j = 0; j < ROUTER_MAX_K; j++) {
#pragma HLS UNROLL
            ex[j] = j < top_k ? router_exp_neg((uint32_t)((int32_t)tv[0] - (int32_t)tv[j])) : 0u;
            s += ex[j];
        }
        uint64_t r = ((uint64_t)1 << 30) / s;
    write_routes:
        for (int j = 0; j < kpad; j++) {
#pragma HLS PIPELINE II = 1
            uint32_t slot = 0;
            if (j < top_k) {
                uint32_t w = (uint32_t)(((uint64_t)ex[j] * r + (1u << 14)) >> 15);
                slot = (w << 16) | ti[j];
                counts[ti[j]] += 1;
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
