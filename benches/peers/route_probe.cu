// Where the fused routing kernel's time goes: each block's thread 0 stamps %globaltimer at the
// kernel's start, around both grid barriers and at its end (TANDEM_ROUTE_PROBE, compiled into
// this probe only), for several block sizes and grids of the same kernel template the host
// launches. Informs host/src/backend/cuda/ops/moe.rs (the fused grid) and common/moe_route.cu.
//
// Build and run (GPU machine, repo root):
//   nvcc -O3 -std=c++17 -arch=sm_90a -o /tmp/route_probe benches/peers/route_probe.cu
//   /tmp/route_probe [T E k]...        (default: 8192 256 8, then 16384 8 2)
// Prints, per variant: the event-timed median of 200 launches, and per phase the median and
// the maximum over blocks of (stamp - the earliest start), in microseconds.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#define TANDEM_ROUTE_PROBE 1
#include "../../gpu-kernels/src/cuda/common/common.cuh"
#include "../../gpu-kernels/src/cuda/common/moe_route.cu"

#define CK(x)                                                                                \
    do {                                                                                     \
        cudaError_t e_ = (x);                                                                \
        if (e_ != cudaSuccess) {                                                             \
            std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x,                   \
                         cudaGetErrorString(e_));                                            \
            std::exit(1);                                                                    \
        }                                                                                    \
    } while (0)

template <int V, int W>
__global__ void __launch_bounds__(W * 32) probe_kernel(
        const float* __restrict__ logits, int T, int E, int k, int renorm, int bs, int P,
        int* __restrict__ topk_ids, float* __restrict__ topk_w, int* __restrict__ expert_counts,
        int* __restrict__ sorted, int* __restrict__ expert_offsets, float* __restrict__ aux_loss,
        float* __restrict__ z_loss, int* cnt, float* ps, float* zs, int* tot_cnt, float* tot_p,
        float* tot_z, unsigned* bar) {
    moe_route_fused_impl<RouteF32, V, true, W>(logits, T, E, k, renorm, bs, P, topk_ids, topk_w,
                                               expert_counts, sorted, expert_offsets, aux_loss,
                                               z_loss, cnt, ps, zs, tot_cnt, tot_p, tot_z,
                                               &route_gen_bar);
}

struct Bufs {
    float* logits;
    int *ids, *counts, *sorted, *offsets, *cnt, *tot_cnt;
    float *w, *aux, *z, *ps, *zs, *tot_p, *tot_z;
    unsigned* bar;
};

template <int V, int W>
void run(Bufs b, int T, int E, int k, int per_sm_cap, int sms) {
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, probe_kernel<V, W>, W * 32, 0));
    per_sm = std::min(per_sm, per_sm_cap);
    if (per_sm < 1) {
        std::printf("  W%d cap %d: does not fit\n", W, per_sm_cap);
        return;
    }
    const int min_tokens = 32;  // FUSED_MIN_TOKENS_PER_BLOCK
    int g = std::min(sms * per_sm, std::max(1, (T + min_tokens - 1) / min_tokens));
    int bs = 16;
    const int raw = T * k + E * (bs - 1);
    int P = (raw + bs - 1) / bs * bs;
    int renorm = 1;
    void* args[] = {&b.logits, &T,        &E,         &k,     &renorm, &bs,   &P,
                    &b.ids,    &b.w,      &b.counts,  &b.sorted, &b.offsets, &b.aux, &b.z,
                    &b.cnt,    &b.ps,     &b.zs,      &b.tot_cnt, &b.tot_p, &b.tot_z, &b.bar};
    auto launch = [&] {
        CK(cudaLaunchCooperativeKernel((void*)probe_kernel<V, W>, dim3(g), dim3(W * 32), args, 0,
                                       0));
    };
    for (int i = 0; i < 20; ++i) launch();
    CK(cudaDeviceSynchronize());
    const int n = 200;
    std::vector<cudaEvent_t> ev(2 * n);
    for (auto& e : ev) CK(cudaEventCreate(&e));
    for (int i = 0; i < n; ++i) {
        CK(cudaEventRecord(ev[2 * i]));
        launch();
        CK(cudaEventRecord(ev[2 * i + 1]));
    }
    CK(cudaDeviceSynchronize());
    std::vector<float> ms(n);
    for (int i = 0; i < n; ++i) CK(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
    std::sort(ms.begin(), ms.end());
    for (auto& e : ev) CK(cudaEventDestroy(e));
    // one more launch for the stamps (the last one written wins)
    launch();
    CK(cudaDeviceSynchronize());
    std::vector<unsigned long long> st(g * 6);
    CK(cudaMemcpyFromSymbol(st.data(), route_probe_stamps, st.size() * 8));
    unsigned long long t0 = ~0ull;
    for (int i = 0; i < g; ++i) t0 = std::min(t0, st[i * 6]);
    std::printf("  W%-2d %d/SM grid %4d: events median %.2f us (min %.2f)  |", W, per_sm, g,
                ms[n / 2] * 1e3, ms[0] * 1e3);
    const char* names[6] = {"start", "ph1", "bar1", "ph2a", "bar2", "end"};
    for (int p = 0; p < 6; ++p) {
        std::vector<double> v(g);
        for (int i = 0; i < g; ++i) v[i] = (st[i * 6 + p] - t0) * 1e-3;
        std::sort(v.begin(), v.end());
        std::printf(" %s %.2f/%.2f", names[p], v[g / 2], v[g - 1]);
    }
    std::printf("\n");
}

