# peermem on one host's GPUs: correctness, graphs and timings on 4 then 2 GPUs, the small all_reduce
# anchor beside it, and the fullgraph-compile checks on the default backend. Results land in $OUT.
#   bash benchmarks/gpu/peermem.sh [--tp]      (anchors/ holds shared/anchors)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export COMMLAYER_PEERMEM_CACHE=/tmp/peermem_cache
export SITE=/tmp/peermem_site
source benchmarks/gpu/site.sh || exit 1
source benchmarks/gpu/build.sh && build_c_fast_paths . "$SITE" || echo "=== C fast paths not built"
nvidia-smi topo -m | tee "$OUT/topology.txt"
start=$(date +%s)
(cd /tmp && python3 -c 'import torch; from commlayer.backends.peermem.kernel_library import load_library as l; m, n = torch.cuda.get_device_capability(); l(f"sm_{m}{n}")') || exit 1
echo "=== kernels built in $(( $(date +%s) - start )) s"
for devices in 0,1,2,3 0,1; do
  n=$(( ${#devices} / 2 + 1 ))
  CUDA_VISIBLE_DEVICES=$devices timeout 220 python3 -m torch.distributed.run --standalone --nproc-per-node "$n" \
    benchmarks/gpu/peermem.py --out "$OUT" "$@" 2>&1 | tee "$OUT/peermem_w$n.log"
  if [ -f anchors/small_allreduce_anchor.py ]; then
    CUDA_VISIBLE_DEVICES=$devices timeout 60 python3 -m torch.distributed.run --standalone --nproc-per-node "$n" \
      anchors/small_allreduce_anchor.py 2>&1 | grep -v '^{' | tee "$OUT/anchor_w$n.log"
  fi
done
