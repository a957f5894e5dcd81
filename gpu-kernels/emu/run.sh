#!/usr/bin/env bash
# Builds and runs the CPU emulation of sm80/moe_experts.cu (no GPU, no NVRTC needed): the PTX
# wrappers section of the .cu is replaced by shim.h's stand-ins, everything else is compiled as is.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${EMU_OUT:-/tmp/tandem-moe-emu}
mkdir -p "$out"
awk '/^\/\/ ---- element types/{skip=1} /^\/\/ ---- 1\. tile map ----/{skip=0} !skip && !/extern __shared__/' \
    "$here/../src/cuda/sm80/moe_experts.cu" > "$out/kernels.inc"
g++ -std=c++20 -O2 -pthread -Wall -Wno-unused-variable -Wno-unknown-pragmas -I"$here" -I"$out" "$here/main.cpp" -o "$out/moe_emu"
"$out/moe_emu"
