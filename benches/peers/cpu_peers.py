#!/usr/bin/env python3
"""CPU peers for tandem's CPU backend (issue 19): NumPy (OpenBLAS) beside `tandem bench` and
`tandem run`, in one script, so both are measured under the same machine conditions.

Cases (each: NumPy median of --runs runs after warm-up; tandem's own bench median, which
`tandem bench` takes over --iters launches):
  linear     M = N = K = 2048 f32: NumPy `x @ w.T` (sgemm) and `gelu_tanh(x @ w.T + b)` beside
             `tandem bench linear --backend cpu --m 2048 --n 2048 --k 2048 --act gelu`;
             GFLOP/s counted as 2 M N K.
  attention  B1 H8 N2048 D64 f32, not causal: NumPy S = QK^T * scale, softmax (max-shifted,
             with the row's log-sum-exp), O = P V, per head, beside
             `tandem bench attention --backend cpu --batch 1 --heads 8 --seq-len 2048
             --head-dim 64`; GFLOP/s counted as 4 B H N^2 D.
  experts    the default layer's shape, T128 H512 F1024 E8 top-2: NumPy gathers each
             expert's tokens, gate/up GEMM, silu(gate) * up, down GEMM, weighted sum per token,
             beside `tandem bench moe-experts --backend cpu --tokens 128 --hidden 512 --ffn
             1024 --experts 8 --top-k 2`; GFLOP/s counted as 6 T k H F.
  layer      `tandem run --backend cpu` (the built-in Mixtral layer): "wall_s" of its JSON.

The whole set is repeated --repeat times, interleaved, and medians of the repeats printed.
The tandem binaries: --tandem (default target/release/tandem); --env adds KEY=VALUE settings
to tandem's environment (e.g. TANDEM_CPU_BLAS=off), --base names a second binary (an older
build) whose figures are printed beside.

Usage: python3 benches/peers/cpu_peers.py [--repeat 3] [--runs 20] [--cases linear,attention,experts,layer]
"""
import argparse
import json
import os
import statistics
import subprocess
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


# ---------------------------------------------------------------- NumPy implementations


def numpy_linear(runs, m=2048, n=2048, k=2048):
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    w = rng.uniform(-1, 1, (n, k)).astype(np.float32)
    b = rng.uniform(-1, 1, (n,)).astype(np.float32)
    flop = 2.0 * m * n * k
    return {
        "numpy sgemm x @ w.T": (median_s(lambda: x @ w.T, runs), flop),
        "numpy gelu(x @ w.T + b)": (median_s(lambda: gelu_tanh(x @ w.T + b), runs), flop),
    }


def attention_np(q, k, v, scale):
    """O and LSE of softmax(scale Q K^T) V, one head at a time (S of one head is N x N)."""
    b, h, n, d = q.shape
    o = np.empty_like(q)
    lse = np.empty((b, h, n), np.float32)
    for i in range(b):
        for j in range(h):
            s = (q[i, j] @ k[i, j].T) * scale
            m = s.max(axis=1, keepdims=True)
            p = np.exp(s - m)
            l = p.sum(axis=1, keepdims=True)
            o[i, j] = (p @ v[i, j]) / l
            lse[i, j] = (m + np.log(l))[:, 0]
    return o, lse


def numpy_attention(runs, b=1, h=8, n=2048, d=64):
    rng = np.random.default_rng(1)
    q, k, v = (rng.uniform(-1, 1, (b, h, n, d)).astype(np.float32) for _ in range(3))
    scale = np.float32(1.0 / np.sqrt(d))
    flop = 4.0 * b * h * n * n * d
    return {"numpy attention (per head: QK^T, softmax, PV)": (median_s(lambda: attention_np(q, k, v, scale), runs), flop)}


def silu(z):
    return z / (np.float32(1.0) + np.exp(-z))


def experts_np(x, ids, wts, gate_up, down):
    t, h = x.shape
    e_count, f2, _ = gate_up.shape
    f = f2 // 2
    y = np.zeros((t, h), np.float32)
    for e in range(e_count):
        tok, slot = np.nonzero(ids == e)
        if tok.size == 0:
            continue
        gu = x[tok] @ gate_up[e].T
        act = silu(gu[:, :f]) * gu[:, f:]
        out = act @ down[e].T
        y[tok] += wts[tok, slot, None] * out
    return y


