#!/usr/bin/env bash
# peermem on one host's GPUs, in one command: build, every correctness check, every figure.
#
#   bash benchmarks/gpu/peermem.sh [STEP ...]      (from the repository root; results in $OUT)
#
# STEP is any of checks tp conformance zero moe anchor profile (default: all but profile). Per world
# size (all GPUs, then 2 when there are 4 or more): peermem.py (correctness, then collectives against
# NCCL and torch's symmetric memory), peermem_tp.py (TP decode: fused kernel vs NCCL), `commlayer
# test-backend peermem` from the CLI, ZeRO stages 1-3 on the default backend and on nccl (zero.py,
# the anchor's 369M model); on 4 or more GPUs MoE on the default backend and on NCCL against
# DeepSpeed's (shared/anchors/moe_anchor.py, wheels in .whl/); profile: peermem_profile.py
# (grid sweeps, kernel times), barrier_profile.cu (the kernels' fixed cost, part by part, with nvcc),
# and on 4 or more GPUs one profiled step of MoE and of ZeRO stages 1-3
# (and 3 with one unit per block) on the default backend and on NCCL (with `trace analyze
# --arrivals` of each ZeRO run: when each rank entered each collective); then `commlayer
# test-backend cpu:gloo,cuda:peermem -n 2`, and last the small all_reduce anchor per world size.
# Each step has a time limit and the whole run a deadline (DEADLINE seconds, default 540), so
# results come back even when a step hangs; everything lands in $OUT/peermem.tgz (the folder
# peermem_run) and the summary in $OUT/summary.txt; the exit status is 1 when any step failed or was
# cut off. On a machine of one GPU, checks runs peermem_shared_gpu.py instead: 2 and 4 ranks on the
# one GPU, correctness only, ZeRO stage 3 included. Environment: ANCHORS (default anchors),
# WORLDS (the world sizes to run; default as above), CHECK_WORLDS (those to run the correctness
# checks on; default every one).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export COMMLAYER_PEERMEM_CACHE=/tmp/peermem_cache SITE=/tmp/peermem_site
OUT=${OUT:-/tmp/peermem_gpu}
ANCHORS=${ANCHORS:-anchors}
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(checks tp conformance zero moe anchor)
began=$(date +%s)
deadline=$((began + ${DEADLINE:-540}))
RUN=/tmp/peermem_run
rm -rf "$RUN" && mkdir -p "$RUN" "$OUT"
summary() { echo "$*" | tee -a "$OUT/summary.txt"; }
# Runs "$@" for at most $1 seconds (fewer when the deadline is nearer), logging to $RUN/$2.log.
step() {
  local limit=$1 name=$2
  shift 2
  local left=$((deadline - $(date +%s) - 15))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 20 ]; then
    summary "=== $name skipped: the deadline is near"
    failed=$((failed + 1))
    return 1
  fi
  local start
  start=$(date +%s)
  timeout -k 5 "$limit" "$@" >"$RUN/$name.log" 2>&1
  local rc=$?
  summary "=== $name: exit $rc after $(($(date +%s) - start)) s (limit $limit s)"
  [ $rc -eq 0 ] || failed=$((failed + 1))
  return $rc
}
wants() { [[ " ${STEPS[*]} " == *" $1 "* ]]; }
failed=0  # steps that failed or were cut off: the script's exit status is 1 when any did

source benchmarks/gpu/site.sh >"$RUN/site.log" 2>&1 || { cat "$RUN/site.log"; exit 1; }
cp "$OUT/machine.txt" "$RUN/" 2>/dev/null
nvidia-smi topo -m >"$RUN/topology.txt" 2>&1
step 180 build bash -c "cd /tmp && python3 -c 'import torch; from commlayer.backends.peermem.kernel_library import load_library as l; m, n = torch.cuda.get_device_capability(); l(f\"sm_{m}{n}\")'" || exit 1
gpus=$(nvidia-smi -L | wc -l)
worlds=("$gpus")
[ "$gpus" -ge 4 ] && worlds=("$gpus" 2)
[ -n "${WORLDS:-}" ] && read -ra worlds <<<"$WORLDS"
TORCHRUN=(python3 -m torch.distributed.run --standalone --nproc-per-node)
if [ "$gpus" -eq 1 ]; then  # 2 and 4 ranks share the one GPU: correctness only (no NCCL, nothing timed)
  worlds=()
  for n in 2 4; do
    wants checks && step 240 "shared_gpu_w$n" "${TORCHRUN[@]}" "$n" benchmarks/gpu/peermem_shared_gpu.py \
      --out "$RUN" --anchor "$ANCHORS/zero_anchor.py"
  done
