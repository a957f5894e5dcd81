#!/usr/bin/env bash
# Runtime overhead per op: StarPU 1.3's empty codelets (overhead.c) over the schedulers eager,
# lws, ws, dmda and prio, and `tandem bench overhead`, same dependency shapes (a chain and
# independent ops) and op count, in one go; prints one table (microseconds per op; median of
# REPEATS runs after one warm-up).
# Usage, from the repo root:  benches/peers/starpu/run.sh [OPS [REPEATS]]     (default 100000 5)
# TANDEM: the tandem binary (default: target/release/tandem, else target/debug/tandem under
# $CARGO_TARGET_DIR or ./target). SCHEDS: StarPU schedulers (default "eager lws ws dmda prio").
# Needs StarPU 1.3's headers and library (Debian: apt-get install libstarpu-dev) and a C compiler,
# or STARPU_BIN: an overhead.c binary built elsewhere (with its libraries on LD_LIBRARY_PATH;
# `benches/peers/starpu/bundle.sh DIR` makes one with its libraries, for a machine without
# StarPU, such as the GPU machine).
set -euo pipefail
OPS=${1:-100000}
REPEATS=${2:-5}
SCHEDS=${SCHEDS:-eager lws ws dmda prio}
HERE=$(cd "$(dirname "$0")" && pwd)
TD=${CARGO_TARGET_DIR:-target}
if [ -z "${TANDEM:-}" ]; then
  for t in "$TD/release/tandem" "$TD/debug/tandem"; do
    if [ -x "$t" ]; then TANDEM=$t; break; fi
  done
fi
if [ -z "${TANDEM:-}" ] || [ ! -x "$TANDEM" ]; then
  echo "no tandem binary: build one (cargo build --release -p tandem) or set TANDEM" >&2
  exit 2
fi
if [ -n "${STARPU_BIN:-}" ]; then
  BIN=$STARPU_BIN
else
  if ! pkg-config --exists starpu-1.3; then
    echo "StarPU 1.3 not found by pkg-config (Debian/Ubuntu: apt-get install libstarpu-dev), and no STARPU_BIN" >&2
    exit 2
  fi
  BIN=$(mktemp -d)/starpu_overhead
  trap 'rm -rf "$(dirname "$BIN")"' EXIT
  ${CC:-cc} -O2 -Wall -Wextra -o "$BIN" "$HERE/overhead.c" $(pkg-config --cflags --libs starpu-1.3)
fi
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(date -u +%Y-%m-%dT%H:%MZ)"
echo "tandem: $TANDEM"
STARPU_OUT=$(STARPU_SILENT=1 "$BIN" "$OPS" "$REPEATS" $SCHEDS)
TANDEM_OUT=$("$TANDEM" bench overhead --ops "$OPS" --repeats "$REPEATS" --format csv)
python3 - "$STARPU_OUT" "$TANDEM_OUT" <<'PY'
import csv, io, sys
starpu = list(csv.DictReader(io.StringIO(sys.argv[1])))
tandem = list(csv.DictReader(io.StringIO(sys.argv[2])))
rows = [(f"starpu {r['sched']}", r['shape'], int(r['tasks']), float(r['create_us']),
         float(r['execute_us']), float(r['total_us'])) for r in starpu]
rows += [("tandem", r['shape'], int(r['ops']), float(r['plan us/op']),
          float(r['execute us/op']), float(r['total us/op'])) for r in tandem]
for shape in ("chain", "independent"):
    best = min((r for r in rows if r[1] == shape and r[0].startswith("starpu")), key=lambda r: r[5], default=None)
    t = next((r for r in rows if r[1] == shape and r[0] == "tandem"), None)
    if best and t:
        print(f"{shape}: best StarPU scheduler {best[0][7:]} {best[5]:.3f} us/op total, "
              f"tandem {t[5]:.3f} us/op total ({best[5] / t[5]:.1f}x), "
              f"execute alone {best[4]:.3f} vs {t[4]:.3f} ({best[4] / t[4]:.1f}x)")
print()
print(f"{'runtime':<16}{'shape':<13}{'ops':>8}{'plan/create':>13}{'execute':>10}{'total':>10}   (us per op)")
for r in sorted(rows, key=lambda r: (r[1], r[0])):
    print(f"{r[0]:<16}{r[1]:<13}{r[2]:>8}{r[3]:>13.3f}{r[4]:>10.3f}{r[5]:>10.3f}")
PY
