// Streaming vector ops (add, RMSNorm (+ residual), RoPE rotate-half, SiLU(gate) x up) on rows
// of int16 elements, one op per call chosen by `op`: fpga::golden::vecops bit for bit.
// Ops 5 (silu_mul8) and 6 (combine) take int8 rows (8 per 64-bit word, the GEMM's layout):
// the same ports, read as bytes (a, b, y) and as 64-bit table entries (p).
//
// Rows are padded to np = 4 ceil(n / 4) elements (the host pads with zeros). Per row: load the
// row (and the second operand or the cos/sin row) into on-chip buffers at II=1, reduce the
// sum of squares, compute the rsqrt by LUT, and stream the result out at II=1.
#include "tandem_hls.h"

static const uint16_t vec_rsq_lut[512] = {
#include "vecops_rsqrt_lut.inc"
};
static const uint16_t vec_sig_lut[1024] = {
#include "vecops_sigmoid_lut.inc"
};

static int16_t vec_sat16(int64_t v) {
#pragma HLS INLINE
    if (v > 32767) return 32767;
    if (v < -32768) return -32768;
    return (int16_t)v;
}

// (p + 2^(s-1)) >> s, round half up (arithmetic shift); p when s = 0.
static int64_t vec_rs(int64_t p, unsigned s) {
#pragma HLS INLINE
    if (s == 0) return p;
    return (int64_t)((uint64_t)p + ((uint64_t)1 << (s - 1))) >> s;
}

static uint32_t vec_sigmoid(int16_t a, uint32_t mult, uint32_t shift) {
#pragma HLS INLINE
    int64_t z = vec_rs((int64_t)a * (int64_t)mult, shift);
    if (z >= VEC_SIG_HALF) return 32768;
    if (z < -VEC_SIG_HALF) return 0;
    return vec_sig_lut[z + VEC_SIG_HALF];
}

static int8_t vec_sat8(int64_t v) {
#pragma HLS INLINE
    if (v > 127) return 127;
    if (v < -128) return -128;
    return (int8_t)v;
}

// op 5: y = sat8(rs(a * sig(a) * b * (c1 >> 16), shift)) on padded int8 rows.
static void vec_silu_mul8(const int8_t *a, const int8_t *b, int8_t *y, int rows, int n, int shift,
                          uint32_t c0, uint32_t c1) {
    const int64_t np8 = 8 * ((n + 7) / 8);
    const int64_t m = (int64_t)(c1 >> 16);
silu8_loop:
    for (int64_t j = 0; j < (int64_t)rows * np8; j++) {
#pragma HLS PIPELINE II = 1
        int64_t g = a[j];
        int64_t prod = g * (int64_t)vec_sigmoid((int16_t)g, c0, c1 & 0xffff) * (int64_t)b[j] * m;
        y[j] = vec_sat8(vec_rs(prod, (unsigned)shift));
    }
}

// op 6: per output row r, acc = sum over j < k of weight * b[row] (entries r k + j of the table),
// y = sat16(rs(acc, shift)) on padded int16 rows.
static void vec_combine(const uint64_t *tab, const int8_t *b, int16_t *y, int rows, int n, int shift,
                        uint32_t k) {
    const int64_t np8 = 8 * ((n + 7) / 8);
    const int np = 4 * ((n + 3) / 4);
    static int64_t acc[VEC_MAX_N];
comb_rows:
    for (int r = 0; r < rows; r++) {
    comb_terms:
        for (uint32_t j = 0; j < k; j++) {
            uint64_t e = tab[(int64_t)r * k + j];
            int64_t row = (int64_t)(e & 0xffffffffull);
            int64_t w = (int16_t)(uint16_t)(e >> 32);
        comb_lanes:
            for (int i = 0; i < np; i++) {
#pragma HLS PIPELINE II = 1
                int64_t v = w * (int64_t)b[row * np8 + i];
                acc[i] = (j == 0) ? v : acc[i] + v;
            }
        }
    comb_out:
        for (int i = 0; i < np; i++) {
#pragma HLS PIPELINE II = 1
            y[(int64_t)r * np + i] = vec_sat16(vec_rs(acc[i], (unsigned)shift));
        }
    }
}

