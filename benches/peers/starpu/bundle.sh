#!/usr/bin/env bash
# Builds benches/peers/starpu/overhead.c here and copies it with the shared libraries it needs
# (StarPU 1.3 and its dependencies, not libc) into DIR, so run.sh can run it on a machine
# without StarPU (the GPU machine):
#   benches/peers/starpu/bundle.sh .gpu/starpu
#   STARPU_BIN=.gpu/starpu/starpu_overhead LD_LIBRARY_PATH=.gpu/starpu/lib TANDEM=... run.sh
set -euo pipefail
DIR=${1:?usage: bundle.sh DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$DIR/lib"
${CC:-cc} -O2 -Wall -Wextra -o "$DIR/starpu_overhead" "$HERE/overhead.c" $(pkg-config --cflags --libs starpu-1.3)
ldd "$DIR/starpu_overhead" | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libgcc_s.so*|ld-linux*|libpthread.so*|libdl.so*|librt.so*) ;;
    *) cp -L "$lib" "$DIR/lib/" ;;
  esac
done
echo "$DIR: starpu_overhead and $(ls "$DIR/lib" | wc -l) libraries ($(du -sh "$DIR" | cut -f1))"