fi
# The CLI runs outside the checkout, whose commlayer/ folder lacks backends/ (installed beside it).
certify() { local limit=$1 name=$2 backend=$3 n=$4; step "$limit" "$name" bash -c "cd /tmp && exec python3 -m commlayer test-backend $backend -n $n --timeout $((limit - 10))"; }
for n in "${worlds[@]}"; do
  export CUDA_VISIBLE_DEVICES
  CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1)))
  if wants checks && [[ " ${CHECK_WORLDS:-${worlds[*]}} " == *" $n "* ]]; then
    step 150 "checks_w$n" "${TORCHRUN[@]}" "$n" benchmarks/gpu/peermem.py --out "$RUN" --skip-bench
  fi
  wants checks && step 200 "collectives_w$n" "${TORCHRUN[@]}" "$n" benchmarks/gpu/peermem.py --out "$RUN" --skip-checks
  wants tp && step 150 "tp_w$n" "${TORCHRUN[@]}" "$n" benchmarks/gpu/peermem_tp.py --out "$RUN"
  wants conformance && certify 110 "conformance_peermem_w$n" peermem "$n"
  if wants zero && [ -f "$ANCHORS/zero_anchor.py" ]; then
    for stage in 1 2 3; do
      for backend in default cpu:gloo,cuda:nccl; do
        step 80 "train_zero${stage}_${backend%%,*}_w$n" "${TORCHRUN[@]}" "$n" benchmarks/gpu/zero.py --stage "$stage" \
          --anchor "$ANCHORS/zero_anchor.py" --backend "$backend" --steps 10 --warmup 3
      done
    done
  fi
  wants profile && step 150 "profile_w$n" "${TORCHRUN[@]}" "$n" benchmarks/gpu/peermem_profile.py --out "$RUN"
  if wants profile; then
    arch=sm_$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
    step 60 "barrier_profile_w$n" bash -c \
      "nvcc -O3 -arch=$arch -o /tmp/barrier_profile benchmarks/gpu/barrier_profile.cu && /tmp/barrier_profile"
  fi
  if wants profile && [ "$n" -ge 4 ]; then
    step 90 "moe_profile_w$n" "${TORCHRUN[@]}" "$n" benchmarks/gpu/parallel_layers.py --layer moe --backend default --profile
    # Stage "3b": stage 3 with one unit per block (stage3_coalesce_numel 0): 28 units, not 12.
    for stage in 1 2 3 3b; do
      for backend in default cpu:gloo,cuda:nccl; do
        name="zero${stage}_${backend%%,*}_w$n"
        units=()
        [ "$stage" = 3b ] && units=(--coalesce 0)
        [ -f "$ANCHORS/zero_anchor.py" ] && step 120 "$name" "${TORCHRUN[@]}" "$n" benchmarks/gpu/zero.py \
          --stage "${stage%b}" ${units[@]+"${units[@]}"} --anchor "$ANCHORS/zero_anchor.py" --backend "$backend" \
          --steps 10 --warmup 3 --profile --trace "$RUN/trace_$name"
        [ -d "$RUN/trace_$name" ] && (cd /tmp && python3 -m commlayer trace analyze --arrivals "$RUN/trace_$name") \
          >"$RUN/arrivals_$name.txt" 2>&1
      done
    done
  fi
  if wants moe && [ -f "$ANCHORS/moe_anchor.py" ] && [ "$n" -ge 4 ]; then
    step 90 "moe_deepspeed_w$n" "${TORCHRUN[@]}" "$n" "$ANCHORS/moe_anchor.py"
    step 90 "moe_default_w$n" "${TORCHRUN[@]}" "$n" benchmarks/gpu/parallel_layers.py --layer moe --backend default
    step 90 "moe_nccl_w$n" "${TORCHRUN[@]}" "$n" benchmarks/gpu/parallel_layers.py --layer moe --backend nccl
  fi
done
CUDA_VISIBLE_DEVICES=0,1
wants conformance && certify 110 conformance_default_w2 cpu:gloo,cuda:peermem 2
for n in "${worlds[@]}"; do
  CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1)))
  if wants anchor && [ -f "$ANCHORS/small_allreduce_anchor.py" ]; then
    step 60 "anchor_w$n" "${TORCHRUN[@]}" "$n" "$ANCHORS/small_allreduce_anchor.py"
  fi
done
for log in "$RUN"/conformance_*.log; do [ -f "$log" ] && summary "$(basename "$log"): $(grep -E 'CONFORMS|cells passed' "$log" | tail -1)"; done
for log in "$RUN"/moe_*.log "$RUN"/zero*.log "$RUN"/train_zero*.log; do [ -f "$log" ] && summary "$(basename "$log"): $(grep '^{' "$log" | tail -1)"; done
for log in "$RUN"/shared_gpu_w*.log; do [ -f "$log" ] && grep '^shared:' "$log" | sort | while read -r line; do summary "$line"; done; done
for log in "$RUN"/checks_*.log; do [ -f "$log" ] && summary "$(basename "$log"): $(grep '^checks:' "$log" | tail -1)"; done
for log in "$RUN"/arrivals_*.txt; do [ -f "$log" ] && summary "$(basename "$log"): $(grep 'arrivals at' "$log" | tr '\n' ' ')"; done
tar -czf "$OUT/peermem.tgz" -C /tmp peermem_run
summary "=== done after $(($(date +%s) - began)) s"
for log in "$RUN"/barrier_profile_*.log; do [ -f "$log" ] && cat "$log"; done
for log in "$RUN"/collectives_*.log "$RUN"/tp_*.log; do [ -f "$log" ] && grep -E '^ *[0-9]+ |^#|^hidden' "$log"; done
[ "$failed" -eq 0 ]
