#!/usr/bin/env bash
# commlayer ZeRO-0/1/2/3 against the anchor's DDP, FSDP2 and DeepSpeed ZeRO-1/2/3, one machine, one go.
#
#   bash benchmarks/gpu/zero.sh [MODE ...]        (from the repository root, on a 2-GPU machine)
#
# MODE is any of ddp fsdp2 ds1 ds2 ds3 (the anchor) and cl0 cl1 cl2 cl3 cl1_fused ... (zero_gpu.py);
# default: all but the fused ones. Environment: ANCHOR (zero_anchor.py; default
# shared/anchors/zero_anchor.py), OUT (results folder; default $OUT or /tmp/zero_gpu), NPROC (2),
# STEPS (20), WARMUP (5). benchmarks/gpu/site.sh lays commlayer and the wheels in .whl/ out first.
set -uo pipefail
ANCHOR=${ANCHOR:-shared/anchors/zero_anchor.py}
OUT=${OUT:-/tmp/zero_gpu}
NPROC=${NPROC:-2}
STEPS=${STEPS:-20}
WARMUP=${WARMUP:-5}
MODES=("$@")
[ ${#MODES[@]} -eq 0 ] && MODES=(ddp fsdp2 ds1 ds2 ds3 cl0 cl1 cl2 cl3)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1

source benchmarks/gpu/site.sh

for mode in "${MODES[@]}"; do
  case "$mode" in
    cl*) stage=${mode:2:1}; extra=(); [[ "$mode" == *_fused ]] && extra=(--fused)
         command=(benchmarks/gpu/zero.py --stage "$stage" --anchor "$ANCHOR" "${extra[@]}") ;;
    *)   command=("$ANCHOR" --mode "$mode") ;;
  esac
  echo "=== $mode" | tee -a "$OUT/log.txt"
  python3 -m torch.distributed.run --standalone --nproc-per-node "$NPROC" "${command[@]}" --steps "$STEPS" --warmup "$WARMUP" \
    2>&1 | tee -a "$OUT/log.txt" | grep '^{' >> "$OUT/results.jsonl" || echo "=== $mode FAILED (see log.txt)" | tee -a "$OUT/log.txt"
done
python3 benchmarks/gpu/zero_report.py "$OUT/results.jsonl" | tee "$OUT/table.md"
