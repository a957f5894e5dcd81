// CPU emulation of moe_route_fused_* (common/moe_route.cu), run by route_run.sh: each block is
// a forked process (so the kernel's static __shared__ arrays are per block) running one
// std::thread per CUDA thread; device memory is one MAP_SHARED arena, so the grid barriers
// (atomics on it) and the cross-block reads work as on the GPU. Every output is poisoned
// first and compared with a plain reference: ids, counts, permutation, offsets exact; weights
// and losses within 1e-5 / 1e-4 relative.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

using std::max;
using std::min;

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __restrict__

typedef unsigned long long u64_t;
typedef unsigned short h16_t;
struct emu_dim3 { unsigned x = 0, y = 1, z = 1; };
thread_local emu_dim3 threadIdx, blockIdx;
emu_dim3 blockDim, gridDim;

#define TANDEM_NEG_INF (-INFINITY)
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };

inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float bf2f(h16_t h) { return __uint_as_float((unsigned)h << 16); }
inline float h2f(h16_t b) { _Float16 h; std::memcpy(&h, &b, 2); return (float)h; }
template <typename T> inline T __ldg(const T* p) { return *p; }
template <typename T> inline T __ldcg(const T* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
inline float __ldcg(const float* p) {
    unsigned u = __atomic_load_n((const unsigned*)p, __ATOMIC_RELAXED);
    return __uint_as_float(u);
}
template <typename T> inline void __stcg(T* p, T v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned route_ld_acquire(const unsigned* p) {
    unsigned v = __atomic_load_n(p, __ATOMIC_ACQUIRE);
    if (v < gridDim.x) std::this_thread::yield();
    return v;
}

// Per block (process): the block barrier and each warp's exchange slots.
std::barrier<>* emu_block_bar = nullptr;
struct Warp {
    std::barrier<>* bar;
    unsigned u[32];
    float f[32];
    int i[32];
};
Warp* emu_warps = nullptr;
inline void __syncthreads() { emu_block_bar->arrive_and_wait(); }
inline Warp& my_warp() { return emu_warps[threadIdx.x / 32]; }
inline void __syncwarp(unsigned = 0xffffffffu) { my_warp().bar->arrive_and_wait(); }
template <typename F>
inline unsigned warp_reduce_u(unsigned v, F f) {
    Warp& w = my_warp();
    w.u[threadIdx.x & 31] = v;
    w.bar->arrive_and_wait();
    unsigned r = w.u[0];
    for (int l = 1; l < 32; ++l) r = f(r, w.u[l]);
    w.bar->arrive_and_wait();
    return r;
}
inline unsigned __reduce_max_sync(unsigned, unsigned v) {
    return warp_reduce_u(v, [](unsigned a, unsigned b) { return a > b ? a : b; });
}
inline unsigned __reduce_min_sync(unsigned, unsigned v) {
    return warp_reduce_u(v, [](unsigned a, unsigned b) { return a < b ? a : b; });
}
inline float __shfl_xor_sync(unsigned, float v, int o) {
    Warp& w = my_warp();
    const int lane = threadIdx.x & 31;
    w.f[lane] = v;
    w.bar->arrive_and_wait();
    const float r = w.f[lane ^ o];
    w.bar->arrive_and_wait();
    return r;
}
inline int __shfl_up_sync(unsigned, int v, int o) {
    Warp& w = my_warp();
    const int lane = threadIdx.x & 31;
    w.i[lane] = v;
    w.bar->arrive_and_wait();
    const int r = lane >= o ? w.i[lane - o] : v;
    w.bar->arrive_and_wait();
    return r;
}
inline int __shfl_sync(unsigned, int v, int src) {
    Warp& w = my_warp();
    const int lane = threadIdx.x & 31;
    w.i[lane] = v;
    w.bar->arrive_and_wait();
    const int r = w.i[src & 31];
    w.bar->arrive_and_wait();
    return r;
}
inline unsigned __ballot_sync(unsigned, bool p) {
    Warp& w = my_warp();
    const int lane = threadIdx.x & 31;
    w.i[lane] = p ? 1 : 0;
    w.bar->arrive_and_wait();
    unsigned m = 0;
    for (int l = 0; l < 32; ++l)
        if (w.i[l]) m |= 1u << l;
    w.bar->arrive_and_wait();
    return m;
}
inline int __ffs(unsigned v) { return __builtin_ffs((int)v); }
inline unsigned __match_any_sync(unsigned, int v) {
    Warp& w = my_warp();
    const int lane = threadIdx.x & 31;
    w.i[lane] = v;
    w.bar->arrive_and_wait();
    unsigned m = 0;
    for (int l = 0; l < 32; ++l)
        if (w.i[l] == v) m |= 1u << l;
    w.bar->arrive_and_wait();
    return m;
}

// common.cuh's ex2.approx.ftz.f32 (the hardware's is within 2 ulp of this)
inline float fast_exp2(float x) {
    const float r = std::exp2(x);
    return std::fpclassify(r) == FP_SUBNORMAL ? 0.f : r;
}

// common.cuh's reductions, as written there
inline float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
inline float block_sum(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = lane < nwarps ? red[lane] : 0.f;
    return warp_sum(t);
}

struct RouteF32 {
    typedef float T;
    static float ld(const float* p) { return *p; }
    template <int N>
    static void words(const unsigned (&w)[N], float* out) {
        for (int i = 0; i < N; ++i) out[i] = __uint_as_float(w[i]);
    }
};
template <float (*CV)(h16_t)>
struct Route16 {
    typedef h16_t T;
    static float ld(const h16_t* p) { return CV(*p); }
    template <int N>
    static void words(const unsigned (&w)[N], float* out) {
        for (int i = 0; i < N; ++i) {
            out[2 * i] = CV((h16_t)(w[i] & 0xffffu));
            out[2 * i + 1] = CV((h16_t)(w[i] >> 16));
        }
    }
};
typedef Route16<bf2f> RouteBF16;
typedef Route16<h2f> RouteF16;

#include "route.inc"

// ---- device memory: one shared arena
unsigned char* arena = nullptr;
size_t arena_used = 0;
const size_t ARENA = size_t(256) << 20;
template <typename T>
T* dalloc(size_t n) {
    arena_used = (arena_used + 255) / 256 * 256;
    T* p = (T*)(arena + arena_used);
    arena_used += n * sizeof(T) + 4;
    return p;
}

typedef void (*Kernel)(const float*, int, int, int, int, int, int, int*, float*, int*, int*, int*,
                       float*, float*, int*, float*, float*, int*, float*, float*, unsigned*);

void launch(Kernel kern, unsigned grid, unsigned threads, const std::vector<void*>& a, int T, int E,
            int k, int renorm, int bs, int P) {
    gridDim.x = grid;
    blockDim.x = threads;
    std::vector<pid_t> kids;
    for (unsigned b = 0; b < grid; ++b) {
        pid_t pid = fork();
        if (pid == 0) {
            std::barrier<> bb(threads);
            emu_block_bar = &bb;
            std::vector<Warp> warps(threads / 32);
            std::vector<std::barrier<>*> wb;
            for (auto& w : warps) w.bar = new std::barrier<>(32);
            emu_warps = warps.data();
            std::vector<std::thread> ts;
            for (unsigned t = 0; t < threads; ++t)
                ts.emplace_back([&, t] {
                    threadIdx.x = t;
                    blockIdx.x = b;
                    kern((const float*)a[0], T, E, k, renorm, bs, P, (int*)a[1], (float*)a[2],
                         (int*)a[3], (int*)a[4], (int*)a[5], (float*)a[6], (float*)a[7],
                         (int*)a[8], (float*)a[9], (float*)a[10], (int*)a[11], (float*)a[12],
                         (float*)a[13], (unsigned*)a[14]);
                });
            for (auto& t : ts) t.join();
            _exit(0);
        }
        kids.push_back(pid);
    }
    for (pid_t p : kids) {
        int st = 0;
        waitpid(p, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            std::printf("block process failed\n");
            std::exit(1);
        }
    }
}

// ---- the reference: lower expert first on equal logits (-0 == +0), counting sort by expert
struct Ref {
    std::vector<int> ids, counts, sorted, offsets;
    std::vector<double> w;
    double aux = 0, z = 0;
};
Ref reference(const std::vector<float>& l, int T, int E, int k, bool renorm, int bs, int P) {
    Ref r;
    std::vector<double> psum(E, 0.0);
    r.counts.assign(E, 0);
    for (int t = 0; t < T; ++t) {
        const float* row = &l[(size_t)t * E];
        double m = -INFINITY;
        for (int e = 0; e < E; ++e) m = std::max(m, (double)row[e]);
        double s = 0;
        for (int e = 0; e < E; ++e) s += std::exp(row[e] - m);
        for (int e = 0; e < E; ++e) psum[e] += std::exp(row[e] - m) / s;
        const double lse = m + std::log(s);
        r.z += lse * lse;
        std::vector<int> o(E);
        for (int e = 0; e < E; ++e) o[e] = e;
        std::stable_sort(o.begin(), o.end(), [&](int a, int b) { return row[a] > row[b]; });
        double kept = 0;
        for (int j = 0; j < k; ++j) kept += std::exp(row[o[j]] - m) / s;
        for (int j = 0; j < k; ++j) {
            r.ids.push_back(o[j]);
            const double p = std::exp(row[o[j]] - m) / s;
            r.w.push_back(renorm ? p / kept : p);
            r.counts[o[j]]++;
        }
    }
    r.offsets.push_back(0);
    for (int e = 0; e < E; ++e) r.offsets.push_back(r.offsets.back() + (r.counts[e] + bs - 1) / bs * bs);
    r.sorted.assign(P, T * k);
    std::vector<int> cur(r.offsets.begin(), r.offsets.end() - 1);
    for (int s = 0; s < T * k; ++s) r.sorted[cur[r.ids[s]]++] = s;
    if (T > 0) {
        double a = 0;
        for (int e = 0; e < E; ++e) a += (double)r.counts[e] / T * (psum[e] / T);
        r.aux = E * a;
        r.z /= T;
    } else {
        r.z = 0;
    }
    return r;
}

// The `_g` builds with the barrier word in the arena (the kernel's module global would be
// private to each block's process here): one word for the whole run, zeroed once, never
// poisoned, so every launch finds it as the previous one left it (self-resetting).
unsigned* gen_bar = nullptr;
template <int V, int W>
void fused_g(const float* l, int T, int E, int k, int renorm, int bs, int P, int* ids, float* w,
             int* counts, int* sorted, int* offsets, float* aux, float* z, int* cnt, float* ps,
             float* zs, int* tc, float* tp, float* tz, unsigned*) {
    moe_route_fused_impl<RouteF32, V, true, W>(l, T, E, k, renorm, bs, P, ids, w, counts, sorted,
                                            offsets, aux, z, cnt, ps, zs, tc, tp, tz, gen_bar);
}

bool use_gen = false;
int warps = 16;  // 16: the shipped 512-thread builds; 8: 256 threads (gen only)
Kernel pick(int E, bool gen) {
    if (warps == 8) {
        if (E <= 32) return fused_g<1, 8>;
        if (E <= 64) return fused_g<2, 8>;
        if (E <= 128) return fused_g<4, 8>;
        return fused_g<8, 8>;
    }
    if (E <= 32) return gen ? fused_g<1, 16> : moe_route_fused_f32_v1;
    if (E <= 64) return gen ? fused_g<2, 16> : moe_route_fused_f32_v2;
    if (E <= 128) return gen ? fused_g<4, 16> : moe_route_fused_f32_v4;
    return gen ? fused_g<8, 16> : moe_route_fused_f32_v8;
}

int fails = 0;

void run_case(std::mt19937& rng, int T, int E, int k, bool renorm, int bs, unsigned grid, int kind) {
    arena_used = 0;
    const int P = (T * k + E * (bs - 1) + bs - 1) / bs * bs;
    std::vector<float> l((size_t)T * E);
    std::uniform_real_distribution<float> u(-3.f, 3.f);
    const float levels[] = {-1.5f, -0.25f, -0.0f, 0.0f, 0.5f, 0.75f, 2.0f};
    for (size_t i = 0; i < l.size(); ++i) {
        if (kind == 1 && (rng() & 1)) l[i] = levels[rng() % 7];
        else if (kind == 2) l[i] = (i % E == (size_t)E - 1) ? 20.f : u(rng);  // one expert takes all
        else l[i] = u(rng);
    }
    float* dl = dalloc<float>(l.size());
    std::memcpy(dl, l.data(), l.size() * 4);
    int* ids = dalloc<int>(T * k);
    float* w = dalloc<float>(T * k);
    int* counts = dalloc<int>(E);
    int* sorted = dalloc<int>(P);
    int* offsets = dalloc<int>(E + 1);
    float* aux = dalloc<float>(1);
    float* z = dalloc<float>(1);
    int* cnt = dalloc<int>((size_t)E * grid);
    float* ps = dalloc<float>((size_t)E * grid);
    float* zs = dalloc<float>(grid);
    int* tc = dalloc<int>(E);
    float* tp = dalloc<float>(E);
    float* tz = dalloc<float>(1);
    unsigned* bar = dalloc<unsigned>(1);
    const size_t used = arena_used;
    std::memset(arena, 0x7f, used);  // poison everything, the barrier zeroed as the host does
    std::memcpy(dl, l.data(), l.size() * 4);
    *bar = 0;
    launch(pick(E, use_gen), grid, 32 * warps,
           {dl, ids, w, counts, sorted, offsets, aux, z, cnt, ps, zs, tc, tp, tz, bar}, T, E, k,
           renorm, bs, P);
    Ref r = reference(l, T, E, k, renorm, bs, P);
    auto bad = [&](const char* what, const int* got, const std::vector<int>& want) {
        for (size_t i = 0; i < want.size(); ++i)
            if (got[i] != want[i]) {
                std::printf("  %s[%zu] = %d, want %d\n", what, i, got[i], want[i]);
                return true;
            }
        return false;
    };
    bool f = bad("topk_ids", ids, r.ids) | bad("expert_counts", counts, r.counts) |
             bad("sorted_token_ids", sorted, r.sorted) | bad("expert_offsets", offsets, r.offsets);
    double num = 0, den = 0;
    for (size_t i = 0; i < r.w.size(); ++i) {
        num += (w[i] - r.w[i]) * (w[i] - r.w[i]);
        den += r.w[i] * r.w[i];
    }
    const double we = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    const double ae = std::fabs(*aux - r.aux) / std::max(1e-30, std::fabs(r.aux));
    const double ze = std::fabs(*z - r.z) / std::max(1e-30, std::fabs(r.z));
    if (!(we < 1e-5) || !(ae < 1e-4 || (r.aux == 0 && *aux == 0)) || !(ze < 1e-4 || (r.z == 0 && *z == 0))) {
        std::printf("  weights %.2e aux %.2e (%g vs %g) z %.2e (%g vs %g)\n", we, ae, *aux, r.aux, ze,
                    *z, r.z);
        f = true;
    }
    std::printf("%s %s w%d T%d E%d k%d renorm %d bs %d grid %u kind %d\n", f ? "FAIL" : "ok  ",
                use_gen ? "gen " : "memset", warps, T, E, k, renorm, bs, grid, kind);
    if (use_gen && *gen_bar != 0u && *gen_bar != 0x80000000u) {
        std::printf("FAIL the gen barrier word is %#x after the launch\n", *gen_bar);
        f = true;
    }
    fails += f;
}


int main() {
    arena = (unsigned char*)mmap(nullptr, ARENA, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                                 -1, 0);
    if (arena == MAP_FAILED) return 2;
    gen_bar = (unsigned*)(arena + ARENA - 256);
    *gen_bar = 0u;
    // 0: memset builds, 1: self-resetting builds (both 16 warps a block, as shipped),
    // 2: self-resetting with 8 warps a block. EMU_ROUTE_MODES (e.g. "1") picks some of them.
    const char* modes = std::getenv("EMU_ROUTE_MODES");
    for (int mode = 0; mode < 3; ++mode) {
    if (modes && !std::strchr(modes, '0' + mode)) continue;
    use_gen = mode >= 1;
    warps = mode == 2 ? 8 : 16;
    std::mt19937 rng(12345);
    // (T, E, k, renorm, bs, grid, kind: 0 random, 1 tied, 2 one expert)
    run_case(rng, 0, 8, 2, true, 16, 1, 0);
    run_case(rng, 1, 1, 1, true, 16, 1, 0);
    run_case(rng, 1, 3, 3, false, 4, 1, 1);
    run_case(rng, 5, 8, 2, false, 4, 2, 1);
    run_case(rng, 37, 16, 4, true, 1, 3, 1);
    run_case(rng, 100, 33, 5, true, 8, 4, 1);
    run_case(rng, 64, 64, 8, false, 16, 4, 0);
    run_case(rng, 70, 100, 6, true, 16, 3, 2);
    run_case(rng, 50, 256, 8, true, 64, 4, 1);
    run_case(rng, 20, 64, 40, true, 16, 2, 1);
    run_case(rng, 9, 200, 33, false, 4, 3, 0);
    run_case(rng, 3, 8, 2, true, 16, 4, 0);  // more blocks than tokens' worth: idle blocks
    run_case(rng, 300, 128, 8, true, 16, 6, 1);
    run_case(rng, 257, 8, 2, false, 16, 5, 2);
    run_case(rng, 2000, 256, 8, true, 16, 7, 0);
    run_case(rng, 1, 256, 8, true, 16, 1, 1);  // one block: 2^31 added at once
    }
    std::printf(fails ? "%d case(s) failed\n" : "all cases passed\n", fails);
    return fails ? 1 : 0;
}