int vecops_kernel(const int16_t *a, const int16_t *b, const int16_t *p, int16_t *y, int16_t *s,
                  int op, int rows, int n, int shift, uint32_t c0, uint32_t c1, int n_max) {
#pragma HLS INTERFACE m_axi port = a offset = slave bundle = gmem
#pragma HLS INTERFACE m_axi port = b offset = slave bundle = gmem
#pragma HLS INTERFACE m_axi port = p offset = slave bundle = gmem
#pragma HLS INTERFACE m_axi port = y offset = slave bundle = gmem
#pragma HLS INTERFACE m_axi port = s offset = slave bundle = gmem
#pragma HLS INTERFACE s_axilite port = return
    // The RTL's args_ok (VecArgs::valid).
    if (op < 0 || op > 6 || rows <= 0 || n <= 0 || n > n_max || n_max > VEC_MAX_N) return -1;
    if ((op == 1 || op == 2) && (shift < 1 || shift > 47)) return -1;
    if (op == 3 && ((n % 8) != 0 || c0 == 0)) return -1;
    if (op == 4 && (shift < 0 || shift > 47 || c1 > 47)) return -1;
    if (op == 5 && (shift < 0 || shift > 47 || (c1 & 0xffff) > 47)) return -1;
    if (op == 6 && (shift < 0 || shift > 47 || c0 == 0 ||
                    (uint64_t)rows * c0 > (uint64_t)(n_max / 4)))
        return -1;
    if (op == 5) {
        vec_silu_mul8((const int8_t *)a, (const int8_t *)b, (int8_t *)y, rows, n, shift, c0, c1);
        return 0;
    }
    if (op == 6) {
        vec_combine((const uint64_t *)(const void *)p, (const int8_t *)b, y, rows, n, shift, c0);
        return 0;
    }
    static int16_t row[VEC_MAX_N];
    static int16_t tab[VEC_MAX_N];
    static int16_t wt[VEC_MAX_N];
    const int np = 4 * ((n + 3) / 4);
    if (op == 1 || op == 2) {
    load_w:
        for (int j = 0; j < np; j++) {
#pragma HLS PIPELINE II = 1
            wt[j] = p[j];
        }
    }
rows_loop:
    for (int r = 0; r < rows; r++) {
        const int64_t base = (int64_t)r * np;
        uint64_t ss = 0;
    load_a:
        for (int j = 0; j < np; j++) {
#pragma HLS PIPELINE II = 1
            int16_t x = a[base + j];
            int16_t t = x;
            if (op == 0) t = vec_sat16((int64_t)x + b[base + j]);
            if (op == 2) t = vec_sat16((int64_t)x + b[base + j]);
            if (op == 4) {
                int16_t u = b[base + j];
                int64_t prod = (int64_t)x * (int64_t)vec_sigmoid(x, c0, c1) * (int64_t)u;
                t = vec_sat16(vec_rs(prod, (unsigned)shift));
            }
            if (op == 3) tab[j] = p[(int64_t)(r % (int)c0) * np + j];
            row[j] = t;
            ss += (uint64_t)((int64_t)t * t);
        }
        if (op == 0 || op == 4) {
        out_copy:
            for (int j = 0; j < np; j++) {
#pragma HLS PIPELINE II = 1
                y[base + j] = row[j];
            }
        } else if (op == 3) {
            const int h = np / 2;
        out_rope:
            for (int j = 0; j < h; j++) {
#pragma HLS PIPELINE II = 1
                int64_t x1 = row[j], x2 = row[j + h], cj = tab[j], sj = tab[j + h];
                y[base + j] = vec_sat16(vec_rs(x1 * cj - x2 * sj, VEC_ROPE_FRAC));
                y[base + j + h] = vec_sat16(vec_rs(x2 * cj + x1 * sj, VEC_ROPE_FRAC));
            }
        } else {
            uint64_t m = (uint64_t)(((unsigned __int128)ss * c1) >> 32);
            uint64_t v = m + c0;
            if (v > 0xffffffffull) v = 0xffffffffull;
            if (v == 0) v = 1;
            unsigned lead = 0;
            for (unsigned i = 0; i < 32; i++)
#pragma HLS UNROLL
                if ((v >> i) & 1) lead = i;
            unsigned q = lead & ~1u;
            uint16_t rr = vec_rsq_lut[((v << 7) >> q) & 511];
            unsigned k = q / 2;
        out_norm:
            for (int j = 0; j < np; j++) {
#pragma HLS PIPELINE II = 1
                int64_t prod = (int64_t)row[j] * (int64_t)wt[j] * (int64_t)rr;
                y[base + j] = vec_sat16(vec_rs(prod, (unsigned)shift + k));
                if (op == 2) s[base + j] = row[j];
            }
        }
    }
    return 0;
}

int vecops_max_n(void) { return VEC_MAX_N; }
