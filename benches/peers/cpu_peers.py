#!/usr/bin/env python3
"""CPU peer for `tandem bench linear --backend cpu` (issue 19): NumPy (OpenBLAS sgemm).

Times, for M = N = K = 2048 f32 (or --m/--n/--k), the median of --runs runs after warm-up of
  sgemm      x @ w.T
  linear     gelu_tanh(x @ w.T + b)   (bias and GELU as NumPy array passes)
and prints GFLOP/s counted as 2 M N K (the same count tandem's bench uses).
Usage: python3 benches/peers/cpu_peers.py [--m 2048 --n 2048 --k 2048 --runs 20]
"""
import argparse
import statistics
import time

import numpy as np


def gelu_tanh(z):
    c = np.float32(np.sqrt(2.0 / np.pi))
    return np.float32(0.5) * z * (np.float32(1.0) + np.tanh(c * (z + np.float32(0.044715) * z * z * z)))


def median_s(f, runs, warmup=3):
    for _ in range(warmup):
        f()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--m", type=int, default=2048)
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--runs", type=int, default=20)
    a = p.parse_args()
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (a.m, a.k)).astype(np.float32)
    w = rng.uniform(-1, 1, (a.n, a.k)).astype(np.float32)
    b = rng.uniform(-1, 1, (a.n,)).astype(np.float32)
    flop = 2.0 * a.m * a.n * a.k
    cfg = np.show_config(mode="dicts") if hasattr(np, "show_config") else None
    blas = cfg.get("Build Dependencies", {}).get("blas", {}).get("name", "?") if isinstance(cfg, dict) else "?"
    print(f"numpy {np.__version__} (BLAS: {blas}), M{a.m} N{a.n} K{a.k} f32, median of {a.runs}")
    for name, f in [
        ("sgemm  x @ w.T", lambda: x @ w.T),
        ("linear gelu(x @ w.T + b)", lambda: gelu_tanh(x @ w.T + b)),
    ]:
        s = median_s(f, a.runs)
        print(f"  {name:28s} {s * 1e3:9.3f} ms  {flop / s / 1e9:8.1f} GFLOP/s")


if __name__ == "__main__":
    main()
