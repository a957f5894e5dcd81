#!/usr/bin/env bash
# The measuring calls of the 2026-11-23 session (issues 11, 14, 15), one part per argument:
#   tests     every bundled test with TANDEM_REQUIRE_GPU=1
#   transfer  tandem bench transfer beside PyTorch's pinned/pageable copies
#   layer     the T4096 Mixtral-sized layer on cuda (data plane), and under --memory-limit
#   route     moe_route shapes beside PyTorch (gpu_bench.sh ONLY=route), once per routing kernel
#             in ROUTE_KERNELS (default "fused fused-2 fused-memset": TANDEM_ROUTE_KERNEL values)
#   experts   moe_experts T4096 and T64 (H4096 F14336 E8 k2) beside PyTorch, once per experts
#             path in MOE_PATHS (default "default wgmma blaslt"), and the dense 8192^3 linear
#             (cuBLASLt) beside F.linear: the rate the experts are held to (issue 15)
#   moe-block the whole MoE block (router logits, routing, experts, combine) at T4096 and T64
#             (H4096 F14336 E8 k2): tandem bench moe-block (eager and one replayed CUDA graph, launch
#             counts) on the default experts path and each TANDEM_MOE_EXPERTS value in
#             MOE_BLOCK_PATHS (default "default grouped"),
#             each beside the PyTorch peer (eager, torch.cuda.graphs, launches by torch.profiler)
#   decode    attention_decode B64 Hq32 Hkv8 ctx 8192 d128 (contiguous, paged) beside SDPA
#   decode-sweep  the same decode shape, contiguous and paged, once per TANDEM_DECODE_CHUNKS value
#             in DECODE_CHUNKS (default "auto 8 16 32"), with the current kernel and, where
#             .gpu/old-kernels/common/attention_decode.cu exists, that earlier one beside it
#   two-gpu   on a machine with two GPUs: their link (nvidia-smi topo), the peer-copy test,
#             tandem bench transfer (copy_peer each way) beside PyTorch's peer copy_, and the
#             4-layer T4096 model split over both GPUs by --memory-limit
#   calib     tandem calibrate on cuda at the T4096 sizes, then run --explain (predicted vs measured)
#   model     a 4-layer T4096 model on cuda (tokens/s), and with --memory-limit forcing eviction
#   serve     serve-bench on cpu, cuda, auto
#   overhead  tandem bench overhead (the runtime's per-op cost)
#   starpu    StarPU's empty codelets beside tandem bench overhead, same run (StarPU is not on
#             that machine: carry it with `benches/peers/starpu/bundle.sh .gpu/starpu`)
#   compare   tandem compare of cpu, cuda, fpga-sim and auto on the default layer (fpga-sim from
#             Verilator models built here: copy the build cache to .gpu/sim-cache)
#   sysinfo   cores, memory, transparent huge pages (what first-touch copies depend on)
#   fpga-model  the T4096 Mixtral-sized layer on the modelled card-sized FPGA builds
#             (TANDEM_FPGA_SIM_PROFILE=u55c, TANDEM_FPGA_SIM_MODE=model): per-op projection and
#             the modelled mode's wall time on that host's cores
# Usage there, after `../shared/tools/gpu-bundle -p tandem -p tandem-tests` here:
#   benches/peers/gpu_session.sh OUT_DIR PART...
set -uo pipefail
out=$1; shift
mkdir -p "$out"
T=.gpu/bin/tandem
export TANDEM_HISTORY=off PYTHONUNBUFFERED=1 TANDEM_CALIBRATION=off
L="--seq-len 4096 --d-model 4096 --heads 32 --kv-heads 8 --experts 8 --top-k 2 --ffn 14336"
peak=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo 4800 || echo 3350)
for part in "$@"; do
  echo "== $part ($(date -u +%T))"
  case $part in
    tests)
      TANDEM_REQUIRE_GPU=1 .gpu/run > "$out/tests.log" 2>&1; echo "tests rc=$?"
      grep -E '^test result|FAILED|panicked' "$out/tests.log" | sort | uniq -c | sort -rn | head -20 ;;
    transfer)
      $T bench transfer 2>&1 | tee "$out/transfer.txt"
      python3 benches/peers/transfer_torch.py 2>&1 | tee "$out/transfer_torch.txt" ;;
    layer)
      $T run --backend cuda $L --no-check --warmup 2 --trace "$out/t4096.trace.json" 2>&1 | tail -12 | tee "$out/t4096.txt"
      $T run --backend cuda $L --no-check --warmup 1 --memory-limit cuda:0=3GiB 2>&1 | tail -8 | tee "$out/t4096_limit.txt"
      $T run --backend cuda $L --no-check --warmup 0 --memory-limit cuda:0=1GiB 2>&1 | tail -4 | tee "$out/t4096_toosmall.txt" ;;
    route)
      ROUTE_KERNELS=${ROUTE_KERNELS:-fused fused-2 fused-memset} ONLY=route benches/peers/gpu_bench.sh > "$out/route.log" 2>&1
      sed -n '/== summary/,$p' "$out/route.log"; grep -h '"kernel"' /tmp/tandem-bench/bf16/moe-route-*.json | sort | uniq -c
      mkdir -p "$out/route-json"; cp /tmp/tandem-bench/bf16/moe-route-*.json "$out/route-json/" 2>/dev/null
      grep -h -E '"(name|median_s|median_ms|time_s|kernel)"' "$out"/route-json/*.json | paste - - - 2>/dev/null | head -20 ;;
    experts)
      MOE_PATHS=${MOE_PATHS:-default wgmma blaslt} ONLY=moe benches/peers/gpu_bench.sh > "$out/experts.log" 2>&1
      sed -n '/== summary/,$p' "$out/experts.log"
      mkdir -p "$out/experts-json"; cp /tmp/tandem-bench/bf16/moe-x-*.json "$out/experts-json/" 2>/dev/null
      grep -h '"kernel' "$out"/experts-json/*.json | sort | uniq -c
      ONLY=linear benches/peers/gpu_bench.sh > "$out/linear.log" 2>&1
      sed -n '/== summary/,$p' "$out/linear.log" ;;
    moe-block)
      for tk in ${MOE_BLOCK_TOKENS:-4096 64}; do
        for path in ${MOE_BLOCK_PATHS:-default grouped}; do
          vars=(); [ $path != default ] && vars+=("TANDEM_MOE_EXPERTS=$path")
          j="$out/moe_block_T${tk}_${path}"
          echo "-- T$tk experts path: $path"
          env "${vars[@]}" $T bench moe-block --tokens "$tk" --cuda-dtype bf16 --warmup-ms 2000 --json > "$j.json" 2> "$j.err"
          echo "tandem rc=$?"; tail -3 "$j.err"
          python3 benches/peers/torch_peers.py moe-block --tokens "$tk" --dtype bf16 --warmup-ms 2000 --tandem-json "$j.json" 2>&1 \
            | tee "${j}_peer.txt"
        done
      done ;;
    decode)
      D="--batch 64 --heads 32 --kv-heads 8 --context 8192 --head-dim 128 --new-tokens 1 --cuda-dtype bf16"
      $T bench attention-decode $D --json > "$out/dec_c.json" 2> "$out/dec_c.err"; tail -3 "$out/dec_c.err"
      $T bench attention-decode $D --block-size 16 --json > "$out/dec_p.json" 2> "$out/dec_p.err"; tail -3 "$out/dec_p.err"
      python3 benches/peers/torch_decode_peer.py --batch 64 --heads 32 --kv-heads 8 --context 8192 --head-dim 128 \
        --new-tokens 1 --block-size 16 --dtype bf16 --peak-gbps "$peak" --tandem-json "$out/dec_c.json" \
        --tandem-paged-json "$out/dec_p.json" 2>&1 | tee "$out/decode_peer.txt"
      $T run --decode 4 --context 3000 --kv-block-size 16 --batch 4 --backend cuda 2>&1 | tail -12 | tee "$out/decode_run.txt" ;;
    decode-sweep)
      D="--batch 64 --heads 32 --kv-heads 8 --context 8192 --head-dim 128 --new-tokens 1 --cuda-dtype bf16"
      kds=current; [ -f .gpu/old-kernels/common/attention_decode.cu ] && kds="current .gpu/old-kernels"
      for kd in $kds; do
        for ch in ${DECODE_CHUNKS:-auto 8 16 32}; do
          for pg in contiguous paged; do
            args=$D; [ $pg = paged ] && args="$D --block-size 16"
            vars=(); [ "$kd" != current ] && vars+=("TANDEM_KERNEL_DIR=$kd")
            [ "$ch" != auto ] && vars+=("TANDEM_DECODE_CHUNKS=$ch")
            env "${vars[@]}" $T bench attention-decode $args --json > "$out/sweep.json" 2> "$out/sweep.err"
            python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(f\"kernel={sys.argv[2]} chunks={sys.argv[3]} {sys.argv[4]}: {d['median_s']*1e6:.1f} us {d['gbps']:.0f} GB/s {100*d['gbps']/float(sys.argv[5]):.1f}% {d['kernel']}\")" \
              "$out/sweep.json" "$kd" "$ch" "$pg" "$peak" 2>&1 | tee -a "$out/decode_sweep.txt" || tail -3 "$out/sweep.err"
          done
        done
      done ;;
    two-gpu)
      nvidia-smi topo -m 2>&1 | head -6 | tee "$out/topo.txt"
      TANDEM_REQUIRE_GPU=1 .gpu/run peer 2>&1 | grep -E "^test |test result" | tee "$out/peer_test.txt"
      $T bench transfer 2>&1 | tee "$out/transfer2.txt"
      python3 benches/peers/transfer_torch.py 2>&1 | tee "$out/transfer2_torch.txt"
      $T run --backend cuda $L --layers 4 --no-check --warmup 1 2>&1 | tail -10 | tee "$out/model4_two.txt"
      $T run --backend cuda $L --layers 4 --no-check --warmup 1 --memory-limit cuda:0=8GiB,cuda:1=8GiB 2>&1 \
        | tail -14 | tee "$out/model4_split.txt" ;;
    calib)
      export TANDEM_CALIBRATION="$out/calibration.json"
      $T calibrate --backend cuda --iters 5 $L 2>&1 | tee "$out/calibrate.txt" | tail -20
      $T run --backend cuda $L --no-check --warmup 1 --explain --fresh 2>&1 | grep -iE "predicted|measured|calibrated|total" | head -40 | tee "$out/explain.txt"
      export TANDEM_CALIBRATION=off ;;
    model)
      $T run --backend cuda $L --layers 4 --no-check --warmup 1 2>&1 | tail -8 | tee "$out/model4.txt"
      $T run --backend cuda $L --layers 4 --no-check --warmup 1 --memory-limit cuda:0=12GiB 2>&1 | tail -10 | tee "$out/model4_limit.txt" ;;
    serve)
      $T serve-bench --requests 200 --concurrency 8 --backend cpu,cuda,auto --seq-len 512 --d-model 1024 --heads 16 --kv-heads 4 --ffn 2048 2>&1 | tail -12 | tee "$out/serve.txt" ;;
    overhead)
      $T bench overhead 2>&1 | tail -12 | tee "$out/overhead.txt" ;;
    starpu)
      STARPU_BIN=.gpu/starpu/starpu_overhead LD_LIBRARY_PATH=.gpu/starpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
        TANDEM=$T benches/peers/starpu/run.sh 100000 5 2>&1 | tee "$out/starpu.txt" ;;
    compare)
      TANDEM_SIM_CACHE_DIR=.gpu/sim-cache $T devices 2>&1 | tee "$out/devices.txt"
      TANDEM_SIM_CACHE_DIR=.gpu/sim-cache $T compare 2>&1 | tail -30 | tee "$out/compare.txt" ;;
    fpga-model)
      { time TANDEM_SIM_CACHE_DIR=.gpu/sim-cache TANDEM_FPGA_SIM_PROFILE=u55c TANDEM_FPGA_SIM_MODE=model \
        $T run --backend fpga-sim $L --no-check --warmup 0; } > "$out/fpga_model.txt" 2>&1
      tail -32 "$out/fpga_model.txt" ;;
    sysinfo)
      { nproc; free -g; cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag; uname -r; } 2>&1 | tee "$out/sysinfo.txt" ;;
  esac
done
