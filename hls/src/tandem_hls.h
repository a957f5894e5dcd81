// tandem HLS kernels: shared declarations.
//
// Vitis HLS C++ of tandem's FPGA kernels (router, gemm, attention). The fixed-point semantics
// are those of the Rust golden models in fpga::golden (docs/FPGA.md); the Rust crate
// tandem-hls builds these files with a plain g++ and checks them bit for bit.
//
// Only plain integer types are used, so no Xilinx header is needed: the HLS pragmas are
// ignored by g++ (-Wno-unknown-pragmas) and honoured by Vitis HLS.
#ifndef TANDEM_HLS_H
#define TANDEM_HLS_H

#include <stdint.h>

// ---- GEMM -------------------------------------------------------------------------------
// Output tile (rows of x by rows of w) computed by the MAC array at once.
#define GEMM_TM 8
#define GEMM_TN 8
// Lanes of the wide build (gemm_kernel_pass_wide): the int8 of one 512-bit beat.
#ifndef GEMM_TN_WIDE
#define GEMM_TN_WIDE 64
#endif
// Largest inner dimension held on chip.
#define GEMM_MAX_K 4096
// `mode` bits of a K-split pass: add the int32 partials in `part` (ACC_IN); write the sums to
// `part` instead of y, without bias, ReLU and requantisation (PART_OUT).
#define GEMM_MODE_ACC_IN 1
#define GEMM_MODE_PART_OUT 2

// ---- attention ----------------------------------------------------------------------------
// Keys per online-softmax tile (the golden model's kv_tile).
#define ATT_KV_TILE 16
// Largest head dimension.
#define ATT_MAX_D 256
// Fractional bits of the log2-domain logits, entries of the exp2 LUT.
#define ATT_FRAC 8
#define ATT_LUT_SIZE 256
// Rescale shifts at or beyond this give zero.
#define ATT_SHIFT_ZERO 40

// ---- router -------------------------------------------------------------------------------
// Largest number of experts and of selected experts.
#define ROUTER_MAX_E 4096
#define ROUTER_MAX_K 32
// Logits per cycle of the top function (the RTL's default build: one 64-bit word of 4).
#ifndef ROUTER_LANES
#define ROUTER_LANES 4
#endif

// ---- vecops ------------------------------------------------------------------------------
// Longest row held on chip (elements), the sigmoid table's half range, RoPE's Q1.14.
#define VEC_MAX_N 65536
#define VEC_SIG_HALF 512
#define VEC_ROPE_FRAC 14

#ifdef __cplusplus
extern "C" {
#endif

// y[m][n] = sat8(requant_n(act(sum_k x[m][k] w[n][k] + bias[n]))); returns 0, or -1 when the
// dimensions are out of range (k > GEMM_MAX_K, any of m, n, k < 1).
int gemm_kernel(const int8_t *x, const int8_t *w, const int32_t *bias, const uint16_t *mult,
                const uint8_t *shift, int8_t *y, int m, int n, int k, int relu);

// One pass of a GEMM whose K is split (K > GEMM_MAX_K): as gemm_kernel over this pass's K
// columns, plus the int32 partials part[m][n] (GEMM_MODE_ACC_IN) and, with GEMM_MODE_PART_OUT,
// the sums written to part instead of y. Returns 0, or -1 when out of range.
int gemm_kernel_pass(const int8_t *x, const int8_t *w, const int32_t *bias,
                     const uint16_t *mult, const uint8_t *shift, int8_t *y, int32_t *part,
                     int m, int n, int k, int relu, int mode);

// gemm_kernel_pass with GEMM_TN_WIDE output columns per tile (the 512-bit build's lanes).
int gemm_kernel_pass_wide(const int8_t *x, const int8_t *w, const int32_t *bias,
                          const uint16_t *mult, const uint8_t *shift, int8_t *y,
                          int32_t *part, int m, int n, int k, int relu, int mode);

// One attention head, see fpga::golden::attention. e_out and l_out get the final exponent and
// running sum of each row. Returns 0, or -1 when out of range.
int attention_kernel(const int8_t *q, const int8_t *k, const int8_t *v, int16_t *o,
                     int32_t *e_out, uint32_t *l_out, int nq, int nkv, int d, int causal,
                     int score_mult, int score_shift);

// The query heads of one GQA group (`heads`, 0 counts as 1; their [nq][d] planes one after
// another in q, o, e_out, l_out) over one K/V range whose sequence has `kv_skip` more keys
// after it (causal: row i of a head sees key j iff j + nq <= i + nkv + kv_skip).
int attention_kernel_group(const int8_t *q, const int8_t *k, const int8_t *v, int16_t *o,
                           int32_t *e_out, uint32_t *l_out, int nq, int nkv, int d, int causal,
                           int score_mult, int score_shift, int heads, int kv_skip);

// MoE router over `tokens` rows of `experts` int16 logits (rows padded to 4); writes routes
// (rows of ceil(k/2)*2 u32 slots, weight << 16 | id) and hist (ceil(E/2)*2 u32); renormalize
// 1: the weights are the softmax over the k chosen, 0: over all experts. Returns 0, or -1 when
// out of range (E > ROUTER_MAX_E, k > ROUTER_MAX_K, k > E, renormalize not 0 or 1).
int router_kernel(const int16_t *logits, uint32_t *routes, uint32_t *hist, int tokens,
                  int experts, int top_k, int renormalize);

// router_kernel with `lanes` (1, 2, 4 or 8) logits per cycle; -1 for another lane count.
int router_kernel_lanes(const int16_t *logits, uint32_t *routes, uint32_t *hist, int tokens,
                        int experts, int top_k, int renormalize, int lanes);

// Vector ops on padded int16 rows, see fpga::golden::vecops (op 0 add, 1 rmsnorm, 2 rmsnorm +
// residual, 3 rope, 4 silu_mul). Returns 0, or -1 for arguments the kernel refuses.
int vecops_kernel(const int16_t *a, const int16_t *b, const int16_t *p, int16_t *y, int16_t *s,
                  int op, int rows, int n, int shift, uint32_t c0, uint32_t c1, int n_max);

// Compile-time parameters, so tests run the golden model with the same ones.
int attention_kv_tile(void);
int gemm_max_k(void);

#ifdef __cplusplus
}
#endif

#endif
