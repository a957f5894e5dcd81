"""PyTorch's host<->GPU copies, the peer of `tandem bench transfer`: the same byte count, pinned
and pageable host tensors, each direction, raw bytes and f32 with the bf16 conversion done
where PyTorch users do it (`x.to('cuda', non_blocking=True).to(torch.bfloat16)`: a raw f32 copy
then a GPU cast; and the reverse). Wall clock to completion (torch.cuda.synchronize), 1 warm-up,
median of --iters. With two or more GPUs, also the peer copy cuda:0 <-> cuda:1 (raw bytes,
`copy_` into a tensor on the other GPU, both devices synchronised), beside tandem's
`copy_peer` figures.

    python3 benches/peers/transfer_torch.py [--bytes 268435456] [--iters 10] [--json]
"""
import argparse
import json
import time

import torch


def median_s(fn, iters):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2]


def sync_all():
    for i in range(torch.cuda.device_count()):
        torch.cuda.synchronize(i)


def median_all_s(fn, iters):
    fn()
    sync_all()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        sync_all()
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bytes", type=int, default=256 << 20)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    n = a.bytes // 4 * 4
    dev = torch.device("cuda")
    rows = []

    def add(path, direction, host_bytes, link_bytes, s):
        rows.append({"path": path, "direction": direction, "host_bytes": host_bytes,
                     "link_bytes": link_bytes, "median_s": s,
                     "host_gbps": host_bytes / s / 1e9, "link_gbps": link_bytes / s / 1e9})

    for pinned in (True, False):
        kind = "pinned" if pinned else "pageable"
        h = torch.ones(n, dtype=torch.uint8, pin_memory=pinned)
        d = torch.empty(n, dtype=torch.uint8, device=dev)
        add(f"torch raw {kind} (copy_ non_blocking)", "h2d", n, n,
            median_s(lambda: d.copy_(h, non_blocking=pinned), a.iters))
        add(f"torch raw {kind} (copy_ non_blocking)", "d2h", n, n,
            median_s(lambda: h.copy_(d, non_blocking=pinned), a.iters))
        del h, d
    hf = torch.linspace(-1, 1, n // 4, dtype=torch.float32).pin_memory()
    add("torch f32 pinned .to('cuda', non_blocking=True)", "h2d", n, n,
        median_s(lambda: hf.to(dev, non_blocking=True), a.iters))
    add("torch f32 pinned .to('cuda', non_blocking=True).to(bf16)", "h2d", n, n,
        median_s(lambda: hf.to(dev, non_blocking=True).to(torch.bfloat16), a.iters))
    db = hf.to(dev).to(torch.bfloat16)
    out = torch.empty(n // 4, dtype=torch.float32, pin_memory=True)
    add("torch bf16 -> f32 on GPU, copy_ to pinned", "d2h", n, n,
        median_s(lambda: out.copy_(db.float(), non_blocking=True), a.iters))
    add("torch bf16 .cpu().float() (pageable)", "d2h", n, n // 2,
        median_s(lambda: db.cpu().float(), a.iters))
    if torch.cuda.device_count() >= 2:
        for s_, d_ in ((0, 1), (1, 0)):
            src = torch.ones(n, dtype=torch.uint8, device=f"cuda:{s_}")
            dst = torch.empty(n, dtype=torch.uint8, device=f"cuda:{d_}")
            add(f"torch peer cuda:{s_} -> cuda:{d_} (copy_)", "p2p", n, n,
                median_all_s(lambda: dst.copy_(src), a.iters))
            del src, dst
    res = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
           "bytes": n, "iters": a.iters, "transfers": rows}
    if a.json:
        print(json.dumps(res, indent=2))
        return
    print(f"{res['device']} (torch {res['torch']}): {n / 2**20:.1f} MiB per copy, median of {a.iters}")
    print(f"{'path':<58} {'dir':>4} {'ms':>9} {'host GB/s':>10} {'link GB/s':>10}")
    for r in rows:
        print(f"{r['path']:<58} {r['direction']:>4} {r['median_s'] * 1e3:>9.3f} "
              f"{r['host_gbps']:>10.2f} {r['link_gbps']:>10.2f}")


if __name__ == "__main__":
    main()
