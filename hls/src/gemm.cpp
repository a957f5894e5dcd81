// Fused GEMM + bias + activation (int8 x int8 -> int32, per-column requantisation to int8).
//
// Output-stationary: an GEMM_TM x TN tile of int32 accumulators stays in registers while
// the inner dimension streams through, one k per cycle (II=1, TM*TN MACs a cycle). Each tile
// is a DATAFLOW region: load the x and w panels, multiply-accumulate, requantise and store.
// TN, the lanes, is a template parameter: GEMM_TN (8, the 64-bit RTL build) for
// gemm_kernel_pass, GEMM_TN_WIDE (64, the 512-bit build) for gemm_kernel_pass_wide. The two
// products of a lane pair come from one multiplication (gemm_mul2, one DSP48E2), bit for bit
// fpga::golden::gemm::mul2_packed and the RTL's PEs.
#include "tandem_hls.h"

static int8_t gemm_postprocess(uint32_t acc, int32_t bias, int relu, uint16_t mult,
                               uint8_t shift) {
#pragma HLS INLINE
    // Wrapping int32 bias add, computed unsigned to stay defined in C++.
    int32_t v = (int32_t)(acc + (uint32_t)bias);
    if (relu && v < 0) v = 0;
    int64_t p = (int64_t)v * (int64_t)mult;
    int64_t r = shift == 0 ? p : ((p + ((int64_t)1 << (shift - 1))) >> shift);
    if (r > 127) r = 127;
    if (r < -128) r = -128;
    return (int8_t)r;
}

// a * b_hi and a * b_lo from one 8 x 27-bit multiplication: p = a * (b_hi * 2^18 + b_lo);
// lo = p[15:0]; hi = p[33:18] + p[17] (the borrow of a negative lo), 16-bit wrapping.
static void gemm_mul2(int8_t a, int8_t b_hi, int8_t b_lo, int16_t *hi, int16_t *lo) {
#pragma HLS INLINE
    int32_t packed = (int32_t)b_hi * (1 << 18) + (int32_t)b_lo;  // 27 bits signed
    uint64_t p = (uint64_t)((int64_t)a * (int64_t)packed);       // 35 bits signed
    *lo = (int16_t)(uint16_t)(p & 0xFFFFu);
    *hi = (int16_t)(uint16_t)(((p >> 18) + ((p >> 17) & 1u)) & 0xFFFFu);
}

static void gemm_load(const int8_t *src, int8_t buf[][GEMM_MAX_K], int rows, int r0, int rmax,
                      int k) {
load_rows:
    for (int r = 0; r < rows; r++) {
    load_k:
        for (int kk = 0; kk < k; kk++) {
#pragma HLS PIPELINE II = 1
#pragma HLS LOOP_TRIPCOUNT min = 1 max = GEMM_MAX_K
            buf[r][kk] = (r0 + r < rmax) ? src[(int64_t)(r0 + r) * k + kk] : (int8_t)0;
        }
    }
}

template <int TN>
static void gemm_mac(int8_t xb[GEMM_TM][GEMM_MAX_K], int8_t wb[TN][GEMM_MAX_K],
                     uint32_t acc[GEMM_TM][TN], int k) {
    for (int i = 0; i < GEMM_TM; i++)
#pragma HLS UNROLL
        for (int j = 0; j < TN; j++)
#pragma HLS UNROLL
            acc[i][j] = 0;
mac_k:
    for (int kk = 0; kk < k; kk++) {
#pragma HLS PIPELINE II = 1
#pragma HLS LOOP_TRIPCOUNT min = 1 max = GEMM_MAX_K
        for (int i = 0; i < GEMM_TM; i++) {
#pragma HLS UNROLL
            for (int j = 0; j < TN; j += 2) {
#pragma HLS UNROLL
                int16_t hi, lo;
                gemm_mul2(xb[i][kk], wb[j + 1][kk], wb[j][kk], &hi, &lo);
                acc[i][j] += (uint32_t)(int32_t)lo;
                acc[i][j + 1] += (uint32_t)(int32_t)hi;
            }
        }
    }
}

template <int TN>
static void gemm_store(uint32_t acc[GEMM_TM][TN], const int32_t *bias,
                       const uint16_t *mult, const uint8_t *shift, int8_t *y, int32_t *part,
                       int m0, int n0, int m, int n, int relu, int mode) {
store_i:
    for (int i = 0; i < GEMM_TM; i++) {
    store_j:
        for (int j = 0; j < TN; j++) {
#pragma HLS PIPELINE II = 1
            int r = m0 + i, c = n0 + j;
            if (r < m && c < n) {
                int64_t at = (int64_t)r * n + c;
                // K split: the partial sums of the earlier passes (wrapping int32 adds)
                uint32_t a = acc[i][j] + ((mode & GEMM_MODE_ACC_IN) ? (uint32_t)part[at] : 0u);
                if (mode & GEMM_MODE_PART_OUT) {
                    part[at] = (int32_t)a;
                } else {
                    y[at] = gemm_postprocess(a, bias[c], relu, mult[c], shift[c]);
                }
            }
        }
    }
}

