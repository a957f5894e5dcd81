#!/usr/bin/env python3
"""Times PyTorch on the same shapes as `tandem bench`, and prints both side by side.

    tandem bench attention --batch 4 --heads 32 --seq-len 4096 --causal --json > t.json
    python3 benches/peers/torch_peers.py attention --batch 4 --heads 32 --seq-len 4096 --causal --tandem-json t.json

`--dtype bf16|f16` (default bf16) is the precision of every tensor PyTorch gets; give it the
same value as tandem's `--cuda-dtype` so both run the same precision (the tandem JSON's
"storage" is checked against it).

Peers: attention = F.scaled_dot_product_attention (the backend PyTorch picks, bottom-right
causal mask); linear = F.linear + GELU(tanh) (or relu/silu); moe-route = softmax, topk,
renormalise, bincount, stable argsort, block-padded offsets, aux and z losses; moe-experts =
gather x by the expert-sorted slots, grouped GEMM gate/up (F.grouped_mm / torch._grouped_mm, the
CUTLASS grouped kernel on sm_90; a loop of F.linear over the experts where it is missing), SiLU *
up, grouped GEMM down, scale by the routing weights and un-permute, sum of each token's k rows
(routing made before the timed region, as tandem's op takes it as input); moe-block = the whole
block: F.linear router logits, softmax/topk/renormalise in f32, the routing permutation
(stable argsort, counts by index_add_: no host sync), then moe-experts' computation, timed
eagerly and, where torch.cuda.graphs can capture it, as a replayed graph (x copied into the
static input first, as tandem's replay does), with PyTorch's CUDA launches per block counted
by torch.profiler (`--tandem-json` from `tandem bench moe-block --json`); rmsnorm =
F.rms_norm; rope = x*cos + rotate_half(x)*sin with cos/sin precomputed; moe-experts --fp8 =
the same with e4m3 weights (quantized per output channel before the timed region) and
activations (per row, each call), torch._scaled_grouped_mm or a loop of torch._scaled_mm. Timing: CUDA events
around each call after warm-up, inputs rotated among several sets, median. The ratio printed is
PyTorch time / tandem time (above 1: tandem is faster).
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("op", choices=["attention", "moe-route", "moe-experts", "moe-block", "linear", "rmsnorm", "rope"])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int)
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--kv-len", type=int)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--tokens", type=int)
    p.add_argument("--experts", type=int)
    p.add_argument("--top-k", type=int)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--ffn", type=int, default=14336)
    p.add_argument("--m", type=int, default=8192)
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--k", type=int, default=8192)
    p.add_argument("--act", default="gelu")
    p.add_argument("--no-bias", action="store_true")
    p.add_argument("--rows", type=int, default=16384)
    p.add_argument("--cols", type=int, default=8192)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--warmup-ms", type=float, default=0.0,
                   help="then untimed runs for this long (a GPU at its power cap settles after ~100 ms: 2000 times its steady state)")
    p.add_argument("--sets", type=int)
    p.add_argument("--dtype", choices=["bf16", "f16"], default="bf16",
                   help="precision of the inputs and outputs (tandem's --cuda-dtype)")
    p.add_argument("--tandem-json", help="output of `tandem bench ... --json` to compare with")
    p.add_argument("--fp8", action="store_true",
                   help="moe-experts: the FP8 peer (e4m3 weights and activations, rowwise scales), "
                        "for tandem run with TANDEM_MOE_FP8=1")
    return p.parse_args()


def grouped_mm_fn():
    """(function, name): F.grouped_mm (public in recent torch) or torch._grouped_mm, else (None, None)."""
    if hasattr(F, "grouped_mm"):
        return F.grouped_mm, "F.grouped_mm"
    if hasattr(torch, "_grouped_mm"):
        return torch._grouped_mm, "torch._grouped_mm"
    return None, None


def moe_experts_peer(a, dev, bf, rnd, g):
    t, h, f, e, k = a.tokens, a.hidden, a.ffn, a.experts, a.top_k
    in_bytes = 2 * (t * h + e * 3 * h * f)

    def make_set():
        x = rnd(t, h)
        logits = torch.rand(t, e, device=dev, generator=g) * 6 - 3
        w, ids = torch.topk(torch.softmax(logits, -1), k, dim=-1)
        w = (w / w.sum(-1, keepdim=True)).to(bf)
        flat = ids.flatten()
        order = torch.argsort(flat, stable=True)          # slots sorted by expert
        counts = torch.bincount(flat, minlength=e)
        offs = torch.cumsum(counts, 0).to(torch.int32)    # group ends
        tok = (order // k).contiguous()                   # token of each sorted slot
        wsorted = w.flatten()[order].contiguous()
        gate_up = rnd(e, 2 * f, h, scale=1 / math.sqrt(h))
        down = rnd(e, h, f, scale=1 / math.sqrt(f))
        return (x, tok, order, wsorted, offs, counts.tolist(), gate_up, down)

    sets = [make_set() for _ in range(n_sets(a, in_bytes))]
    gmm, gmm_name = grouped_mm_fn()

    def unpermute(o, order, wsorted):
        slots = torch.empty(t * k, h, dtype=bf, device=dev)
        slots[order] = o * wsorted[:, None]
        return slots.view(t, k, h).sum(1)

    def fn_grouped(x, tok, order, wsorted, offs, counts, gate_up, down):
        xs = x.index_select(0, tok)
        gu = gmm(xs, gate_up.transpose(-2, -1), offs=offs)
        act = F.silu(gu[:, :f]) * gu[:, f:]
        o = gmm(act, down.transpose(-2, -1), offs=offs)
        return unpermute(o, order, wsorted)

    def fn_loop(x, tok, order, wsorted, offs, counts, gate_up, down):
        xs = x.index_select(0, tok)
        o = torch.empty(t * k, h, dtype=bf, device=dev)
        s = 0
        for i, c in enumerate(counts):
            if c:
                gu = F.linear(xs[s:s + c], gate_up[i])
                o[s:s + c] = F.linear(F.silu(gu[:, :f]) * gu[:, f:], down[i])
            s += c
        return unpermute(o, order, wsorted)

    fn, what = fn_loop, "loop over experts: F.linear, silu, F.linear"
    if gmm is not None:
        try:
            yg = fn_grouped(*sets[0])
            yl = fn_loop(*sets[0])
            err = ((yg.float() - yl.float()).norm() / yl.float().norm()).item()
            print(f"  peer check: grouped_mm vs loop rel err {err:.2e}")
            if err < 2e-2:
                fn, what = fn_grouped, f"{gmm_name} (grouped GEMM), silu, un-permute"
        except Exception as ex:  # report, then use the loop
            print(f"  grouped_mm unavailable here ({type(ex).__name__}: {ex}); using the loop")
    flops = 2.0 * t * k * 3 * h * f
    nbytes = 2.0 * e * 3 * h * f  # expert weights, as tandem counts for this op
    shape = f"T{t} H{h} F{f} E{e} k{k}"
    return fn, sets, flops, nbytes, shape, what


def e4m3_rows(v):
    """(e4m3 rows, f32 scale per row): scale = amax / 448, as tandem's FP8 experts quantize."""
    vf = v.float()
    amax = vf.abs().amax(dim=-1, keepdim=True)
    inv = torch.where(amax > 0, 448.0 / amax, torch.zeros_like(amax))
    return (vf * inv).clamp(-448, 448).to(torch.float8_e4m3fn), (amax / 448.0).squeeze(-1).contiguous()


