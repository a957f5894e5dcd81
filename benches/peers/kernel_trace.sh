#!/usr/bin/env bash
# Build the CUPTI kernel tracer (kernel_trace.c) on a CUDA machine and run a command under it:
#   benches/peers/kernel_trace.sh OUT.tsv <command...>
# then `python3 benches/peers/kernel_trace.py OUT.tsv` for per-kernel medians and gaps.
set -euo pipefail
out=$1; shift
cuda=${CUDA_HOME:-/usr/local/cuda}
inc=$cuda/extras/CUPTI/include; lib=$cuda/extras/CUPTI/lib64
[ -d "$inc" ] || inc=$cuda/include
[ -d "$lib" ] || lib=$cuda/lib64
# the newest kernel record the headers define
krec=$(grep -ho 'CUpti_ActivityKernel[0-9]*' "$inc"/cupti_activity*.h | sort -uV | tail -1)
so=${KTRACE_LIB:-/tmp/libktrace.so}
gcc -O2 -shared -fPIC -I"$cuda/include" -I"$inc" -DKREC="$krec" "$(dirname "$0")/kernel_trace.c" \
    -L"$lib" -Wl,-rpath,"$lib" -lcupti -o "$so"
CUDA_INJECTION64_PATH=$so KTRACE_OUT=$out "$@"
