// CPU stand-ins for the CUDA built-ins and PTX wrappers moe_experts.cu and attention_decode.cu
// use, so their kernels run on the host (one std::thread per CUDA thread, std::barrier for
// __syncthreads and for the warp collectives: ldmatrix / mma.sync, __shfl_xor_sync). Semantics
// follow the PTX ISA fragment layouts of ldmatrix.m8n8.x4.b16 and mma.m16n8k16.row.col.
// cp.async copies are either done at once (EMU_EAGER=1) or deferred until the
// cp.async.wait_group that must cover them (default), so reading a stage before its wait, or
// refilling a stage others still read, shows up as a wrong result in one of the two modes.
#pragma once
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

using std::max;
using std::min;

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) alignas(n)
#define __restrict__

typedef unsigned short bf16_t;
typedef unsigned long long u64_t;
struct uint4 { unsigned x, y, z, w; };
struct emu_dim3 { unsigned x = 0, y = 1, z = 1; };
thread_local emu_dim3 threadIdx, blockIdx;
emu_dim3 blockDim, gridDim;
alignas(16) unsigned char moe_smem[256 * 1024];

std::barrier<>* emu_block_bar = nullptr;
std::barrier<>* emu_warp_bar[32] = {};
inline void __syncthreads() { emu_block_bar->arrive_and_wait(); }
std::atomic<int> emu_count{0};
// Number of threads with pred != 0 (two barriers: everyone added, then everyone read, before
// thread 0 resets the counter for the next call).
inline int __syncthreads_count(int pred) {
    if (pred) emu_count.fetch_add(1);
    emu_block_bar->arrive_and_wait();
    const int n = emu_count.load();
    emu_block_bar->arrive_and_wait();
    if (threadIdx.x == 0) emu_count.store(0);
    emu_block_bar->arrive_and_wait();
    return n;
}

inline unsigned short bf16_bits(float f) {  // round to nearest even
    unsigned u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return (unsigned short)(u >> 16);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}
inline float bf16_float(unsigned short h) {
    unsigned u = (unsigned)h << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline unsigned short f16_bits(float f) {
    _Float16 h = (_Float16)f;
    unsigned short b;
    std::memcpy(&b, &h, 2);
    return b;
}
inline float f16_float(unsigned short b) {
    _Float16 h;
    std::memcpy(&h, &b, 2);
    return (float)h;
}
inline unsigned pack_bf16x2(float lo, float hi) { return bf16_bits(lo) | ((unsigned)bf16_bits(hi) << 16); }
inline float bf_lo(unsigned w) { return bf16_float((unsigned short)(w & 0xffffu)); }
inline float bf_hi(unsigned w) { return bf16_float((unsigned short)(w >> 16)); }
inline float fast_exp2(float x) { return std::exp2(x); }

// ---- warp collectives ----
thread_local int emu_lane, emu_warp;

// Runs one block of `threads` emulated CUDA threads (one std::thread each) at block index
// (bx, by, bz), with the block barrier and one barrier per warp that the collectives use.
inline void emu_run_block(unsigned threads, unsigned bx, unsigned by, unsigned bz,
                          const std::function<void()>& f) {
    std::barrier<> bb(threads);
    std::vector<std::unique_ptr<std::barrier<>>> wb;
    for (unsigned w = 0; w < threads / 32; ++w) {
        wb.emplace_back(new std::barrier<>(32));
        emu_warp_bar[w] = wb.back().get();
    }
    emu_block_bar = &bb;
    std::vector<std::thread> ts;
    for (unsigned t = 0; t < threads; ++t)
        ts.emplace_back([&, t] {
            threadIdx.x = t;
            blockIdx.x = bx;
            blockIdx.y = by;
            blockIdx.z = bz;
            emu_lane = t & 31;
            emu_warp = t >> 5;
            f();
        });
    for (auto& t : ts) t.join();
}
struct EmuWarp {
    const unsigned short* addr[32];
    unsigned a[32][4], b[32][2];
    float c[32][4];
};
EmuWarp emu_wx[32];

inline void moe_ldsm_x4(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3, const void* p) {
    EmuWarp& x = emu_wx[emu_warp];
    x.addr[emu_lane] = (const unsigned short*)p;
    emu_warp_bar[emu_warp]->arrive_and_wait();
    unsigned r[4];
    for (int i = 0; i < 4; ++i) {
        const unsigned short* row = x.addr[i * 8 + emu_lane / 4];
        const int c = 2 * (emu_lane % 4);
        r[i] = row[c] | ((unsigned)row[c + 1] << 16);
    }
    emu_warp_bar[emu_warp]->arrive_and_wait();
    r0 = r[0]; r1 = r[1]; r2 = r[2]; r3 = r[3];
}

// d = a b + c for m16n8k16, a row-major 16x16, b "col" 16x8; `dec` decodes one 16-bit value.
template <float (*dec)(unsigned short)>
inline void emu_mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    EmuWarp& x = emu_wx[emu_warp];
    const int l = emu_lane;
    for (int i = 0; i < 4; ++i) { x.a[l][i] = a[i]; x.c[l][i] = c[i]; }
    x.b[l][0] = b0; x.b[l][1] = b1;
    emu_warp_bar[emu_warp]->arrive_and_wait();
    auto A = [&](int m, int k) {
        const unsigned w = x.a[(m % 8) * 4 + (k % 8) / 2][(m >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)];
        return dec((unsigned short)((k & 1) ? (w >> 16) : (w & 0xffffu)));
    };
    auto B = [&](int k, int n) {
        const unsigned w = x.b[n * 4 + (k % 8) / 2][k >= 8 ? 1 : 0];
        return dec((unsigned short)((k & 1) ? (w >> 16) : (w & 0xffffu)));
    };
    const int g = l >> 2, tq = l & 3;
    float out[4];
    for (int i = 0; i < 4; ++i) {
        const int m = g + (i >> 1) * 8, n = 2 * tq + (i & 1);
        float s = x.c[l][i];
        for (int k = 0; k < 16; ++k) s += A(m, k) * B(k, n);
        out[i] = s;
    }
    emu_warp_bar[emu_warp]->arrive_and_wait();
    for (int i = 0; i < 4; ++i) c[i] = out[i];
}