def moe_experts_fp8_peer(a, dev, bf, rnd, g):
    """The FP8 counterpart of moe_experts_peer: expert weights quantized to e4m3 per output
    channel before the timed region (tandem keeps them quantized beside the weights), then per
    call the gathered x and the SwiGLU output quantized per row and the GEMMs run by
    torch._scaled_grouped_mm (a loop of torch._scaled_mm over the experts where it is missing or
    disagrees), outputs in the storage precision."""
    t, h, f, e, k = a.tokens, a.hidden, a.ffn, a.experts, a.top_k
    _, sets_bf, flops, _, shape, _ = moe_experts_peer(a, dev, bf, rnd, g)
    quant, quant_name = e4m3_rows, "eager"
    try:  # Inductor fuses the row quantization into one kernel (what a tuned PyTorch user runs)
        compiled = torch.compile(e4m3_rows, dynamic=False)
        compiled(sets_bf[0][0][:8])
        quant, quant_name = compiled, "torch.compile"
    except Exception as ex:  # report, then quantize eagerly
        print(f"  torch.compile unavailable here ({type(ex).__name__}: {ex}); quantizing eagerly")
    sets = []
    for (x, tok, order, wsorted, offs, counts, gate_up, down) in sets_bf:
        gq, gs = e4m3_rows(gate_up)   # [E, 2F, H], [E, 2F]
        dq, ds = e4m3_rows(down)      # [E, H, F], [E, H]
        sets.append((x, tok, order, wsorted, offs, counts, gq, gs, dq, ds))
    del sets_bf

    def unpermute(o, order, wsorted):
        slots = torch.empty(t * k, h, dtype=bf, device=dev)
        slots[order] = o * wsorted[:, None]
        return slots.view(t, k, h).sum(1)

    def fn_grouped(x, tok, order, wsorted, offs, counts, gq, gs, dq, ds):
        xq, xs = quant(x.index_select(0, tok))
        gu = torch._scaled_grouped_mm(xq, gq.transpose(-2, -1), xs, gs, offs=offs, out_dtype=bf)
        aq, as_ = quant(F.silu(gu[:, :f]) * gu[:, f:])
        o = torch._scaled_grouped_mm(aq, dq.transpose(-2, -1), as_, ds, offs=offs, out_dtype=bf)
        return unpermute(o, order, wsorted)

    def pad16(v):  # cuBLASLt's rowwise-scaled FP8 GEMM wants rows in multiples of 16
        r = (-v.shape[0]) % 16
        return torch.cat([v, v.new_zeros((r,) + tuple(v.shape[1:]))]) if r else v

    def fn_loop(x, tok, order, wsorted, offs, counts, gq, gs, dq, ds):
        xq, xs = e4m3_rows(x.index_select(0, tok))
        o = torch.empty(t * k, h, dtype=bf, device=dev)
        s = 0
        for i, c in enumerate(counts):
            if c:
                gu = torch._scaled_mm(pad16(xq[s:s + c]), gq[i].t(), scale_a=pad16(xs[s:s + c, None]),
                                      scale_b=gs[i][None, :], out_dtype=bf)[:c]
                aq, as_ = e4m3_rows(F.silu(gu[:, :f]) * gu[:, f:])
                o[s:s + c] = torch._scaled_mm(pad16(aq), dq[i].t(), scale_a=pad16(as_[:, None]),
                                              scale_b=ds[i][None, :], out_dtype=bf)[:c]
            s += c
        return unpermute(o, order, wsorted)

    fn, what = fn_loop, "FP8: loop over experts of torch._scaled_mm (rowwise scales)"
    try:
        yl = fn_loop(*sets[0])
    except Exception as ex:  # report: no FP8 loop here
        print(f"  torch._scaled_mm loop failed ({type(ex).__name__}: {ex})")
        yl = None
    if hasattr(torch, "_scaled_grouped_mm"):
        try:
            yg = fn_grouped(*sets[0])
            ok = True
            if yl is not None:
                err = ((yg.float() - yl.float()).norm() / yl.float().norm()).item()
                print(f"  peer check: _scaled_grouped_mm vs _scaled_mm loop rel err {err:.2e}")
                ok = err < 2e-2
            if ok:
                fn, what = fn_grouped, f"FP8: torch._scaled_grouped_mm (rowwise scales), silu, un-permute; rows quantized by {quant_name}"
                x, tok, order, wsorted, offs, counts, gq, gs, dq, ds = sets[0]
                xq, xs = quant(x.index_select(0, tok))
                aq, as_ = quant(torch.randn(t * k, f, device=dev).to(bf))

                def gemms_only():
                    torch._scaled_grouped_mm(xq, gq.transpose(-2, -1), xs, gs, offs=offs, out_dtype=bf)
                    torch._scaled_grouped_mm(aq, dq.transpose(-2, -1), as_, ds, offs=offs, out_dtype=bf)
                gm = bench(gemms_only, [()], 20, 3, a.warmup_ms / 1e3)
                print(f"  torch FP8 grouped GEMMs alone (inputs quantized already): {gm*1e3:.3f} ms")
        except Exception as ex:  # report, then use the loop
            print(f"  _scaled_grouped_mm unavailable here ({type(ex).__name__}: {ex}); using the loop")
    nbytes = 1.0 * e * 3 * h * f  # e4m3 expert weights
    return fn, sets, flops, nbytes, shape + " fp8", what