def numpy_experts(runs, t=128, h=512, f=1024, e=8, k=2):
    rng = np.random.default_rng(2)
    x = rng.uniform(-1, 1, (t, h)).astype(np.float32)
    ids = np.stack([rng.permutation(e)[:k] for _ in range(t)])
    wts = rng.uniform(0, 1, (t, k)).astype(np.float32)
    wts /= wts.sum(axis=1, keepdims=True)
    gate_up = rng.uniform(-0.1, 0.1, (e, 2 * f, h)).astype(np.float32)
    down = rng.uniform(-0.1, 0.1, (e, h, f)).astype(np.float32)
    flop = 6.0 * t * k * h * f
    return {"numpy experts (gather, 2 GEMMs per expert, combine)": (median_s(lambda: experts_np(x, ids, wts, gate_up, down), runs), flop)}


# ---------------------------------------------------------------- tandem


BENCH = {
    "linear": (["bench", "linear", "--backend", "cpu", "--m", "2048", "--n", "2048", "--k", "2048", "--act", "gelu"], 2.0 * 2048**3),
    "attention": (["bench", "attention", "--backend", "cpu", "--batch", "1", "--heads", "8", "--seq-len", "2048", "--head-dim", "64"], 4.0 * 8 * 2048 * 2048 * 64),
    "experts": (["bench", "moe-experts", "--backend", "cpu", "--tokens", "128", "--hidden", "512", "--ffn", "1024", "--experts", "8", "--top-k", "2"], 6.0 * 128 * 2 * 512 * 1024),
}


def tandem_bench(binary, env, case, iters):
    args, flop = BENCH[case]
    out = subprocess.run([binary, *args, "--iters", str(iters), "--json"], env=env, check=True, capture_output=True, text=True)
    rep = json.loads(out.stdout)
    return rep["median_s"], flop


def tandem_layer(binary, env, runs):
    walls = []
    for _ in range(runs):
        out = subprocess.run([binary, "run", "--backend", "cpu", "--json", "--no-check"], env=env, check=True, capture_output=True, text=True)
        walls.append(json.loads(out.stdout)["wall_s"])
    return statistics.median(walls)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=20, help="NumPy runs per figure (and tandem bench --iters)")
    p.add_argument("--repeat", type=int, default=3, help="repeats of the whole set; medians printed")
    p.add_argument("--cases", default="linear,attention,experts,layer")
    p.add_argument("--tandem", default="target/release/tandem")
    p.add_argument("--base", default=None, help="a second tandem binary (an older build) timed beside")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE for tandem's environment")
    a = p.parse_args()
    cases = a.cases.split(",")
    env = dict(os.environ)
    for kv in a.env:
        key, _, value = kv.partition("=")
        env[key] = value
    binaries = [("tandem", a.tandem)] + ([("base", a.base)] if a.base else [])
    cfg = np.show_config(mode="dicts") if hasattr(np, "show_config") else None
    blas = cfg.get("Build Dependencies", {}).get("blas", {}) if isinstance(cfg, dict) else {}
    print(f"numpy {np.__version__} (BLAS: {blas.get('name', '?')} {blas.get('version', '')}), "
          f"{os.cpu_count()} CPUs, repeat {a.repeat}, runs {a.runs}, tandem env {a.env or 'as inherited'}")
    figures = {}  # name -> list of (seconds, flop)
    for rep in range(a.repeat):
        for case in cases:
            if case == "layer":
                for label, binary in binaries:
                    figures.setdefault(f"{label} run --backend cpu (layer wall)", []).append((tandem_layer(binary, env, a.runs), None))
                continue
            for label, binary in binaries:
                figures.setdefault(f"{label} {case}", []).append(tandem_bench(binary, env, case, a.runs))
            peer = {"linear": numpy_linear, "attention": numpy_attention, "experts": numpy_experts}[case](a.runs)
            for name, fig in peer.items():
                figures.setdefault(name, []).append(fig)
        print(f"  repeat {rep + 1}/{a.repeat} done", flush=True)
    print(f"{'figure':58s} {'median ms':>10s} {'GFLOP/s':>9s}   repeats (ms)")
    for name, figs in figures.items():
        s = statistics.median(f[0] for f in figs)
        flop = figs[0][1]
        rate = f"{flop / s / 1e9:9.1f}" if flop else f"{'':9s}"
        reps = ", ".join(f"{f[0] * 1e3:.1f}" for f in figs)
        print(f"{name:58s} {s * 1e3:10.2f} {rate}   {reps}")


if __name__ == "__main__":
    main()
