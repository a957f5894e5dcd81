// Host->device staging designs, measured side by side on one machine: what limits an upload
// from pageable host memory (a tensor as users have it) with f32 -> bf16 conversion, against
// the raw pinned-copy ceiling. Informs host/src/backend/cuda/memory/staging.rs.
//
// Build and run (GPU machine):  nvcc -O3 -std=c++17 -o /tmp/probe benches/peers/staging_probe.cu
//                               -lpthread && /tmp/probe [MiB]
// Prints one line per design: GB/s of host (f32) bytes, and of bytes on the link.
#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <string>
#include <vector>

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static inline uint16_t bf16_rne(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static void convert(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = bf16_rne(src[i]);
}

__global__ void f32_to_bf16(const float* in, __nv_bfloat16* out, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (; i < n; i += stride) out[i] = __float2bfloat16_rn(in[i]);
}

// Runs `fn` on T threads, each given its index; returns wall seconds.
template <class F>
static double on_threads(int T, F fn) {
  double t0 = now();
  std::vector<std::thread> th;
  for (int t = 0; t < T; t++) th.emplace_back(fn, t);
  for (auto& x : th) x.join();
  return now() - t0;
}

struct Args {
  const float* src;
  size_t n;         // f32 elements
  void* dev;        // n * 2 (bf16) or n * 4 (f32) bytes
};

// Design P: T threads, each owning S pinned slots of C bytes (of destination) and its own
// stream; chunks taken from a shared counter; convert into a slot, queue its copy, record.
static double design_per_thread(const Args& a, int T, int S, size_t C, bool conv) {
  size_t esz = conv ? 2 : 4;
  size_t per = C / esz;  // elements per chunk
  size_t chunks = (a.n + per - 1) / per;
  std::atomic<size_t> next{0};
  std::vector<std::vector<void*>> slots(T, std::vector<void*>(S));
  std::vector<std::vector<cudaEvent_t>> evs(T, std::vector<cudaEvent_t>(S));
  std::vector<cudaStream_t> streams(T);
  for (int t = 0; t < T; t++) {
    CK(cudaStreamCreateWithFlags(&streams[t], cudaStreamNonBlocking));
    for (int s = 0; s < S; s++) {
      CK(cudaHostAlloc(&slots[t][s], C, cudaHostAllocDefault));
      CK(cudaEventCreateWithFlags(&evs[t][s], cudaEventDisableTiming));
      CK(cudaEventRecord(evs[t][s], streams[t]));
    }
  }
  CK(cudaDeviceSynchronize());
  double dt = on_threads(T, [&](int t) {
    int s = 0;
    for (;;) {
      size_t k = next.fetch_add(1);
      if (k >= chunks) break;
      size_t off = k * per, len = std::min(per, a.n - off);
      CK(cudaEventSynchronize(evs[t][s]));
      if (conv)
        convert(a.src + off, (uint16_t*)slots[t][s], len);
      else
        std::memcpy(slots[t][s], a.src + off, len * 4);
      CK(cudaMemcpyAsync((char*)a.dev + off * esz, slots[t][s], len * esz,
                         cudaMemcpyHostToDevice, streams[t]));
      CK(cudaEventRecord(evs[t][s], streams[t]));
      s = (s + 1) % S;
    }
    CK(cudaStreamSynchronize(streams[t]));
  });
  for (int t = 0; t < T; t++) {
    for (int s = 0; s < S; s++) {
      CK(cudaFreeHost(slots[t][s]));
      CK(cudaEventDestroy(evs[t][s]));
    }
    CK(cudaStreamDestroy(streams[t]));
  }
  return dt;
}

// Design F (today's tandem): one stream, S slots of C bytes; each chunk converted by all T
// threads (fork-join per chunk), then its copy queued.
static double design_forkjoin(const Args& a, int T, int S, size_t C) {
  size_t per = C / 2;
  size_t chunks = (a.n + per - 1) / per;
  std::vector<void*> slots(S);
  std::vector<cudaEvent_t> evs(S);
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (int s = 0; s < S; s++) {
    CK(cudaHostAlloc(&slots[s], C, cudaHostAllocDefault));
    CK(cudaEventCreateWithFlags(&evs[s], cudaEventDisableTiming));
    CK(cudaEventRecord(evs[s], st));
  }
  CK(cudaDeviceSynchronize());
  double t0 = now();
  for (size_t k = 0; k < chunks; k++) {
    int s = k % S;
    size_t off = k * per, len = std::min(per, a.n - off);
    CK(cudaEventSynchronize(evs[s]));
    size_t part = (len + T - 1) / T;
    on_threads(T, [&](int t) {
      size_t b = t * part, e = std::min(len, b + part);
      if (b < e) convert(a.src + off + b, (uint16_t*)slots[s] + b, e - b);
    });
    CK(cudaMemcpyAsync((char*)a.dev + off * 2, slots[s], len * 2, cudaMemcpyHostToDevice, st));
    CK(cudaEventRecord(evs[s], st));
  }
  CK(cudaStreamSynchronize(st));
  double dt = now() - t0;
  for (int s = 0; s < S; s++) {
    CK(cudaFreeHost(slots[s]));
    CK(cudaEventDestroy(evs[s]));
  }
  CK(cudaStreamDestroy(st));
  return dt;
}

// Downloads: T threads, each copies a chunk of bf16 into its own pinned slot on its own stream,
// waits, and widens it to f32 into the pageable destination.
static double design_down(const Args& a, float* dst, int T, size_t C) {
  size_t per = C / 2;
  size_t chunks = (a.n + per - 1) / per;
  std::atomic<size_t> next{0};
  std::vector<void*> slots(T);
  std::vector<cudaStream_t> streams(T);
  for (int t = 0; t < T; t++) {
    CK(cudaStreamCreateWithFlags(&streams[t], cudaStreamNonBlocking));
    CK(cudaHostAlloc(&slots[t], C, cudaHostAllocDefault));
  }
  double dt = on_threads(T, [&](int t) {
    for (;;) {
      size_t k = next.fetch_add(1);
      if (k >= chunks) break;
      size_t off = k * per, len = std::min(per, a.n - off);
      CK(cudaMemcpyAsync(slots[t], (char*)a.dev + off * 2, len * 2, cudaMemcpyDeviceToHost,
                         streams[t]));
      CK(cudaStreamSynchronize(streams[t]));
      const uint16_t* s = (const uint16_t*)slots[t];
      for (size_t i = 0; i < len; i++) {
        uint32_t u = (uint32_t)s[i] << 16;
        std::memcpy(dst + off + i, &u, 4);
      }
    }
  });
  for (int t = 0; t < T; t++) {
    CK(cudaFreeHost(slots[t]));
    CK(cudaStreamDestroy(streams[t]));
  }
  return dt;
}


// Design R: no staging at all. T threads register the source in place (cudaHostRegister) in
// chunks of about C bytes whose edges are absolute page boundaries (so no two registrations
// share a page), each queueing its chunk's DMA as soon as it is registered; the f32 is
// converted on the GPU afterwards. `unreg`: the unregistration (T threads) is counted too.
// Download (dir 1): the fresh destination's pages are touched by the same threads first,
// then registered and DMA'd into.
static double design_register(void* host, void* dev, size_t bytes, int T, size_t C, bool unreg,
                              int dir) {
  const uintptr_t page = 4096, lo = (uintptr_t)host, hi = lo + bytes;
  const uintptr_t base = lo & ~(page - 1);
  C = (C + page - 1) & ~(page - 1);
  const size_t chunks = (hi - base + C - 1) / C;
  std::vector<cudaStream_t> streams(T);
  for (int t = 0; t < T; t++) CK(cudaStreamCreateWithFlags(&streams[t], cudaStreamNonBlocking));
  std::atomic<size_t> next{0};
  double t0 = now();
  on_threads(T, [&](int t) {
    for (;;) {
      size_t k = next.fetch_add(1);
      if (k >= chunks) break;
      uintptr_t b = std::max(lo, base + k * C), e = std::min(hi, base + (k + 1) * C);
      if (b >= e) continue;
      if (dir == 1)
        for (uintptr_t q = b; q < e; q += page) *(volatile char*)q = 0;
      CK(cudaHostRegister((void*)b, e - b, cudaHostRegisterDefault));
      char* d = (char*)dev + (b - lo);
      if (dir == 0)
        CK(cudaMemcpyAsync(d, (void*)b, e - b, cudaMemcpyHostToDevice, streams[t]));
      else
        CK(cudaMemcpyAsync((void*)b, d, e - b, cudaMemcpyDeviceToHost, streams[t]));
    }
    CK(cudaStreamSynchronize(streams[t]));
  });
  double dt = now() - t0;
  std::atomic<size_t> un{0};
  double t1 = now();
  on_threads(T, [&](int) {
    for (;;) {
      size_t k = un.fetch_add(1);
      if (k >= chunks) break;
      uintptr_t b = std::max(lo, base + k * C), e = std::min(hi, base + (k + 1) * C);
      if (b < e) CK(cudaHostUnregister((void*)b));
    }
  });
  double du = now() - t1;
  for (auto& x : streams) CK(cudaStreamDestroy(x));
  return unreg ? dt + du : dt;
}

int main(int argc, char** argv) {
  size_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 256;
  size_t bytes = mib << 20, n = bytes / 4;
  int hw = (int)std::thread::hardware_concurrency();
  std::printf("host threads %d, %zu MiB of f32\n", hw, mib);
  std::vector<float> src(n);
  for (size_t i = 0; i < n; i++) src[i] = (float)(i % 1000) * 0.001f - 0.5f;
  void *dev, *dev32, *pinned;
  CK(cudaMalloc(&dev, bytes));
  CK(cudaMalloc(&dev32, bytes));
  CK(cudaHostAlloc(&pinned, bytes, cudaHostAllocDefault));
  std::memcpy(pinned, src.data(), bytes);
  Args a{src.data(), n, dev};
  auto best = [](int reps, auto f) {
    double b = 1e9;
    for (int r = 0; r < reps; r++) b = std::min(b, f());
    return b;
  };
  auto line = [&](const char* what, double dt, double link_bytes) {
    std::printf("%-58s %7.2f ms  host %6.1f GB/s  link %6.1f GB/s\n", what, dt * 1e3,
                bytes / dt / 1e9, link_bytes / dt / 1e9);
  };
  double t = best(5, [&] {
    double t0 = now();
    CK(cudaMemcpy(dev32, pinned, bytes, cudaMemcpyHostToDevice));
    return now() - t0;
  });
  line("pinned f32 -> device (ceiling)", t, bytes);
  t = best(3, [&] {
    double t0 = now();
    CK(cudaMemcpy(dev32, src.data(), bytes, cudaMemcpyHostToDevice));
    return now() - t0;
  });
  line("pageable f32 -> device (driver staging)", t, bytes);
  // Register-in-place designs (argv[2] == "register": only these, after the ceilings).
  for (int T : {1, 4, 8, 16}) {
    if (T > hw) continue;
    for (size_t C : {(size_t)8 << 20, (size_t)32 << 20}) {
      for (int unreg = 0; unreg < 2; unreg++) {
        t = best(3, [&] { return design_register(src.data(), dev32, bytes, T, C, unreg, 0); });
        char w[96];
        std::snprintf(w, sizeof w, "register+DMA up, %2d thr x %zu MiB%s", T, C >> 20,
                      unreg ? " +unregister" : "");
        line(w, t, bytes);
      }
    }
  }
  for (int T : {4, 8, 16}) {
    if (T > hw) continue;
    for (size_t C : {(size_t)8 << 20, (size_t)32 << 20}) {
      double tt = 1e9;
      for (int r = 0; r < 3; r++) {
        float* dst = (float*)std::malloc(bytes);
        double t0 = now();
        design_register(dst, dev32, bytes, T, C, true, 1);
        tt = std::min(tt, now() - t0);
        std::free(dst);
      }
      char w[96];
      std::snprintf(w, sizeof w, "fresh: touch+register+DMA down, %2d thr x %zu MiB", T, C >> 20);
      line(w, tt, bytes);
    }
  }
  if (argc > 2 && std::string(argv[2]) == "register") return 0;
  for (int T : {1, 4, 8, 16}) {
    if (T > hw) continue;
    t = best(3, [&] {
      std::vector<uint16_t> out(n);
      size_t part = (n + T - 1) / T;
      return on_threads(T, [&](int i) {
        size_t b = i * part, e = std::min(n, b + part);
        if (b < e) convert(src.data() + b, out.data() + b, e - b);
      });
    });
    char w[96];
    std::snprintf(w, sizeof w, "host only: convert to pageable, %d threads", T);
    line(w, t, 0);
    t = best(3, [&] {
      size_t part = (n + T - 1) / T;
      return on_threads(T, [&](int i) {
        size_t b = i * part, e = std::min(n, b + part);
        if (b < e) convert(src.data() + b, (uint16_t*)pinned + b, e - b);
      });
    });
    std::snprintf(w, sizeof w, "host only: convert to pinned, %d threads", T);
    line(w, t, 0);
  }
  t = best(3, [&] { return design_forkjoin(a, std::min(hw, 16), 3, 8 << 20); });
  line("fork-join 3 x 8 MiB (tandem today), 16 thr", t, bytes / 2);
  for (int T : {2, 4, 8, 12, 16}) {
    if (T > hw) continue;
    for (size_t C : {(size_t)1 << 20, (size_t)4 << 20}) {
      t = best(3, [&] { return design_per_thread(a, T, 2, C, true); });
      char w[96];
      std::snprintf(w, sizeof w, "per-thread convert, %2d thr x 2 slots x %zu MiB", T, C >> 20);
      line(w, t, bytes / 2);
    }
  }
  for (int T : {4, 8, 16}) {
    if (T > hw) continue;
    a.dev = dev32;
    t = best(3, [&] { return design_per_thread(a, T, 2, 4 << 20, false); });
    a.dev = dev;
    char w[96];
    std::snprintf(w, sizeof w, "per-thread raw f32 memcpy, %2d thr (+GPU convert)", T);
    double t0 = now();
    f32_to_bf16<<<1024, 256>>>((const float*)dev32, (__nv_bfloat16*)dev, n);
    CK(cudaDeviceSynchronize());
    double kt = now() - t0;
    line(w, t + kt, bytes);
  }
  t = best(5, [&] {
    double t0 = now();
    CK(cudaMemcpy(pinned, dev32, bytes, cudaMemcpyDeviceToHost));
    return now() - t0;
  });
  line("device f32 -> pinned (download ceiling)", t, bytes);
  {
    std::vector<float> dst(n, 0.f);
    for (int T : {1, 4, 8, 16}) {
      if (T > hw) continue;
      for (size_t C : {(size_t)1 << 20, (size_t)4 << 20}) {
        t = best(3, [&] { return design_down(a, dst.data(), T, C); });
        char w[96];
        std::snprintf(w, sizeof w, "download bf16 -> f32, %2d thr x %zu MiB", T, C >> 20);
        line(w, t, bytes / 2);
      }
    }
  }
  // Downloads into a FRESH destination (as a new host tensor is): the pages are faulted in by
  // the writes. Plain malloc, malloc + MADV_HUGEPAGE, and registering the fresh allocation
  // then DMA of f32 converted on the GPU straight into it.
  for (int mode = 0; mode < 3; mode++) {
    for (int T : {8, 16}) {
      if (T > hw) continue;
      double tt = 1e9;
      for (int r = 0; r < 3; r++) {
        double t0 = now();
        float* dst = (float*)std::malloc(bytes + (2 << 20));
        if (mode == 1) {
          uintptr_t a = ((uintptr_t)dst + (2 << 20) - 1) & ~(uintptr_t)((2 << 20) - 1);
          madvise((void*)a, bytes - (2 << 20), MADV_HUGEPAGE);
        }
        if (mode == 2) {
          CK(cudaHostRegister(dst, bytes, cudaHostRegisterDefault));
          f32_to_bf16<<<1, 1>>>((const float*)dev32, (__nv_bfloat16*)dev, 0);
          CK(cudaMemcpy(dst, dev32, bytes, cudaMemcpyDeviceToHost));
          CK(cudaHostUnregister(dst));
        } else {
          design_down(a, dst, T, 1 << 20);
        }
        tt = std::min(tt, now() - t0);
        std::free(dst);
        if (mode == 2) break;
      }
      char w[96];
      const char* m[] = {"malloc", "malloc+THP", "register+DMA f32"};
      std::snprintf(w, sizeof w, "download into fresh %s, %2d thr", m[mode], T);
      line(w, tt, mode == 2 ? bytes : bytes / 2);
      if (mode == 2) break;
    }
  }
  CK(cudaFree(dev));
  CK(cudaFree(dev32));
  CK(cudaFreeHost(pinned));
  return 0;
}
