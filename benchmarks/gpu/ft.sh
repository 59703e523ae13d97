#!/usr/bin/env bash
# Fault-tolerant data parallel on GPUs, through the launcher: `commlayer run --ft` on a 2 replicas x
# 2 shards ZeRO-2 job of commlayer.testing.ft_member, one SIGKILL of a random member at a random
# step per run; the launcher restarts it in its slot and it rejoins.
#
# Run, from the repository root on a machine with 2 or 4 GPUs (torch with CUDA, nvcc for the
# peermem kernels, no network needed); about 3-4 minutes, never more than DEADLINE (230) seconds:
#
#   bash benchmarks/gpu/ft.sh                       # peermem (the default CUDA backend), then nccl
#   BACKENDS=nccl RUNS=3 STEPS=70 bash benchmarks/gpu/ft.sh
#
# Per backend: RUNS (3) runs with one kill each and one fault-free run, STEPS (70) steps of 0.2 s;
# each backend gets an equal share of what is left of DEADLINE (one with under 40 s is skipped, and
# summary.txt says so).
# With 4 GPUs each member has its own; with 2, members 0 and 3 share GPU 0 and members 1 and 2 GPU
# 1, so that no communicator holds two ranks of one GPU (a replica's shard group and a shard's
# replica group each span both GPUs). What lands in $OUT (default /tmp/ft_gpu):
#
#   summary.txt                 the benchmark's summary lines per backend (also printed)
#   BACKEND/fault_tolerance_gpu.json  per run: exit code, max deviation from the replay, time lost
#                               per failure (against the fault-free run, and in the survivors' own
#                               steps), the replacement's rejoin broken down (CUDA context, start-up,
#                               quorum, communicators = NCCL init, state transfer), the survivors'
#                               generations; BACKEND/runs/: each run's launcher log and ft_job.json
#   topology.txt, machine.txt   nvidia-smi topo -m; GPUs, driver, torch
#
# What to look for in summary.txt, per backend: "3/3 finished with the right parameters, 0 hung";
# the median time lost per failure against "one step" (goal: <= 1.0 s + one step); the
# replacement's rejoin lines (CUDA context, NCCL init, quorum, state transfer). In the JSON each
# run's "survivors" list every generation a never-killed member entered: after the kill its own
# replica's shard group is kept ("kept": 1, communicators_s ~0), at the rejoin it builds one
# communicator (its shard's replica group).
#
# peermem has no abort: a survivor's kernel that waits for the killed member's flag runs until the
# communicator's timeout (commlayer.ft's comm_timeout_s, 10 s), and the survivor's next ops queue
# behind it on the stream, so peermem may lose up to that per failure where NCCL's abort ends the
# kernel at once. The difference between the two blocks of summary.txt is that cost.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
# The Manager decides about a lost peer and aborts the communicators itself: torch's watchdog
# neither ends the process nor dumps while the Manager recovers.
export TORCH_NCCL_ASYNC_ERROR_HANDLING=0 TORCH_NCCL_DUMP_ON_TIMEOUT=0 TORCH_NCCL_ENABLE_MONITORING=0
export TORCH_FR_BUFFER_SIZE=0
export COMMLAYER_PEERMEM_CACHE=/tmp/peermem_cache SITE=/tmp/ft_site
OUT=${OUT:-/tmp/ft_gpu}
BACKENDS=${BACKENDS:-peermem nccl}
RUNS=${RUNS:-3}
STEPS=${STEPS:-70}
deadline=$(($(date +%s) + ${DEADLINE:-230}))
mkdir -p "$OUT"
summary() { echo "$*" | tee -a "$OUT/summary.txt"; }
source benchmarks/gpu/site.sh || exit 1
gpus=$(nvidia-smi --list-gpus | wc -l)
if [ "$gpus" -lt 2 ]; then
  summary "ft.sh: expected at least 2 GPUs, found $gpus"
  exit 1
fi
nvidia-smi topo -m > "$OUT/topology.txt"
repo=$PWD
cd /tmp || exit 1  # from outside the tree: `python -m commlayer` would otherwise import the tree's commlayer
if [[ " $BACKENDS " == *" peermem "* ]]; then
  # Build the peer-memory kernels once, before the members (each would otherwise build at its first
  # communicator, under a lock, inside the quorum's time).
  timeout -k 5 120 python3 -c 'import torch; from commlayer.backends.peermem.kernel_library import load_library as l; m, n = torch.cuda.get_device_capability(); l(f"sm_{m}{n}")' \
    > "$OUT/peermem_build.log" 2>&1 || summary "=== peermem kernels not built (NCCL serves every call): see peermem_build.log"
fi
set -- $BACKENDS
while [ $# -gt 0 ]; do
  backend=$1
  shift
  # What is left, shared between this backend and the ones after it.
  limit=$(((deadline - $(date +%s) - 10) / ($# + 1)))
  if [ "$limit" -lt 40 ]; then
    summary "=== $backend skipped: the deadline is near"
    continue
  fi
  mkdir -p "$OUT/$backend/runs"
  summary "=== $backend: $RUNS runs, $STEPS steps (at most ${limit}s)"
  rm -rf "/tmp/ft_runs_$backend"
  timeout -k 5 "$limit" python3 "$repo/benchmarks/faults/fault_injection.py" --runs "$RUNS" --second 0 --faults sigkill \
    --backend "$backend" --device cuda --steps "$STEPS" --step-time 0.2 --baseline-runs 1 --deadline 75 \
    --out "$OUT/$backend/fault_tolerance_gpu.json" --workdir "/tmp/ft_runs_$backend" > "$OUT/$backend/log.txt" 2>&1
  rc=$?
  grep -v '^{' "$OUT/$backend/log.txt" | tail -n 12 | tee -a "$OUT/summary.txt"
  [ "$rc" -ne 0 ] && summary "=== $backend ended with exit code $rc (124: its time limit; the JSON holds the runs done)"
  for run in "/tmp/ft_runs_$backend"/*/; do
    [ -d "$run" ] || continue
    name=$(basename "$run")
    mkdir -p "$OUT/$backend/runs/$name" && cp "$run/launcher.log" "$run/logs/ft_job.json" "$OUT/$backend/runs/$name/" 2>/dev/null
  done
done
true
