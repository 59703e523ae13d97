#!/usr/bin/env bash
# The parallel layers' GPU figures in one command: Ulysses and MoE against DeepSpeed's anchors, and ZeRO
# stage 3 vs stage 1 vs FSDP2 at 2.68B, every run on the same machine, each under its own timeout.
#
#   bash benchmarks/gpu/parallel_layers.sh [RUN ...]     (from the repository root)
#
# RUN is any of ds_ulysses cl_ulysses cl_ulysses_bf16 ds_moe cl_moe cl1_big cl3_big fsdp2_big
# (default: all). Environment: ANCHORS (folder of the anchors; default shared/anchors), OUT ($OUT
# or /tmp/parallel_gpu), NPROC (2), SEQ (32768), PER_RUN (timeout of each run, seconds; 120).
set -uo pipefail
ANCHORS=${ANCHORS:-shared/anchors}
OUT=${OUT:-/tmp/parallel_gpu}
NPROC=${NPROC:-2}
SEQ=${SEQ:-32768}
PER_RUN=${PER_RUN:-120}
RUNS=("$@")
[ ${#RUNS[@]} -eq 0 ] && RUNS=(ds_ulysses cl_ulysses ds_moe cl_moe cl1_big cl3_big fsdp2_big cl_ulysses_bf16)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source benchmarks/gpu/site.sh

BIG=(--width 2560 --layers 32 --heads 20 --mb 4 --steps 10 --warmup 3)
# commlayer's 2.68B runs use fused AdamW, the optimizer of the FSDP2 anchor they are held against.
for run in "${RUNS[@]}"; do
  case "$run" in
    ds_ulysses) command=("$ANCHORS/ulysses_anchor.py" --seq "$SEQ" --steps 6 --warmup 2) ;;
    cl_ulysses) command=(benchmarks/gpu/parallel_layers.py --layer ulysses --seq "$SEQ" --steps 6 --warmup 2) ;;
    cl_ulysses_bf16) command=(benchmarks/gpu/parallel_layers.py --layer ulysses --seq "$SEQ" --precision bf16 --steps 6 --warmup 2) ;;
    ds_moe) command=("$ANCHORS/moe_anchor.py") ;;
    cl_moe) command=(benchmarks/gpu/parallel_layers.py --layer moe) ;;
    cl1_big) command=(benchmarks/gpu/zero.py --stage 1 --fused --anchor "$ANCHORS/zero_anchor.py" "${BIG[@]}") ;;
    cl3_big) command=(benchmarks/gpu/zero.py --stage 3 --fused --anchor "$ANCHORS/zero_anchor.py" "${BIG[@]}") ;;
    fsdp2_big) command=("$ANCHORS/zero_anchor.py" --mode fsdp2 "${BIG[@]}") ;;
    *) echo "unknown run $run"; continue ;;
  esac
  echo "=== $run $(date +%T)" | tee -a "$OUT/log.txt"
  timeout -k 5 "$PER_RUN" python3 -m torch.distributed.run --standalone --nproc-per-node "$NPROC" "${command[@]}" \
    2>&1 | tee -a "$OUT/log.txt" | grep '^{' | sed "s/^{/{\"run\": \"$run\", /" >> "$OUT/results.jsonl" \
    || echo "=== $run FAILED or timed out (see log.txt)" | tee -a "$OUT/log.txt"
done
cat "$OUT/results.jsonl"
