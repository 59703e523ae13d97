# Fault-tolerant data parallel on NCCL: the fault-injection benchmark's 2 replicas x 2 shards job,
# one member per GPU (4 GPUs), one kill per run; results land in $OUT, the members' logs in
# /tmp/ft_members.
#   bash benchmarks/faults/ft_gpu.sh [RUNS] [FAULT_FREE_RUNS] [STEPS]
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
# The Manager decides about a lost peer and aborts the communicators itself: torch's watchdog
# neither ends the process nor dumps while the Manager recovers.
export TORCH_NCCL_ASYNC_ERROR_HANDLING=0 TORCH_NCCL_DUMP_ON_TIMEOUT=0 TORCH_NCCL_ENABLE_MONITORING=0
export TORCH_FR_BUFFER_SIZE=0
export SITE=/tmp/ft_site
source benchmarks/gpu/site.sh || exit 1
nvidia-smi topo -m | tee "$OUT/topology.txt"
# From outside the tree: members start with ``python -m``, which would import the tree's commlayer.
repo=$PWD
cd /tmp && python3 "$repo/benchmarks/faults/fault_injection.py" --runs "${1:-10}" --second 0 --backend nccl --device cuda \
  --steps "${3:-70}" --step-time 0.2 --baseline-runs "${2:-2}" --deadline 120 \
  --out "$OUT/fault_tolerance_gpu.json" --workdir /tmp/ft_members 2>&1 | tee "$OUT/ft_gpu.log"
