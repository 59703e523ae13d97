#!/usr/bin/env bash
# Training frameworks on init_process_group("commlayer") -- the default CUDA backend, peermem with
# NCCL for the rest -- against the same runs on NCCL, one machine, one go:
#   DeepSpeed ZeRO-1 and ZeRO-3, DDP and FSDP2 on the anchor's 369M GPT (zero_anchor.py measures),
#   torchtitan's debug Llama with FSDP2 and with FSDP2 + TP.
#
#   bash benchmarks/gpu/frameworks.sh [RUN ...]      (from the repository root, on a GPU machine)
#
# RUN is any of bridge ds1 ds3 ddp fsdp2 titan_fsdp titan_tp (default: all), each run on nccl then
# on commlayer, or fsdp2_pm0 (FSDP2 on commlayer with COMMLAYER_PEERMEM=0: the bridge without
# peermem's kernels); bridge runs bridge_check.py (which kernels serve the CUDA calls, DDP, FSDP2,
# DTensor, compile, graph capture and two streams against NCCL) under init_process_group("commlayer")
# and under the takeover switch. DeepSpeed gets dist_backend="commlayer" (ZERO_ANCHOR_DIST_BACKEND);
# DDP and FSDP2 keep the anchor's init_process_group("nccl") and run on commlayer through
# COMMLAYER_TORCH_TAKEOVER=1. Each run ends after RUN_TIMEOUT seconds (default 180; exit code 124
# in results.jsonl), so one hung run does not take the rest of the visit.
# Environment: ANCHOR (default shared/anchors/zero_anchor.py), OUT (default $OUT or
# /tmp/frameworks_gpu), NPROC (default: every GPU), STEPS (20), WARMUP (5), TITAN_STEPS (40), TP (2).
# benchmarks/gpu/site.sh installs the wheels of .whl/ (DeepSpeed, torchtitan and their needs) and
# lays commlayer out; .whl/torchtitan_assets/tokenizer holds torchtitan's test tokenizer.
# Writes $OUT/results.jsonl, $OUT/bridge.jsonl, $OUT/log.txt, $OUT/table.md and $OUT/machine.txt.
set -uo pipefail
ANCHOR=${ANCHOR:-shared/anchors/zero_anchor.py}
OUT=${OUT:-/tmp/frameworks_gpu}
NPROC=${NPROC:-$(nvidia-smi -L | wc -l)}
STEPS=${STEPS:-20}
WARMUP=${WARMUP:-5}
TITAN_STEPS=${TITAN_STEPS:-40}
TP=${TP:-2}
RUN_TIMEOUT=${RUN_TIMEOUT:-180}
RUNS=("$@")
[ ${#RUNS[@]} -eq 0 ] && RUNS=(bridge ds1 ds3 ddp fsdp2 titan_fsdp titan_tp)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export COMMLAYER_PEERMEM_CACHE=${COMMLAYER_PEERMEM_CACHE:-/tmp/peermem_cache}
REPO=$PWD
TITAN_DIR=/tmp/torchtitan_work

source benchmarks/gpu/site.sh

# One labelled JSON line per finished run in results.jsonl; the whole output in log.txt.
record() {
  local run=$1 backend=$2; shift 2
  echo "=== $run on $backend" | tee -a "$OUT/log.txt"
  timeout -k 15 "$RUN_TIMEOUT" "$@" > "$OUT/current.txt" 2>&1
  local code=$?
  cat "$OUT/current.txt" >> "$OUT/log.txt"
  python3 "$REPO/benchmarks/gpu/frameworks_report.py" --line "$run" "$backend" "$code" "$OUT/current.txt" \
    | tee -a "$OUT/results.jsonl"
  rm -f "$OUT/current.txt"
}

anchor() {
  local mode=$1 backend=$2 env=()
  case "$mode:$backend" in
    ds*:commlayer)       env=(ZERO_ANCHOR_DIST_BACKEND=commlayer) ;;
    fsdp2_pm0:commlayer) env=(COMMLAYER_TORCH_TAKEOVER=1 COMMLAYER_PEERMEM=0); mode=fsdp2 ;;
    *:commlayer)         env=(COMMLAYER_TORCH_TAKEOVER=1) ;;
  esac
  env "${env[@]}" python3 -m torch.distributed.run --standalone --nproc-per-node "$NPROC" \
    "$ANCHOR" --mode "$mode" --steps "$STEPS" --warmup "$WARMUP"
}

titan() {
  local tp=$1 backend=$2
  (cd "$TITAN_DIR" && python3 -m torch.distributed.run --standalone --nproc-per-node "$NPROC" \
    "$REPO/benchmarks/gpu/torchtitan_run.py" "$backend" --module llama3 --config llama3_debugmodel \
    --training.steps "$TITAN_STEPS" --parallelism.tensor_parallel_degree "$tp" \
    --parallelism.data_parallel_shard_degree -1 --metrics.log_freq 1)
}

if [[ " ${RUNS[*]} " == *" titan_"* ]]; then
  python3 benchmarks/gpu/torchtitan_assets.py .whl/torchtitan_assets/tokenizer "$TITAN_DIR" || echo "torchtitan assets FAILED"
fi
# One JSON line per backend string: the group's type, the CUDA backend and the kernels it launched.
bridge() {
  local argument
  for argument in commlayer takeover; do
    echo "=== bridge $argument" >>"$OUT/log.txt"
    if [ "$argument" = takeover ]; then
      COMMLAYER_TORCH_TAKEOVER=1 timeout -k 15 "$RUN_TIMEOUT" python3 -m torch.distributed.run --standalone \
        --nproc-per-node "$NPROC" benchmarks/gpu/bridge_check.py nccl
    else
      timeout -k 15 "$RUN_TIMEOUT" python3 -m torch.distributed.run --standalone --nproc-per-node "$NPROC" \
        benchmarks/gpu/bridge_check.py "$argument"
    fi 2>>"$OUT/log.txt" | grep '^{' | tee -a "$OUT/bridge.jsonl"
  done
}

for run in "${RUNS[@]}"; do
  [ "$run" = bridge ] && { bridge; continue; }
  backends=(nccl commlayer)
  [ "$run" = fsdp2_pm0 ] && backends=(commlayer)  # FSDP2 through the bridge, every call on NCCL
  for backend in "${backends[@]}"; do
    case "$run" in
      titan_fsdp) record "$run" "$backend" titan 1 "$backend" ;;
      titan_tp)   record "$run" "$backend" titan "$TP" "$backend" ;;
      *)          record "$run" "$backend" anchor "$run" "$backend" ;;
    esac
  done
done
python3 benchmarks/gpu/frameworks_report.py "$OUT/results.jsonl" | tee "$OUT/table.md"
