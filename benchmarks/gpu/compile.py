"""On 2 GPUs: commlayer.dist collectives under torch.compile(fullgraph=True) on nccl, and
CUDA-graph capture of ``dist.all_reduce`` (replay against eager time per op).

    torchrun --nproc-per-node 2 benchmarks/gpu/compile.py "$OUT/compile_gpu.json"

Every rank contributes distinct values; results are checked exactly against the eager facade.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

from commlayer import dist

ITERATIONS = 1000


def _compiled_step(x: torch.Tensor) -> torch.Tensor:
    size = dist.get_world_size()
    y = x * 2
    dist.all_reduce(y)
    gathered = torch.empty(size * y.numel(), device=y.device)
    dist.all_gather_into_tensor(gathered, y)
    shard = torch.empty(gathered.numel() // size, device=y.device)
    dist.reduce_scatter_tensor(shard, gathered)
    dist.broadcast(shard, src=1)
    return shard + 1


def check_compile(device: torch.device) -> dict[str, object]:
    x = torch.arange(8.0, device=device) + 100 * dist.get_rank()
    eager = _compiled_step(x.clone())
    started = time.perf_counter()
    compiled = torch.compile(_compiled_step, fullgraph=True)(x.clone())
    compile_s = time.perf_counter() - started
    assert torch.equal(compiled, eager), f"compiled {compiled} != eager {eager}"
    return {
        "fullgraph_compile": "pass",
        "compile_s": round(compile_s, 1),
        "result_head": compiled[:4].tolist(),
    }


def check_cuda_graph(device: torch.device) -> dict[str, object]:
    rank, size = dist.get_rank(), dist.get_world_size()
    tensor = torch.full((1024,), float(rank + 1), device=device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            dist.all_reduce(tensor)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_reduce(tensor)
    expected = torch.full((1024,), float(size * (size + 1) // 2), device=device)
    tensor.fill_(rank + 1)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(tensor, expected), f"replayed all_reduce gave {tensor[:4]}"
    return {
        "cuda_graph_capture": "pass",
        "replay_us": _per_op_us(graph.replay),
        "eager_us": _per_op_us(lambda: dist.all_reduce(tensor)),
    }


def _per_op_us(run: object) -> float:
    for _ in range(20):
        run()  # type: ignore[operator]
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(ITERATIONS):
        run()  # type: ignore[operator]
    torch.cuda.synchronize()
    return round((time.perf_counter() - started) / ITERATIONS * 1e6, 2)


def main() -> None:
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group()  # cpu:gloo,cuda:nccl
    device = torch.device("cuda", local_rank)
    results = {"backend": dist.get_backend(), "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}
    results.update(check_compile(device))
    results.update(check_cuda_graph(device))
    print(f"rank {dist.get_rank()}: {json.dumps(results)}", flush=True)
    if dist.get_rank() == 0 and len(sys.argv) > 1:
        with open(sys.argv[1], "w") as handle:
            json.dump(results, handle, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
