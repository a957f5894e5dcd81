#!/usr/bin/env python3
"""Times PyTorch decode attention on the shapes of `tandem bench attention-decode`, beside tandem.

    tandem bench attention-decode --batch 64 --heads 32 --kv-heads 8 --context 8192 --json > c.json
    tandem bench attention-decode --batch 64 --heads 32 --kv-heads 8 --context 8192 --block-size 16 --json > p.json
    python3 benches/peers/torch_decode_peer.py --batch 64 --heads 32 --kv-heads 8 --context 8192 \
        --block-size 16 --tandem-json c.json --tandem-paged-json p.json

Every sequence is full (length --context, as tandem's bench fills it); the --new-tokens queries
are its last positions (bottom-right causal mask when more than one). Peers, each timed alone:
- `sdpa gqa`: F.scaled_dot_product_attention(q, k, v, enable_gqa=True) on the contiguous cache
  [B, Hkv, ctx, D] (the backend PyTorch picks);
- `sdpa expanded`: K and V repeated to Hq heads (repeat_interleave, inside the timed call), then
  SDPA: what code without enable_gqa does;
- `paged gather + sdpa`: the paged cache [num_blocks, Hkv, block_size, D] gathered through a
  shuffled block table into [B, Hkv, ctx, D] (inside the timed call), then SDPA with enable_gqa.
Figures: time, GB/s of the KV cache (2 * B * Hkv * ctx * D * 2 bytes, tandem's byte floor),
and the fraction of --peak-gbps when given. Timing: CUDA events around each call after warm-up,
inputs rotated among sets larger than the L2 cache, median. Ratios are PyTorch time / tandem
time (above 1: tandem is faster).
"""
import argparse
import json
import math
import statistics
import sys

import torch
import torch.nn.functional as F


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--new-tokens", type=int, default=1)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--sets", type=int)
    p.add_argument("--dtype", choices=["bf16", "f16"], default="bf16")
    p.add_argument("--peak-gbps", type=float, help="HBM bandwidth of the device, GB/s (H200: 4800)")
    p.add_argument("--tandem-json", help="`tandem bench attention-decode ... --json` (contiguous)")
    p.add_argument("--tandem-paged-json", help="the same with --block-size (paged)")
    return p.parse_args()


def bench(fn, sets, iters, warmup):
    for i in range(warmup):
        fn(*sets[i % len(sets)])
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for i, (s, e) in enumerate(ev):
        s.record()
        fn(*sets[(i + 1) % len(sets)])
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e-3 for s, e in ev)


def load(path):
    if not path:
        return None
    try:
        with open(path) as f:
            text = f.read().strip()
        try:
            return json.loads(text)  # `--json`: one pretty-printed object
        except json.JSONDecodeError:
            return json.loads(text.splitlines()[-1])
    except Exception as ex:  # report, never hide
        print(f"  tandem {path}: no result ({ex})")
        return None


def main():
    a = parse()
    dev = "cuda"
    dt = {"bf16": torch.bfloat16, "f16": torch.float16}[a.dtype]
    g = torch.Generator(device=dev).manual_seed(1)
    rnd = lambda *s: (torch.rand(*s, device=dev, generator=g) * 2 - 1).to(dt)
    b, h, hkv, ctx, nq, d, bs = a.batch, a.heads, a.kv_heads, a.context, a.new_tokens, a.head_dim, a.block_size
    kv_bytes = 2 * b * hkv * ctx * d * 2
    nsets = a.sets or max(1, min(8, math.ceil(256 * 2**20 / kv_bytes)))
    per = math.ceil(ctx / bs)
    mask = None
    if nq > 1:
        from torch.nn.attention.bias import causal_lower_right
        mask = causal_lower_right(nq, ctx)

    def sdpa(q, k, v):
        if mask is not None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    def expanded(q, k, v):
        r = h // hkv
        k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)
        if mask is not None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return F.scaled_dot_product_attention(q, k, v)

    def paged(q, kc, vc, table):
        def gather(c):  # [NB, Hkv, bs, D] -> [B, Hkv, per * bs, D] -> first ctx tokens
            x = c[table]  # [B, per, Hkv, bs, D]
            return x.permute(0, 2, 1, 3, 4).reshape(b, hkv, per * bs, d)[:, :, :ctx]
        return sdpa(q, gather(kc), gather(vc))

    name = torch.cuda.get_device_name()
    shape = f"B{b} Hq{h} Hkv{hkv} ctx{ctx} Nq{nq} D{d}"
    print(f"torch {torch.__version__} attention-decode {shape} {a.dtype} on {name}")
    flops = 4.0 * b * h * sum(ctx - nq + i + 1 for i in range(nq)) * d
    results = {}

    def report(label, sec):
        frac = f", {kv_bytes / sec / 1e9 / a.peak_gbps * 100:.0f}% of {a.peak_gbps:.0f} GB/s" if a.peak_gbps else ""
        print(f"  {label:<22}: median {sec*1e6:9.1f} us, {kv_bytes/sec/1e9:7.0f} GB/s, {flops/sec/1e12:6.2f} TFLOP/s{frac}")
        results[label] = sec

    sets = [(rnd(b, h, nq, d), rnd(b, hkv, ctx, d), rnd(b, hkv, ctx, d)) for _ in range(nsets)]
    report("sdpa gqa", bench(sdpa, sets, a.iters, a.warmup))
    report("sdpa expanded", bench(expanded, sets, a.iters, a.warmup))
    del sets
    psets = []
    for _ in range(nsets):
        table = torch.randperm(b * per, device=dev, generator=g).reshape(b, per)
        psets.append((rnd(b, h, nq, d), rnd(b * per, hkv, bs, d), rnd(b * per, hkv, bs, d), table))
    report(f"paged gather + sdpa bs{bs}", bench(paged, psets, a.iters, a.warmup))
    del psets
    for label, path in [("tandem contiguous", a.tandem_json), (f"tandem paged bs{bs}", a.tandem_paged_json)]:
        tj = load(path)
        if tj is None:
            continue
        if tj.get("storage", a.dtype) != a.dtype:
            print(f"  warning: tandem stored {tj['storage']}, torch ran {a.dtype}: not the same precision")
        report(label, tj["median_s"])
        print(f"    kernel {tj.get('kernel')}")
    best_torch = min(v for k, v in results.items() if not k.startswith("tandem"))
    for k, v in results.items():
        if k.startswith("tandem"):
            print(f"  ratio best torch / {k}: {best_torch / v:.2f}x")
    print("RESULT " + json.dumps({"op": "attention-decode", "shape": shape, "dtype": a.dtype, "device": name,
                                 "torch": torch.__version__, "kv_bytes": kv_bytes,
                                 "seconds": results, "peak_gbps": a.peak_gbps}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
