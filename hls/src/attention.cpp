// Streaming attention of one head: int8 Q K^T, fixed-point online softmax (log2 domain,
// power-of-two running exponent, exp2 by shift + 256-entry LUT), P V accumulation, final
// normalisation. Bit-exact with fpga::golden::attention for kv_tile = ATT_KV_TILE.
//
// Per query row the keys stream through in tiles of ATT_KV_TILE: a score loop (pipelined
// over d, II=1) fills the tile's logits, then the weight loop turns them into Q1.15 weights
// and accumulates P V (pipelined over d, II=1). The tile loop has data-dependent control
// (skipped tiles, rescale), so it is not a DATAFLOW region; overlapping the two phases the
// way the RTL core does (FIFO between them) is the next step for this C++.
#include "tandem_hls.h"

static const uint16_t ATT_LUT[ATT_LUT_SIZE] = {
#include "exp2_lut.inc"
};

static int64_t att_round_shift(int64_t v, int s) {
#pragma HLS INLINE
    return s == 0 ? v : ((v + ((int64_t)1 << (s - 1))) >> s);
}

static int64_t att_rescale(int64_t v, int64_t s) {
#pragma HLS INLINE
    if (s == 0) return v;
    if (s >= ATT_SHIFT_ZERO) return 0;
    return (v + ((int64_t)1 << (s - 1))) >> s;
}

static uint32_t att_weight(int64_t u) {
#pragma HLS INLINE
    int64_t n = u >> ATT_FRAC;
    if (n >= 16) return 0;
    return (uint32_t)ATT_LUT[u & (ATT_LUT_SIZE - 1)] >> n;
}

static int16_t att_normalise(int64_t acc, uint32_t l) {
#pragma HLS INLINE
    int64_t num = 512 * acc + (int64_t)l;
    int64_t den = 2 * (int64_t)l;
    int64_t q = num / den;
    if ((num % den != 0) && (num < 0)) q -= 1; // floor division
    if (q > 32767) q = 32767;
    if (q < -32768) q = -32768;
    return (int16_t)q;
}

static void att_scores(const int8_t qrow[ATT_MAX_D], const int8_t *k, int j0, int j1, int i,
                       int nq, int64_t nv, int d, int causal, int score_mult, int score_shift,
                       int64_t t[ATT_KV_TILE], bool vis[ATT_KV_TILE]) {
scores_j:
    for (int jj = 0; jj < ATT_KV_TILE; jj++) {
        int j = j0 + jj;
        vis[jj] = j < j1 && (!causal || (int64_t)j + nq <= (int64_t)i + nv);
        int32_t s = 0;
    scores_d:
        for (int c = 0; c < d; c++) {
#pragma HLS PIPELINE II = 1
#pragma HLS LOOP_TRIPCOUNT min = 1 max = ATT_MAX_D
            if (vis[jj]) s += (int32_t)qrow[c] * (int32_t)k[(int64_t)j * d + c];
        }
        t[jj] = att_round_shift((int64_t)s * (int64_t)score_mult, score_shift);
    }
}

