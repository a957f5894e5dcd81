"""Measured ceilings of the GPU in this call, for the floors in docs/PERF.md: device-to-device
copy bandwidth (a large tensor copied, read + write bytes) and dense bf16/f16 GEMM throughput
(torch.matmul, 8192^3). CUDA events, 5 warm-up runs, median of 30.

    python3 benches/peers/ceilings.py [--json]
"""
import json
import sys

import torch


def median_ms(fn, warm=5, reps=30):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def main():
    dev = torch.device("cuda")
    out = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__}
    n = 1 << 30  # 1 GiB of bytes each way
    src = torch.empty(n, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    out["copy_gbps"] = 2 * n / (ms * 1e-3) / 1e9
    for name, dt in [("bf16", torch.bfloat16), ("f16", torch.float16)]:
        m = 8192
        a = torch.randn(m, m, device=dev, dtype=dt)
        b = torch.randn(m, m, device=dev, dtype=dt)
        ms = median_ms(lambda: torch.matmul(a, b))
        out[f"gemm_{name}_tflops"] = 2 * m**3 / (ms * 1e-3) / 1e12
    if "--json" in sys.argv:
        print(json.dumps(out))
    else:
        print(f"CEILINGS {out['device']}: copy {out['copy_gbps']:.0f} GB/s, "
              f"bf16 GEMM {out['gemm_bf16_tflops']:.0f} TFLOP/s, f16 GEMM {out['gemm_f16_tflops']:.0f} TFLOP/s")


if __name__ == "__main__":
    main()