struct MoeBf16 {
    typedef bf16_t T;
    static void mma(float* c, const unsigned* a, unsigned b0, unsigned b1) { emu_mma<bf16_float>(c, a, b0, b1); }
    static unsigned pack2(float lo, float hi) { return pack_bf16x2(lo, hi); }
    static float lo(unsigned w) { return bf_lo(w); }
    static float hi(unsigned w) { return bf_hi(w); }
};
struct MoeF16 {
    typedef unsigned short T;
    static void mma(float* c, const unsigned* a, unsigned b0, unsigned b1) { emu_mma<f16_float>(c, a, b0, b1); }
    static unsigned pack2(float lo, float hi) { return f16_bits(lo) | ((unsigned)f16_bits(hi) << 16); }
    static float lo(unsigned w) { return f16_float((unsigned short)(w & 0xffffu)); }
    static float hi(unsigned w) { return f16_float((unsigned short)(w >> 16)); }
};

// ---- cp.async ----
bool emu_eager = false;
struct EmuCopy { void* dst; const void* src; int n; int group; };
thread_local std::vector<EmuCopy> emu_pending;
thread_local int emu_groups = 0;
inline void emu_do(const EmuCopy& c) {
    std::memset(c.dst, 0, 16);
    if (c.n) std::memcpy(c.dst, c.src, 16);
}
inline void moe_cp_async16(void* smem, const void* gmem, bool pred) {
    if ((reinterpret_cast<uintptr_t>(smem) & 15) || (pred && (reinterpret_cast<uintptr_t>(gmem) & 15))) {
        std::fprintf(stderr, "misaligned cp.async\n");
        std::abort();
    }
    EmuCopy c{smem, gmem, pred ? 16 : 0, emu_groups};
    if (emu_eager) emu_do(c);
    else emu_pending.push_back(c);
}
inline void moe_cp_async_commit() { ++emu_groups; }
template <int N>
inline void moe_cp_async_wait() {
    std::vector<EmuCopy> keep;
    for (const auto& c : emu_pending) {
        if (c.group < emu_groups - N) emu_do(c);
        else keep.push_back(c);
    }
    emu_pending.swap(keep);
}
inline float moe_silu(float g) { return g / (1.f + fast_exp2(-1.4426950408889634f * g)); }