int main(int argc, char** argv) {
    std::vector<int> shapes;
    for (int i = 1; i < argc; ++i) shapes.push_back(std::atoi(argv[i]));
    if (shapes.empty()) shapes = {8192, 256, 8, 16384, 8, 2, 16384, 64, 8, 65536, 128, 8};
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    std::printf("%s, %d SMs\n", prop.name, prop.multiProcessorCount);
    for (size_t s = 0; s + 2 < shapes.size(); s += 3) {
        const int T = shapes[s], E = shapes[s + 1], k = shapes[s + 2];
        std::mt19937 rng(1234);
        std::normal_distribution<float> nd(0.f, 2.f);
        std::vector<float> h((size_t)T * E);
        for (auto& x : h) x = nd(rng);
        Bufs b{};
        const int gmax = 4096;
        CK(cudaMalloc(&b.logits, h.size() * 4));
        CK(cudaMemcpy(b.logits, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMalloc(&b.ids, (size_t)T * k * 4));
        CK(cudaMalloc(&b.w, (size_t)T * k * 4));
        CK(cudaMalloc(&b.counts, E * 4));
        CK(cudaMalloc(&b.sorted, ((size_t)T * k + E * 16) * 4));
        CK(cudaMalloc(&b.offsets, (E + 1) * 4));
        CK(cudaMalloc(&b.aux, 4));
        CK(cudaMalloc(&b.z, 4));
        CK(cudaMalloc(&b.cnt, (size_t)E * gmax * 4));
        CK(cudaMalloc(&b.ps, (size_t)E * gmax * 4));
        CK(cudaMalloc(&b.zs, gmax * 4));
        CK(cudaMalloc(&b.tot_cnt, E * 4));
        CK(cudaMalloc(&b.tot_p, E * 4));
        CK(cudaMalloc(&b.tot_z, 4));
        b.bar = nullptr;
        const int sms = prop.multiProcessorCount;
        std::printf("T%d E%d k%d (stamps: median/max over blocks, us after the first start)\n",
                    T, E, k);
        // the shipped choice first (16 warps, 2 a SM; 1 for E > 128), then 8-warp blocks
        if (E <= 32) {
            run<1, 16>(b, T, E, k, 2, sms);
            run<1, 8>(b, T, E, k, 4, sms);
        } else if (E <= 64) {
            run<2, 16>(b, T, E, k, 2, sms);
            run<2, 8>(b, T, E, k, 4, sms);
        } else if (E <= 128) {
            run<4, 16>(b, T, E, k, 2, sms);
            run<4, 8>(b, T, E, k, 4, sms);
        } else {
            run<8, 16>(b, T, E, k, 1, sms);
            run<8, 16>(b, T, E, k, 2, sms);
            run<8, 8>(b, T, E, k, 2, sms);
        }
        cudaFree(b.logits);
        cudaFree(b.ids);
        cudaFree(b.w);
        cudaFree(b.counts);
        cudaFree(b.sorted);
        cudaFree(b.offsets);
        cudaFree(b.aux);
        cudaFree(b.z);
        cudaFree(b.cnt);
        cudaFree(b.ps);
        cudaFree(b.zs);
        cudaFree(b.tot_cnt);
        cudaFree(b.tot_p);
        cudaFree(b.tot_z);
    }
    return 0;
}
