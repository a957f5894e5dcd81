#!/usr/bin/env python3
"""Summarise a kernel_trace.c trace: per kernel, launches, median / min device time and the
median idle gap before it on its stream; with --first, the median span of each repetition.

    python3 kernel_trace.py trace.tsv [--first NAME_PREFIX [--last N]] [--json]

--first: a kernel that starts each repetition (the experts op's moe_tile_map, PyTorch's
vectorized_gather_kernel, a GEMM's nvjet kernel); a repetition runs from its start to the end
of the last kernel before the next one. --last N keeps only the last N repetitions: on a GPU
at its power cap the first ~100 ms run at boost clock, so steady-state figures need the tail.
"""
import argparse
import json
import statistics as st
from collections import defaultdict


def load(path):
    rows = []
    with open(path) as f:
        for line in f:
            p = line.rstrip("\n").split("\t")
            if len(p) >= 7:
                rows.append((int(p[1]), int(p[2]), int(p[3]), p[0], int(p[4]), int(p[5]), int(p[6])))
    rows.sort()
    return rows


def summarise(rows, first=None, last=None):
    reps = []
    if first:
        starts = [i for i, r in enumerate(rows) if r[3].startswith(first)]
        reps = [rows[i:j] for i, j in zip(starts, starts[1:] + [len(rows)])]
        if last:
            reps = reps[-last:]
        rows = [r for rep in reps for r in rep]
    dur, gap, order, last_end = defaultdict(list), defaultdict(list), [], {}
    seen = defaultdict(int)  # a kernel's launches within a repetition, told apart by #n
    for s, e, stream, name, gx, bx, sm in rows:
        if first and name.startswith(first):
            seen.clear()
        key = f"{name[:70]} <{gx}x{bx},{sm}>"
        seen[key] += 1
        if first and seen[key] > 1:
            key += f" #{seen[key]}"
        if key not in dur:
            order.append(key)
        dur[key].append((e - s) / 1e3)
        if stream in last_end:
            gap[key].append((s - last_end[stream]) / 1e3)
        last_end[stream] = e
    kernels = [
        {"kernel": k, "n": len(dur[k]), "median_us": st.median(dur[k]), "min_us": min(dur[k]),
         "gap_us": st.median(gap[k]) if gap[k] else 0.0}
        for k in order
    ]
    out = {"kernels": kernels}
    if reps:
        spans = [(rep[-1][1] - rep[0][0]) / 1e3 for rep in reps]
        busy = [sum(r[1] - r[0] for r in rep) / 1e3 for rep in reps]
        out.update(repetitions=len(reps), span_median_us=st.median(spans), busy_median_us=st.median(busy))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("--first", help="name prefix of the kernel that starts each repetition")
    p.add_argument("--last", type=int, help="keep the last N repetitions (needs --first)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    out = summarise(load(a.trace), a.first, a.last)
    if a.json:
        print(json.dumps(out))
        return
    print(f"{'kernel <grid x block, smem>':<90} {'n':>5} {'median us':>10} {'min us':>9} {'gap us':>8}")
    for k in out["kernels"]:
        print(f"{k['kernel']:<90} {k['n']:>5} {k['median_us']:>10.1f} {k['min_us']:>9.1f} {k['gap_us']:>8.1f}")
    if "repetitions" in out:
        print(f"repetitions {out['repetitions']}: span median {out['span_median_us']:.1f} us, "
              f"kernels busy {out['busy_median_us']:.1f} us")


if __name__ == "__main__":
    main()