template <int TN>
static void gemm_tile(const int8_t *x, const int8_t *w, const int32_t *bias,
                      const uint16_t *mult, const uint8_t *shift, int8_t *y, int32_t *part,
                      int m0, int n0, int m, int n, int k, int relu, int mode) {
#pragma HLS DATAFLOW
    int8_t xb[GEMM_TM][GEMM_MAX_K];
#pragma HLS ARRAY_PARTITION variable = xb dim = 1 complete
    int8_t wb[TN][GEMM_MAX_K];  // 256 KiB at TN = 64 (on chip in hardware)
#pragma HLS ARRAY_PARTITION variable = wb dim = 1 complete
    uint32_t acc[GEMM_TM][TN];
#pragma HLS ARRAY_PARTITION variable = acc complete dim = 0
    gemm_load(x, xb, GEMM_TM, m0, m, k);
    gemm_load(w, wb, TN, n0, n, k);
    gemm_mac<TN>(xb, wb, acc, k);
    gemm_store<TN>(acc, bias, mult, shift, y, part, m0, n0, m, n, relu, mode);
}

template <int TN>
static int gemm_run(const int8_t *x, const int8_t *w, const int32_t *bias,
                    const uint16_t *mult, const uint8_t *shift, int8_t *y, int32_t *part,
                    int m, int n, int k, int relu, int mode) {
#pragma HLS INLINE
    if (m < 1 || n < 1 || k < 1 || k > GEMM_MAX_K) return -1;
    if ((mode & ~(GEMM_MODE_ACC_IN | GEMM_MODE_PART_OUT)) != 0) return -1;
    if (mode != 0 && part == 0) return -1;
tiles_m:
    for (int m0 = 0; m0 < m; m0 += GEMM_TM) {
    tiles_n:
        for (int n0 = 0; n0 < n; n0 += TN) {
            gemm_tile<TN>(x, w, bias, mult, shift, y, part, m0, n0, m, n, k, relu, mode);
        }
    }
    return 0;
}

extern "C" int gemm_kernel_pass(const int8_t *x, const int8_t *w, const int32_t *bias,
                                const uint16_t *mult, const uint8_t *shift, int8_t *y,
                                int32_t *part, int m, int n, int k, int relu, int mode) {
#pragma HLS INTERFACE m_axi port = x offset = slave bundle = gmem0 max_read_burst_length = 64
#pragma HLS INTERFACE m_axi port = w offset = slave bundle = gmem1 max_read_burst_length = 64
#pragma HLS INTERFACE m_axi port = bias offset = slave bundle = gmem2
#pragma HLS INTERFACE m_axi port = mult offset = slave bundle = gmem2
#pragma HLS INTERFACE m_axi port = shift offset = slave bundle = gmem2
#pragma HLS INTERFACE m_axi port = y offset = slave bundle = gmem3 max_write_burst_length = 64
#pragma HLS INTERFACE m_axi port = part offset = slave bundle = gmem4 max_write_burst_length = 64
#pragma HLS INTERFACE s_axilite port = m
#pragma HLS INTERFACE s_axilite port = n
#pragma HLS INTERFACE s_axilite port = k
#pragma HLS INTERFACE s_axilite port = relu
#pragma HLS INTERFACE s_axilite port = mode
#pragma HLS INTERFACE s_axilite port = return
    return gemm_run<GEMM_TN>(x, w, bias, mult, shift, y, part, m, n, k, relu, mode);
}

// gemm_kernel_pass with GEMM_TN_WIDE lanes (a 512-bit port carries one k of 64 columns).
extern "C" int gemm_kernel_pass_wide(const int8_t *x, const int8_t *w, const int32_t *bias,
                                     const uint16_t *mult, const uint8_t *shift, int8_t *y,
                                     int32_t *part, int m, int n, int k, int relu, int mode) {
#pragma HLS INTERFACE m_axi port = x offset = slave bundle = gmem0 max_read_burst_length = 64 max_widen_bitwidth = 512
#pragma HLS INTERFACE m_axi port = w offset = slave bundle = gmem1 max_read_burst_length = 64 max_widen_bitwidth = 512
#pragma HLS INTERFACE m_axi port = bias offset = slave bundle = gmem2
#pragma HLS INTERFACE m_axi port = mult offset = slave bundle = gmem2
#pragma HLS INTERFACE m_axi port = shift offset = slave bundle = gmem2
#pragma HLS INTERFACE m_axi port = y offset = slave bundle = gmem3 max_write_burst_length = 64 max_widen_bitwidth = 512
#pragma HLS INTERFACE m_axi port = part offset = slave bundle = gmem4 max_write_burst_length = 64 max_widen_bitwidth = 512
#pragma HLS INTERFACE s_axilite port = m
#pragma HLS INTERFACE s_axilite port = n
#pragma HLS INTERFACE s_axilite port = k
#pragma HLS INTERFACE s_axilite port = relu
#pragma HLS INTERFACE s_axilite port = mode
#pragma HLS INTERFACE s_axilite port = return
    return gemm_run<GEMM_TN_WIDE>(x, w, bias, mult, shift, y, part, m, n, k, relu, mode);
}

extern "C" int gemm_kernel(const int8_t *x, const int8_t *w, const int32_t *bias,
                           const uint16_t *mult, const uint8_t *shift, int8_t *y, int m, int n,
                           int k, int relu) {
    return gemm_kernel_pass(x, w, bias, mult, shift, y, 0, m, n, k, relu, 0);
}

extern "C" int gemm_max_k(void) { return GEMM_MAX_K; }