extern "C" int attention_kernel_group(const int8_t *q, const int8_t *k, const int8_t *v,
                                      int16_t *o, int32_t *e_out, uint32_t *l_out, int nq,
                                      int nkv, int d, int causal, int score_mult,
                                      int score_shift, int heads, int kv_skip) {
#pragma HLS INTERFACE m_axi port = q offset = slave bundle = gmem0
#pragma HLS INTERFACE m_axi port = k offset = slave bundle = gmem1 max_read_burst_length = 64
#pragma HLS INTERFACE m_axi port = v offset = slave bundle = gmem2 max_read_burst_length = 64
#pragma HLS INTERFACE m_axi port = o offset = slave bundle = gmem3
#pragma HLS INTERFACE m_axi port = e_out offset = slave bundle = gmem3
#pragma HLS INTERFACE m_axi port = l_out offset = slave bundle = gmem3
#pragma HLS INTERFACE s_axilite port = nq
#pragma HLS INTERFACE s_axilite port = nkv
#pragma HLS INTERFACE s_axilite port = d
#pragma HLS INTERFACE s_axilite port = causal
#pragma HLS INTERFACE s_axilite port = score_mult
#pragma HLS INTERFACE s_axilite port = score_shift
#pragma HLS INTERFACE s_axilite port = heads
#pragma HLS INTERFACE s_axilite port = kv_skip
#pragma HLS INTERFACE s_axilite port = return
    if (nq < 0 || nkv < 1 || nkv > 65536 || d < 1 || d > ATT_MAX_D || score_mult < 0 ||
        score_mult > 65535 || score_shift < 0 || score_shift > 47 || heads < 0 || heads > 1024 ||
        kv_skip < 0 || kv_skip > (1 << 30))
        return -1;
    // query heads of one GQA group share this K/V: their rows follow each other in q, o, e, l
    int64_t rows_total = (int64_t)nq * (heads == 0 ? 1 : heads);
    if (rows_total > (1 << 30)) return -1;
    // causal: row i of its head sees key j iff j + nq <= i + nkv + kv_skip
    int64_t nv = (int64_t)nkv + kv_skip;
    int8_t qrow[ATT_MAX_D];
    int64_t acc[ATT_MAX_D];
#pragma HLS ARRAY_PARTITION variable = acc cyclic factor = 16
    int64_t t[ATT_KV_TILE];
    bool vis[ATT_KV_TILE];
#pragma HLS ARRAY_PARTITION variable = t complete
#pragma HLS ARRAY_PARTITION variable = vis complete
rows:
    for (int64_t r = 0; r < rows_total; r++) {
        int i = (int)(r % nq);
        for (int c = 0; c < d; c++) {
#pragma HLS PIPELINE II = 1
            qrow[c] = q[r * d + c];
            acc[c] = 0;
        }
        bool have_e = false;
        int64_t e = 0;
        uint32_t l = 0;
    tiles:
        for (int j0 = 0; j0 < nkv; j0 += ATT_KV_TILE) {
            int j1 = j0 + ATT_KV_TILE < nkv ? j0 + ATT_KV_TILE : nkv;
            att_scores(qrow, k, j0, j1, i, nq, nv, d, causal, score_mult, score_shift, t, vis);
            bool any = false;
            int64_t tmax = 0;
            for (int jj = 0; jj < ATT_KV_TILE; jj++) {
#pragma HLS UNROLL
                if (vis[jj] && (!any || t[jj] > tmax)) tmax = t[jj];
                any = any || vis[jj];
            }
            if (!any) continue;
            int64_t et = (tmax + 255) >> ATT_FRAC;
            if (!have_e) {
                e = et;
                have_e = true;
            } else if (et > e) {
                int64_t s = et - e;
                l = (uint32_t)att_rescale((int64_t)l, s);
                for (int c = 0; c < d; c++) {
#pragma HLS PIPELINE II = 1
                    acc[c] = att_rescale(acc[c], s);
                }
                e = et;
            }
        pv_j:
            for (int jj = 0; jj < ATT_KV_TILE; jj++) {
                if (!vis[jj]) continue;
                uint32_t p = att_weight((e << ATT_FRAC) - t[jj]);
                l += p;
            pv_d:
                for (int c = 0; c < d; c++) {
#pragma HLS PIPELINE II = 1
#pragma HLS LOOP_TRIPCOUNT min = 1 max = ATT_MAX_D
                    acc[c] += (int64_t)p * (int64_t)v[(int64_t)(j0 + jj) * d + c];
                }
            }
        }
        if (have_e) {
            e_out[r] = e < -2147483647LL ? -2147483647 : (e > 2147483647LL ? 2147483647 : (int32_t)e);
            l_out[r] = l;
            for (int c = 0; c < d; c++) {
#pragma HLS PIPELINE II = 1
                o[r * d + c] = att_normalise(acc[c], l);
            }
        } else {
            e_out[r] = (int32_t)(-2147483647 - 1);
            l_out[r] = 0;
            for (int c = 0; c < d; c++) {
#pragma HLS PIPELINE II = 1
                o[r * d + c] = 0;
            }
        }
    }
    return 0;
}

extern "C" int attention_kernel(const int8_t *q, const int8_t *k, const int8_t *v, int16_t *o,
                                int32_t *e_out, uint32_t *l_out, int nq, int nkv, int d,
                                int causal, int score_mult, int score_shift) {
    return attention_kernel_group(q, k, v, o, e_out, l_out, nq, nkv, d, causal, score_mult,
                                  score_shift, 1, 0);
}

extern "C" int attention_kv_tile(void) { return ATT_KV_TILE; }
