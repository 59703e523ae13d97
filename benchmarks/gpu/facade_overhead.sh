#!/usr/bin/env bash
# The GPU facade overhead figures in one command: commlayer against raw torch.distributed on NCCL
# (BACKENDS: nccl, then peermem, the default backend's CUDA half, on the same communicator), every
# hot op, sync and async, 8 B to 4 MiB in steps of 4 (FACTOR; the added-latency range) and on to
# 256 MiB (busbw), 61 rounds (ROUNDS), each rank pinned to a core of its own, raw torch also timed
# against itself in the same rotation (--control: the noise floor of each size's busbw ratio),
# then the facade's own cost on this host's CPU with torch's stand-in ProcessGroup, C fast paths
# and Python ones (STANDIN=0 skips it).
#
#   NPROC=2 bash benchmarks/gpu/facade_overhead.sh      (from the repository root; NPROC 2 or 4)
set -uo pipefail
OUT=${OUT:-/tmp/hotpath_gpu}
NPROC=${NPROC:-2}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source benchmarks/gpu/site.sh
source benchmarks/gpu/build.sh
# gpu_site.sh lays commlayer out without building: compile the C fast paths and the tensor
# reader for this python3 and torch; without a compiler, the Python fast paths run.
build_c_fast_paths . "$SITE" 2>>"$OUT/machine.txt" | tee -a "$OUT/machine.txt" \
  || echo "=== no C fast paths: the Python ones run" | tee -a "$OUT/machine.txt"
(cd /tmp && python3 -c 'from commlayer.core import tensor_reader as r; from commlayer.backends import torch_fast_paths as p; print("C fast paths:", p.native_enabled(), "C tensor reader:", r.tensor_meta_reader() is not None)') \
  | tee -a "$OUT/machine.txt"
nvidia-smi topo -m | head -n $((NPROC + 1)) >> "$OUT/machine.txt"
lscpu | grep -E '^Model name|^CPU\(s\)' >> "$OUT/machine.txt"
for backend in ${BACKENDS:-nccl peermem}; do
  timeout -k 5 "${PER_RUN:-330}" python3 benchmarks/overhead/torch_vs_commlayer.py --nproc "$NPROC" --backend "$backend" \
    --min-bytes 8 --max-bytes "${MAX_BYTES:-256M}" --factor "${FACTOR:-4}" --rounds "${ROUNDS:-61}" --control --pin \
    --json "$OUT/${backend}_${NPROC}gpu.json" 2>&1 | tee "$OUT/${backend}_${NPROC}gpu.txt" || echo "=== $backend sweep FAILED or timed out"
done
if [ "${DIAG:-0}" = 1 ]; then  # async send/recv alone: unpinned, then with the Python fast paths
  for variant in nopin python; do
    flags=(--pin); [ "$variant" = nopin ] && flags=()
    COMMLAYER_C_FAST_PATHS=$([ "$variant" = python ] && echo 0 || echo 1) timeout -k 5 120 python3 \
      benchmarks/overhead/torch_vs_commlayer.py --nproc "$NPROC" --backend nccl --ops send_recv --modes async \
      --min-bytes 8 --max-bytes 2M --factor 16 --rounds 41 --control "${flags[@]}" \
      2>&1 | tee "$OUT/diag_send_recv_${variant}_${NPROC}gpu.txt" || echo "=== diag $variant FAILED"
  done
fi
[ "${STANDIN:-1}" = 1 ] || exit 0
for c_fast_paths in 1 0; do  # the C fast paths, then the Python ones (COMMLAYER_C_FAST_PATHS=0), same host
  COMMLAYER_C_FAST_PATHS=$c_fast_paths timeout -k 5 "${STANDIN_RUN:-60}" python3 benchmarks/overhead/torch_vs_commlayer.py \
    --standin --rounds 9 2>&1 | tee "$OUT/standin_${NPROC}gpu_host_c$c_fast_paths.txt" || echo "=== stand-in FAILED"
done
