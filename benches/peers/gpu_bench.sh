#!/usr/bin/env bash
# One device call: `tandem bench` and PyTorch (torch_peers.py) on the same shapes, side by side.
# Usage on the GPU machine, from the repo root:  [DTYPE=f16] benches/peers/gpu_bench.sh [quick]
# DTYPE (bf16 or f16, default bf16) is the storage precision of both: tandem gets
# `--cuda-dtype $DTYPE`, torch_peers.py `--dtype $DTYPE`.
# Writes the tandem JSON to /tmp/tandem-bench/$DTYPE and prints a table of RESULT lines last.
# ONLY=linear runs the dense linear pairs alone (8192^3 with and without bias + GELU, and the
# experts' two GEMM shapes as dense ones). ONLY=moe runs the MoE experts pairs alone; MOE_PATHS (default "grouped blaslt") picks the
# experts paths timed (TANDEM_MOE_EXPERTS; `default` = the op's own choice; `fp8` = TANDEM_MOE_FP8=1 beside
# torch_peers.py --fp8, PyTorch's FP8 grouped GEMMs), MOE_TILES (default "default") the grouped tiles
# (TANDEM_MOE_TILE: l, m, s, or default for the op's own choice). ONLY=route runs the four
# routing shapes of issue 15 alone (T16384 E8 k2, T16384 E64 k8, T65536 E128 k8, T8192 E256 k8);
# ROUTE_KERNELS (default "default": the op's own choice) lists TANDEM_ROUTE_KERNEL values to time
# one after the other (fused, fused-2, fused-1, fused-memset, three), e.g. ROUTE_KERNELS="default fused-2 fused-memset".
# WARMUP_MS (default 2000) is passed to both sides as --warmup-ms: a GPU at its power cap runs
# its first ~100 ms at boost clock, so without it a long op's median mixes the two clocks.
set -o pipefail
T=${TANDEM:-.gpu/bin/tandem}
WARM="--warmup-ms ${WARMUP_MS:-2000}"
DTYPE=${DTYPE:-bf16}
case "$DTYPE" in bf16|f16) ;; *) echo "DTYPE must be bf16 or f16, not '$DTYPE'" >&2; exit 2;; esac
W=/tmp/tandem-bench/$DTYPE
mkdir -p "$W"
: > "$W/results"
pair() { # label, then the bench arguments shared by both
  local label=$1
  shift
  if "$T" bench "$@" $WARM --cuda-dtype "$DTYPE" --json > "$W/$label.json" 2> "$W/$label.err"; then
    python3 benches/peers/torch_peers.py "$@" $WARM ${PEER_ARGS:-} --dtype "$DTYPE" --tandem-json "$W/$label.json" | tee "$W/$label.txt"
    grep '^RESULT' "$W/$label.txt" | sed "s/^RESULT /$label /" >> "$W/results"
  else
    echo "tandem bench $label failed:"; tail -5 "$W/$label.err"
  fi
}
moe_pairs() {
  local X="moe-experts --hidden 4096 --ffn 14336 --experts 8 --top-k 2"
  for path in ${MOE_PATHS:-grouped blaslt}; do
    unset TANDEM_MOE_FP8 PEER_ARGS
    if [ "$path" = fp8 ]; then export TANDEM_MOE_FP8=1 PEER_ARGS=--fp8; unset TANDEM_MOE_EXPERTS
    elif [ "$path" = default ]; then unset TANDEM_MOE_EXPERTS; else export TANDEM_MOE_EXPERTS=$path; fi
    for tile in ${MOE_TILES:-default}; do
      if [ "$path" = blaslt ] && [ "$tile" != default ]; then continue; fi
      if [ "$tile" = default ]; then unset TANDEM_MOE_TILE; else export TANDEM_MOE_TILE=$tile; fi
      local tag=$path; [ "$tile" != default ] && tag="$path-$tile"
      pair "moe-x-t4096-$tag" $X --tokens 4096
      pair "moe-x-t64-$tag" $X --tokens 64
    done
  done
  unset TANDEM_MOE_EXPERTS TANDEM_MOE_TILE TANDEM_MOE_FP8 PEER_ARGS
}
route_pairs() {
  for rk in ${ROUTE_KERNELS:-default}; do
    if [ "$rk" = default ]; then unset TANDEM_ROUTE_KERNEL; local tag=""; else export TANDEM_ROUTE_KERNEL=$rk; local tag="-$rk"; fi
    pair "moe-route-t16384-e8-k2$tag" moe-route --tokens 16384 --experts 8 --top-k 2
    pair "moe-route-t16384-e64-k8$tag" moe-route --tokens 16384 --experts 64 --top-k 8
    pair "moe-route-t65536-e128-k8$tag" moe-route --tokens 65536 --experts 128 --top-k 8
    pair "moe-route-t8192-e256-k8$tag" moe-route --tokens 8192 --experts 256 --top-k 8
  done
  unset TANDEM_ROUTE_KERNEL
}
if [ "${ONLY:-}" = route ]; then
  route_pairs
elif [ "${ONLY:-}" = moe ]; then
  moe_pairs
elif [ "${ONLY:-}" = linear ]; then
  pair linear linear --m 8192 --n 8192 --k 8192 --act gelu
  pair linear-plain linear --m 8192 --n 8192 --k 8192 --act none --no-bias
  # the experts' two GEMMs as dense ones (all 8192 routed rows): the most a grouped op can reach
  pair linear-gateup linear --m 8192 --n 28672 --k 4096 --act none --no-bias
  pair linear-down linear --m 8192 --n 4096 --k 14336 --act none --no-bias
else
A="attention --batch 4 --heads 32 --head-dim 128"
for v in ${ATTN_VARIANTS:-m2}; do
  export TANDEM_ATTN_VARIANT=$v
  pair "attn-$v" $A --seq-len 8192
  pair "attn-causal-$v" $A --seq-len 8192 --causal
done
export TANDEM_ATTN_VARIANT=${ATTN_BEST:-m2}
pair attn-gqa $A --kv-heads 8 --seq-len 4096 --causal
for v in ${D64_VARIANTS:-m2}; do
  export TANDEM_ATTN_VARIANT=$v; pair "attn-d64-$v" attention --batch 4 --heads 32 --head-dim 64 --seq-len 4096
done
pair linear linear --m 8192 --n 8192 --k 8192 --act gelu
route_pairs
pair rmsnorm rmsnorm --rows 16384 --cols 8192
pair rope rope --batch 4 --heads 32 --seq-len 4096 --head-dim 128
moe_pairs
fi
echo "== summary, $DTYPE storage (ratio = torch time / tandem time)"
python3 - "$W/results" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    label, js = line.split(" ", 1)
    r = json.loads(js)
    print(f"{label:36} {r['shape']:40} tandem {r['tandem_ms']:8.3f} ms  torch {r['torch_ms']:8.3f} ms  "
          f"ratio {r['ratio']:5.2f}  TF/s {r['tandem_tflops']:6.1f} vs {r['torch_tflops']:6.1f}  "
          f"GB/s {r['tandem_gbps']:7.1f} vs {r['torch_gbps']:7.1f}")
PY
