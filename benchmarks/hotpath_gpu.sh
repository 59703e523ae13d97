#!/usr/bin/env bash
# Issue 14's GPU figures in one command: commlayer against raw torch.distributed on NCCL, every
# hot op, sync and async, 8 B to 4 MiB in steps of 2 (the added-latency range) and on to 256 MiB
# (busbw), raw torch also timed against itself in the same rotation (--control: the noise floor
# of each size's busbw ratio), then the facade's own cost on this host's CPU with torch's
# stand-in ProcessGroup (STANDIN=0 skips it).
#
#   NPROC=2 bash benchmarks/hotpath_gpu.sh      (from the repository root; NPROC 2 or 4)
set -uo pipefail
OUT=${OUT:-/tmp/hotpath_gpu}
NPROC=${NPROC:-2}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source benchmarks/gpu_site.sh
nvidia-smi topo -m | head -n $((NPROC + 1)) >> "$OUT/machine.txt"
lscpu | grep -E '^Model name|^CPU\(s\)' >> "$OUT/machine.txt"
timeout -k 5 "${PER_RUN:-330}" python3 benchmarks/torch_vs_commlayer.py --nproc "$NPROC" --backend nccl \
  --min-bytes 8 --max-bytes 256M --factor 2 --rounds "${ROUNDS:-15}" --control --json "$OUT/nccl_${NPROC}gpu.json" \
  2>&1 | tee "$OUT/nccl_${NPROC}gpu.txt" || echo "=== nccl sweep FAILED or timed out"
[ "${STANDIN:-1}" = 1 ] || exit 0
timeout -k 5 "${STANDIN_RUN:-60}" python3 benchmarks/torch_vs_commlayer.py --standin --rounds 9 \
  2>&1 | tee "$OUT/standin_${NPROC}gpu_host.txt" || echo "=== stand-in FAILED or timed out"
