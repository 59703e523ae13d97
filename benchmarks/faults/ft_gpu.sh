# Fault-tolerant data parallel on NCCL, through the launcher: `commlayer run --ft` on a
# 2 replicas x 2 shards ZeRO-2 job of commlayer.testing.ft_member, one SIGKILL per run.
#
# Run, from the repository root on a machine with 2 or 4 GPUs (torch with CUDA, no network needed):
#
#   bash benchmarks/faults/ft_gpu.sh            # 3 runs + 1 fault-free run, about 3 minutes
#   bash benchmarks/faults/ft_gpu.sh RUNS STEPS
#
# With 4 GPUs each member has its own; with 2, members 0 and 3 share GPU 0 and members 1 and 2
# GPU 1, so that no NCCL communicator holds two ranks of one GPU (a replica's shard group and a
# shard's replica group each span both GPUs). What lands in $OUT:
#
#   fault_tolerance_gpu.json   per run: exit code, max deviation from the replay, time lost per
#                              failure, and the replacement's rejoin broken down (CUDA context,
#                              start-up, quorum, communicators = NCCL init, state transfer)
#   summary.txt                the benchmark's summary lines (also printed)
#   topology.txt, machine.txt  nvidia-smi topo -m; GPUs, driver, torch
#   runs/                      each run's launcher log and ft_job.json
#
# What to look for in summary.txt: "3/3 finished with the right parameters, 0 hung"; the median
# time lost per failure against "one step" (goal: <= 1.0 s + one step); the replacement's rejoin
# lines. In the JSON, each run's "survivors" list every generation a never-killed member entered:
# after the kill its shard group is kept ("kept": 1, communicators_s ~0), and at the rejoin it
# builds one NCCL communicator (its replica group).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
# The Manager decides about a lost peer and aborts the communicators itself: torch's watchdog
# neither ends the process nor dumps while the Manager recovers.
export TORCH_NCCL_ASYNC_ERROR_HANDLING=0 TORCH_NCCL_DUMP_ON_TIMEOUT=0 TORCH_NCCL_ENABLE_MONITORING=0
export TORCH_FR_BUFFER_SIZE=0
export SITE=/tmp/ft_site
source benchmarks/gpu/site.sh || exit 1
gpus=$(nvidia-smi --list-gpus | wc -l)
if [ "$gpus" -lt 2 ]; then
  echo "ft_gpu.sh: expected at least 2 GPUs, found $gpus" >&2
  exit 1
fi
nvidia-smi topo -m > "$OUT/topology.txt"
# From outside the tree: `python -m commlayer` would otherwise import the tree's commlayer.
repo=$PWD
rm -rf /tmp/ft_runs
cd /tmp && python3 "$repo/benchmarks/faults/fault_injection.py" --runs "${1:-3}" --second 0 --faults sigkill \
  --backend nccl --device cuda --steps "${2:-70}" --step-time 0.2 --baseline-runs 1 --deadline 240 \
  --out "$OUT/fault_tolerance_gpu.json" --workdir /tmp/ft_runs 2>&1 | tee "$OUT/ft_gpu.log" \
  | grep -v '^{' | tee "$OUT/summary.txt"
mkdir -p "$OUT/runs"
for run in /tmp/ft_runs/*/; do
  name=$(basename "$run")
  mkdir -p "$OUT/runs/$name" && cp "$run/launcher.log" "$run/logs/ft_job.json" "$OUT/runs/$name/" 2>/dev/null
done
true