def cuda_launches(fn, args):
    """(kernels, memcpys, memsets) PyTorch puts on the GPU for one call of fn, by torch.profiler."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    kernels = memcpys = memsets = 0
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = ev.name.lower()
        if name.startswith("memcpy"):
            memcpys += 1
        elif name.startswith("memset"):
            memsets += 1
        else:
            kernels += 1
    return kernels, memcpys, memsets


def moe_block_peer(a, dev, bf, rnd, g):
    """The whole MoE block: returns (eager fn, graph fn or None, why no graph, sets, what)."""
    t, h, f, e, k = a.tokens, a.hidden, a.ffn, a.experts, a.top_k
    wr = rnd(e, h, scale=1 / math.sqrt(h))
    gate_up = rnd(e, 2 * f, h, scale=1 / math.sqrt(h))
    down = rnd(e, h, f, scale=1 / math.sqrt(f))
    sets = [(rnd(t, h),) for _ in range(2)]
    gmm, gmm_name = grouped_mm_fn()
    ones = torch.ones(t * k, dtype=torch.int32, device=dev)

    def route(x):
        logits = F.linear(x, wr)
        w, ids = torch.topk(torch.softmax(logits.float(), -1), k, dim=-1)
        w = (w / w.sum(-1, keepdim=True)).to(bf)
        flat = ids.flatten()
        order = torch.argsort(flat, stable=True)
        counts = torch.zeros(e, dtype=torch.int32, device=dev).index_add_(0, flat, ones)
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        return flat, order, counts, offs, (order // k), w.flatten()[order]

    def unpermute(o, order, wsorted):
        slots = torch.empty(t * k, h, dtype=bf, device=dev)
        slots[order] = o * wsorted[:, None]
        return slots.view(t, k, h).sum(1)

    def fn_grouped(x):
        flat, order, counts, offs, tok, wsorted = route(x)
        xs = x.index_select(0, tok)
        gu = gmm(xs, gate_up.transpose(-2, -1), offs=offs)
        act = F.silu(gu[:, :f]) * gu[:, f:]
        o = gmm(act, down.transpose(-2, -1), offs=offs)
        return unpermute(o, order, wsorted)

    def fn_loop(x):
        flat, order, counts, offs, tok, wsorted = route(x)
        xs = x.index_select(0, tok)
        o = torch.empty(t * k, h, dtype=bf, device=dev)
        s = 0
        for i, c in enumerate(counts.tolist()):  # a host sync, as any loop over experts needs
            if c:
                gu = F.linear(xs[s:s + c], gate_up[i])
                o[s:s + c] = F.linear(F.silu(gu[:, :f]) * gu[:, f:], down[i])
            s += c
        return unpermute(o, order, wsorted)

    fn, what = fn_loop, "F.linear router, softmax/topk, loop over experts (F.linear, silu, F.linear)"
    if gmm is not None:
        try:
            yg, yl = fn_grouped(*sets[0]), fn_loop(*sets[0])
            err = ((yg.float() - yl.float()).norm() / yl.float().norm()).item()
            print(f"  peer check: grouped_mm vs loop rel err {err:.2e}")
            if err < 2e-2:
                fn, what = fn_grouped, f"F.linear router, softmax/topk, {gmm_name} (grouped GEMM), silu, un-permute"
        except Exception as ex:  # report, then use the loop
            print(f"  grouped_mm unavailable here ({type(ex).__name__}: {ex}); using the loop")
    graph_fn, why = None, None
    try:
        static_x = sets[0][0].clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn(static_x)
        torch.cuda.current_stream().wait_stream(side)
        cg = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cg):
            static_out = fn(static_x)

        def graph_fn(x):
            static_x.copy_(x)
            cg.replay()
            return static_out

        ye, yr = fn(*sets[1]), graph_fn(*sets[1])
        if not torch.equal(ye, yr):
            print("  warning: the PyTorch graph's output differs from its eager output")
    except Exception as ex:  # a host sync in the path (the loop), or capture unsupported
        graph_fn, why = None, f"{type(ex).__name__}: {str(ex).splitlines()[0] if str(ex) else ''}"
        torch.cuda.synchronize()
    return fn, graph_fn, why, sets, what


def bench(fn, sets, iters, warmup, warmup_s=0.0):
    """Median seconds of `iters` timed runs, after `warmup` untimed ones and then more for
    `warmup_s` seconds (--warmup-ms)."""
    for i in range(warmup):
        fn(*sets[i % len(sets)])
    torch.cuda.synchronize()
    t0, i = time.perf_counter(), 0
    while time.perf_counter() - t0 < warmup_s:
        fn(*sets[i % len(sets)])
        torch.cuda.synchronize()
        i += 1
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for i, (a, b) in enumerate(ev):
        a.record()
        fn(*sets[(i + 1) % len(sets)])
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) * 1e-3 for a, b in ev)


def n_sets(args, in_bytes):
    if args.sets:
        return args.sets
    return max(1, min(8, math.ceil(256 * 2**20 / max(in_bytes, 1))))


def main():
    a = parse()
    dev = "cuda"
    dt = {"bf16": torch.bfloat16, "f16": torch.float16}[a.dtype]
    g = torch.Generator(device=dev).manual_seed(1)
    rnd = lambda *s, scale=1.0: ((torch.rand(*s, device=dev, generator=g) * 2 - 1) * scale).to(dt)
    if a.op == "attention":
        hkv = a.kv_heads or a.heads
        nkv = a.kv_len or a.seq_len
        b, h, nq, d = a.batch, a.heads, a.seq_len, a.head_dim
        in_bytes = 2 * (b * h * nq * d + 2 * b * hkv * nkv * d)
        sets = [(rnd(b, h, nq, d), rnd(b, hkv, nkv, d), rnd(b, hkv, nkv, d)) for _ in range(n_sets(a, in_bytes))]
        mask = None
        if a.causal and nq != nkv:
            from torch.nn.attention.bias import causal_lower_right
            mask = causal_lower_right(nq, nkv)
        gqa = hkv != h

        def fn(q, k, v):
            if mask is not None:
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
            return F.scaled_dot_product_attention(q, k, v, is_causal=a.causal, enable_gqa=gqa)

        pairs = sum(min(nkv, max(0, i + nkv - nq + 1)) for i in range(nq)) if a.causal else nq * nkv
        flops = 4.0 * b * h * pairs * d
        nbytes = in_bytes + 2 * b * h * nq * d + 4 * b * h * nq
        shape = f"B{b} Hq{h} Hkv{hkv} Nq{nq} Nkv{nkv} D{d}{' causal' if a.causal else ''}"
        what = "F.scaled_dot_product_attention"
    elif a.op == "linear":
        m, n, k = a.m, a.n, a.k
        in_bytes = 2 * (m * k + n * k + n)
        sets = [(rnd(m, k), rnd(n, k, scale=1 / math.sqrt(k)), None if a.no_bias else rnd(n, scale=1.0)) for _ in range(n_sets(a, in_bytes))]
        act = {"gelu": lambda y: F.gelu(y, approximate="tanh"), "relu": F.relu, "silu": F.silu, "none": lambda y: y}[a.act]
        fn = lambda x, w, bias: act(F.linear(x, w, bias))
        flops = 2.0 * m * n * k
        nbytes = in_bytes + 2 * m * n
        shape = f"M{m} N{n} K{k} {a.act}{'' if a.no_bias else '+bias'}"
        what = f"F.linear + {a.act}"
    elif a.op == "moe-experts":
        a.tokens = a.tokens or 4096
        a.experts = a.experts or 8
        a.top_k = a.top_k or 2
        peer = moe_experts_fp8_peer if a.fp8 else moe_experts_peer
        fn, sets, flops, nbytes, shape, what = peer(a, dev, dt, rnd, g)
    elif a.op == "moe-block":
        return moe_block_main(a, dev, dt, rnd, g)
    elif a.op == "moe-route":
        t, e, k = a.tokens or 16384, a.experts or 64, a.top_k or 8
        bs = 16
        in_bytes = 2 * t * e
        sets = [(rnd(t, e, scale=3.0),) for _ in range(n_sets(a, in_bytes))]

        def fn(logits):
            lf = logits.float()
            probs = torch.softmax(lf, dim=-1)
            w, ids = torch.topk(probs, k, dim=-1)
            w = w / w.sum(dim=-1, keepdim=True)
            flat = ids.flatten()
            counts = torch.bincount(flat, minlength=e)
            order = torch.argsort(flat, stable=True)
            padded = (counts + bs - 1) // bs * bs
            offsets = torch.cumsum(padded, 0)
            aux = e * torch.sum(counts.float() / t * probs.mean(0))
            z = torch.logsumexp(lf, dim=-1).square().mean()
            return ids, w, counts, order, offsets, aux, z

        flops = 8.0 * t * e
        nbytes = in_bytes + t * k * 8 + e * 4 * 2 + 4 * (t * k + e * (bs - 1))
        shape = f"T{t} E{e} k{k}"
        what = "softmax/topk/bincount/argsort routing"
    elif a.op == "rmsnorm":
        r, c = a.rows, a.cols
        in_bytes = 2 * (r * c + c)
        sets = [(rnd(r, c), rnd(c)) for _ in range(n_sets(a, in_bytes))]
        fn = lambda x, w: F.rms_norm(x, (c,), w, 1e-5)
        flops = 4.0 * r * c
        nbytes = in_bytes + 2 * r * c
        shape = f"{r}x{c}"
        what = "F.rms_norm"
    else:  # rope
        b, h, t, d = a.batch, a.heads, a.seq_len, a.head_dim
        in_bytes = 2 * b * h * t * d
        inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, device=dev, dtype=torch.float64) / d))
        ang = torch.arange(t, device=dev, dtype=torch.float64)[:, None] * inv[None, :]
        emb = torch.cat([ang, ang], dim=-1)
        cos, sin = emb.cos().to(dt), emb.sin().to(dt)
        sets = [(rnd(b, h, t, d),) for _ in range(n_sets(a, in_bytes))]

        def fn(x):
            x1, x2 = x[..., : d // 2], x[..., d // 2 :]
            return x * cos + torch.cat((-x2, x1), dim=-1) * sin

        flops = 4.0 * b * h * t * d
        nbytes = 2 * in_bytes
        shape = f"B{b} H{h} T{t} D{d}"
        what = "x*cos + rotate_half(x)*sin"
    med = bench(fn, sets, a.iters, a.warmup, a.warmup_ms / 1e3)
    name = torch.cuda.get_device_name()
    print(f"torch {torch.__version__} {a.op} {shape} {a.dtype} on {name} ({what})")
    print(f"  torch : median {med*1e3:.3f} ms, {flops/med/1e12:.1f} TFLOP/s, {nbytes/med/1e9:.1f} GB/s")
    if a.tandem_json:
        try:
            with open(a.tandem_json) as f:
                text = f.read().strip()
            try:
                tj = json.loads(text)  # `tandem bench --json` prints one (pretty) document
            except ValueError:
                tj = json.loads(text.splitlines()[-1])  # or a JSON line last
        except Exception as ex:  # report, never hide
            print(f"  tandem: no result ({ex})")
            return 1
        if tj.get("storage", a.dtype) != a.dtype:
            print(f"  warning: tandem stored {tj['storage']}, torch ran {a.dtype}: not the same precision")
        tm = tj["median_s"]
        print(f"  tandem: median {tm*1e3:.3f} ms, {tj['tflops']:.1f} TFLOP/s, {tj['gbps']:.1f} GB/s ({tj['kernel']})")
        print(f"  ratio torch/tandem time: {med/tm:.2f}x")
        print("RESULT " + json.dumps({"op": a.op, "shape": shape, "dtype": a.dtype, "device": name,
                                     "torch": torch.__version__, "tandem_storage": tj.get("storage"),
                                     "torch_ms": med * 1e3, "tandem_ms": tm * 1e3, "ratio": med / tm,
                                     "tandem_tflops": tj["tflops"], "torch_tflops": flops / med / 1e12,
                                     "tandem_gbps": tj["gbps"], "torch_gbps": nbytes / med / 1e9}))
    return 0


def moe_block_main(a, dev, dt, rnd, g):
    a.tokens, a.experts, a.top_k = a.tokens or 4096, a.experts or 8, a.top_k or 2
    t, h, f, e, k = a.tokens, a.hidden, a.ffn, a.experts, a.top_k
    fn, graph_fn, why, sets, what = moe_block_peer(a, dev, dt, rnd, g)
    flops = 2.0 * t * h * e + 2.0 * t * k * 3.0 * h * f
    shape = f"T{t} H{h} F{f} E{e} k{k}"
    name = torch.cuda.get_device_name()
    eager = bench(fn, sets, a.iters, a.warmup, a.warmup_ms / 1e3)
    kern, cpy, mset = cuda_launches(fn, sets[0])
    print(f"torch {torch.__version__} moe-block {shape} {a.dtype} on {name} ({what})")
    print(f"  torch eager: median {eager*1e6:.1f} us, {flops/eager/1e12:.1f} TFLOP/s, "
          f"{kern} kernels + {cpy} memcpys + {mset} memsets per block (torch.profiler)")
    graph = None
    if graph_fn is not None:
        graph = bench(graph_fn, sets, a.iters, a.warmup, a.warmup_ms / 1e3)
        print(f"  torch graph: median {graph*1e6:.1f} us (x copied in; one cudaGraphLaunch)")
    else:
        print(f"  torch graph: not captured ({why})")
    result = {"op": "moe-block", "shape": shape, "dtype": a.dtype, "device": name, "torch": torch.__version__,
              "torch_eager_us": eager * 1e6, "torch_graph_us": graph * 1e6 if graph else None,
              "torch_kernels": kern, "torch_memcpys": cpy, "torch_memsets": mset, "torch_graph_refused": why}
    if a.tandem_json:
        try:
            with open(a.tandem_json) as fh:
                text = fh.read().strip()
            try:
                tj = json.loads(text)
            except ValueError:
                tj = json.loads(text.splitlines()[-1])
        except Exception as ex:  # report, never hide
            print(f"  tandem: no result ({ex})")
            return 1
        if tj.get("storage", a.dtype) != a.dtype:
            print(f"  warning: tandem stored {tj['storage']}, torch ran {a.dtype}: not the same precision")
        te = tj["eager"]
        tg = tj.get("graph")
        nodes = tj.get("graph_nodes") or {}
        print(f"  tandem eager: median {te['median_s']*1e6:.1f} us, {te['launches']} launches per block "
              f"(experts path {tj['experts_path']})")
        if tg:
            print(f"  tandem graph: median {tg['median_s']*1e6:.1f} us, {nodes.get('kernels')} kernel + "
                  f"{nodes.get('memsets')} memset nodes, bit-exact with eager: {tj.get('bit_exact')}")
        else:
            print(f"  tandem graph: not captured ({tj.get('graph_refused')})")
        best_torch = min(x for x in (eager, graph) if x)
        print(f"  ratio torch/tandem (each at its best mode): {best_torch / tj['median_s']:.2f}x")
        result.update({"tandem_storage": tj.get("storage"), "tandem_experts_path": tj["experts_path"],
                       "tandem_eager_us": te["median_s"] * 1e6, "tandem_eager_launches": te["launches"],
                       "tandem_graph_us": tg["median_s"] * 1e6 if tg else None,
                       "tandem_graph_nodes": nodes or None, "tandem_graph_refused": tj.get("graph_refused"),
                       "tandem_bit_exact": tj.get("bit_exact"), "ratio": best_torch / tj["median_s"]})
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
