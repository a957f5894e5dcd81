#!/usr/bin/env bash
# Builds and runs the CPU emulation of common/attention_decode.cu (no GPU, no NVRTC needed): the
# PTX wrappers section of the .cu is replaced by shim.h's stand-ins and its `extern __shared__`
# line dropped (shim.h's dec_smem stands in), everything else is compiled as is, and checked
# against a double-precision reference (decode_main.cpp).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${EMU_OUT:-/tmp/tandem-decode-emu}
mkdir -p "$out"
awk '/^\/\/ ---- ptx/{skip=1} /^\/\/ ---- end ptx ----/{skip=0; next} !skip && !/extern __shared__/' \
    "$here/../src/cuda/common/attention_decode.cu" > "$out/kernels.inc"
# EMU_DEFINES: -D options of another ring (DecodeRing::defines in gpu-kernels/src/lib.rs)
g++ -std=c++20 -O2 ${EMU_DEFINES:-} -pthread -fno-strict-aliasing -Wall -Wno-unused-variable -Wno-unknown-pragmas \
    -I"$here" -I"$out" "$here/decode_main.cpp" -o "$out/decode_emu"
"$out/decode_emu"
