#!/usr/bin/env bash
# Builds and runs the CPU emulation of the fused routing kernel of common/moe_route.cu (no GPU,
# no NVRTC): one process per block (its `__shared__` arrays are the process's statics), one
# std::thread per CUDA thread, device memory in a shared mapping, so the grid barriers and the
# cross-block scan run as on the GPU. Checks against a plain C++ reference (route_main.cpp).
# EMU_ROUTE_MODES picks the builds (0 memset, 1 self-resetting, 2 self-resetting with 8 warps;
# default all three).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${EMU_OUT:-/tmp/tandem-route-emu}
mkdir -p "$out"
src="$here/../src/cuda/common/moe_route.cu"
# block_exclusive_scan, then the fused section without its PTX wrappers
awk '/^\/\/ Exclusive prefix sum over the block/{on=1} /^\/\/ One block of 1024 threads/{on=0} on' "$src" > "$out/route.inc"
awk '/^\/\/ The fused path: one cooperative launch/{on=1} /^\/\/ ---- ptx/{skip=1} /^\/\/ ---- end ptx/{skip=0; next} on && !skip' "$src" >> "$out/route.inc"
g++ -std=c++20 -O2 -pthread -Wall -Wno-unused-variable -Wno-unknown-pragmas -I"$out" "$here/route_main.cpp" -o "$out/route_emu"
"$out/route_emu" "$@"
