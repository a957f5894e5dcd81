#!/usr/bin/env bash
# One device call that re-validates and re-times the committed build on the GPU machine:
#   1. `tandem devices`;
#   2. every bundled test with TANDEM_REQUIRE_GPU=1 (a GPU test that cannot run fails);
#   3. the GPU's ceilings (benches/peers/ceilings.py: copy bandwidth, bf16/f16 GEMM);
#   4. benches/peers/gpu_bench.sh (tandem bench beside PyTorch, bf16, the Hopper attention);
#   5. the default layer resident on the GPU (`tandem run --backend cuda --warmup 2`).
# Usage there, from the repo root, after `../shared/tools/gpu-bundle -p tandem -p tandem-tests`
# here:  benches/peers/gpu_check.sh [OUT_DIR]   (logs to OUT_DIR, default $OUT or /tmp/gpu-check)
set -uo pipefail
out=${1:-${OUT:-/tmp/gpu-check}}
mkdir -p "$out"
T=.gpu/bin/tandem
export TANDEM_HISTORY=off PYTHONUNBUFFERED=1
status=0
echo "== devices"; $T devices 2>&1 | tee "$out/devices.txt"
echo "== tests (TANDEM_REQUIRE_GPU=1)"
TANDEM_REQUIRE_GPU=1 TANDEM_SKIP_LOG="$out/skips.log" .gpu/run > "$out/tests.log" 2>&1 || status=1
grep -E '^test result|FAILED|panicked' "$out/tests.log" | sort | uniq -c | sort -rn | head -20
echo "skips (non-GPU tools only; a GPU skip fails under TANDEM_REQUIRE_GPU):"
[ -f "$out/skips.log" ] && cut -f2- "$out/skips.log" | sort | uniq -c | sort -rn | head
echo "== ceilings"; python3 benches/peers/ceilings.py | tee "$out/ceilings.txt"
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  echo "== gpu_bench (bf16)"
  ATTN_VARIANTS=ws ATTN_BEST=ws D64_VARIANTS=ws MOE_PATHS=default benches/peers/gpu_bench.sh > "$out/bench.log" 2>&1 || status=1
  sed -n '/== summary/,$p' "$out/bench.log"
fi
echo "== default layer, weights resident"
$T run --backend cuda --warmup 2 2>&1 | tee "$out/layer.txt" | tail -30
exit $status