// ---- attention_decode.cu (decode_main.cpp) ----
typedef unsigned short h16_t;
#define TANDEM_NEG_INF (-INFINITY)
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __log2f(float x) { return std::log2(x); }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
// The storage tags of common.cuh.
struct BF16 {
    static unsigned pack2(float lo, float hi) { return pack_bf16x2(lo, hi); }
    static float to_f(h16_t h) { return bf16_float(h); }
    static h16_t from_f(float f) { return bf16_bits(f); }
    static float lo(unsigned w) { return bf_lo(w); }
    static float hi(unsigned w) { return bf_hi(w); }
};
struct F16 {
    static unsigned pack2(float lo, float hi) { return f16_bits(lo) | ((unsigned)f16_bits(hi) << 16); }
    static float to_f(h16_t h) { return f16_float(h); }
    static h16_t from_f(float f) { return f16_bits(f); }
    static float lo(unsigned w) { return f16_float((unsigned short)(w & 0xffffu)); }
    static float hi(unsigned w) { return f16_float((unsigned short)(w >> 16)); }
};
template <typename S>
inline void unpack8_as(const uint4 v, float* f) {
    f[0] = S::lo(v.x); f[1] = S::hi(v.x); f[2] = S::lo(v.y); f[3] = S::hi(v.y);
    f[4] = S::lo(v.z); f[5] = S::hi(v.z); f[6] = S::lo(v.w); f[7] = S::hi(v.w);
}
// __shfl_xor_sync: every lane of the warp must call it (as on the GPU with a full mask). With
// emu_skew the odd warps sleep at each one, so the even warps run ahead to the next barrier: a
// stage refilled before every warp is done with it then gets overwritten under the slow
// warps' reads (with eager copies).
float emu_xchg[32][32];
bool emu_skew = false;
inline float __shfl_xor_sync(unsigned, float v, int o) {
    if (emu_skew && (emu_warp & 1)) std::this_thread::sleep_for(std::chrono::microseconds(20));
    emu_xchg[emu_warp][emu_lane] = v;
    emu_warp_bar[emu_warp]->arrive_and_wait();
    const float r = emu_xchg[emu_warp][emu_lane ^ o];
    emu_warp_bar[emu_warp]->arrive_and_wait();
    return r;
}
inline int __syncthreads_or(int pred) { return __syncthreads_count(pred) != 0; }
// The dynamic shared memory of the partial kernels (the `extern __shared__` line is dropped);
// the harness checks that nothing past the host's byte count is written.
alignas(16) unsigned char dec_smem[227 * 1024];  // the most a block may take
inline void dec_cp_async16(void* smem, const void* gmem, bool pred) { moe_cp_async16(smem, gmem, pred); }
inline void dec_cp_async_commit() { moe_cp_async_commit(); }
template <int N>
inline void dec_cp_async_wait() { moe_cp_async_wait<N>(); }

// The decode kernel's tensor-core path (d64, d128): ldmatrix x4 (plain and .trans) and mma
// m16n8k16 / m16n8k8 with the A rows 8..15 zero, per the PTX ISA fragment layouts.
inline void dec_ldsm_x4(unsigned (&r)[4], const void* p) { moe_ldsm_x4(r[0], r[1], r[2], r[3], p); }
// .trans: lane (g, tq) of matrix i gets its rows 2 tq and 2 tq + 1 at column g.
inline void dec_ldsm_x4_t(unsigned (&r)[4], const void* p) {
    EmuWarp& x = emu_wx[emu_warp];
    x.addr[emu_lane] = (const unsigned short*)p;
    emu_warp_bar[emu_warp]->arrive_and_wait();
    unsigned t[4];
    const int g = emu_lane / 4, tq = emu_lane % 4;
    for (int i = 0; i < 4; ++i)
        t[i] = x.addr[i * 8 + 2 * tq][g] | ((unsigned)x.addr[i * 8 + 2 * tq + 1][g] << 16);
    emu_warp_bar[emu_warp]->arrive_and_wait();
    for (int i = 0; i < 4; ++i) r[i] = t[i];
}
template <typename S>
inline void dec_mma16(float (&c)[4], unsigned a0, unsigned a2, unsigned b0, unsigned b1) {
    const unsigned a[4] = {a0, 0u, a2, 0u};
    emu_mma<&S::to_f>(c, a, b0, b1);
}
// d = a b + c for m16n8k8: a 16x8 (a0: row g, a1: row g + 8; k 2 tq, 2 tq + 1), b 8x8 (b0: k
// 2 tq, 2 tq + 1 at n g).
template <typename S>
inline void dec_mma8(float (&c)[4], unsigned a0, unsigned b0) {
    EmuWarp& x = emu_wx[emu_warp];
    const int l = emu_lane;
    x.a[l][0] = a0;
    x.a[l][1] = 0u;
    x.b[l][0] = b0;
    for (int i = 0; i < 4; ++i) x.c[l][i] = c[i];
    emu_warp_bar[emu_warp]->arrive_and_wait();
    auto half = [](unsigned w, int k) { return S::to_f((unsigned short)((k & 1) ? (w >> 16) : (w & 0xffffu))); };
    auto A = [&](int m, int k) { return half(x.a[(m % 8) * 4 + k / 2][m >= 8 ? 1 : 0], k); };
    auto B = [&](int k, int n) { return half(x.b[n * 4 + k / 2][0], k); };
    const int g = l >> 2, tq = l & 3;
    float out[4];
    for (int i = 0; i < 4; ++i) {
        const int m = g + (i >> 1) * 8, n = 2 * tq + (i & 1);
        float s = x.c[l][i];
        for (int k = 0; k < 8; ++k) s += A(m, k) * B(k, n);
        out[i] = s;
    }
    emu_warp_bar[emu_warp]->arrive_and_wait();
    for (int i = 0; i < 4; ++i) c[i] = out[i];
}
