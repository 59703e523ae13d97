# The compile checks on 2 GPUs: fullgraph compile on nccl, CUDA-graph capture of dist.all_reduce.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0,1}
SITE=/tmp/h09_site source benchmarks/gpu/site.sh || exit 1
timeout 400 python3 -m torch.distributed.run --nproc-per-node 2 benchmarks/gpu/compile.py "$OUT/compile_gpu.json" 2>&1 | tee "$OUT/compile_gpu.log"
