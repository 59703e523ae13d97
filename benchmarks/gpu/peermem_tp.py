"""Tensor-parallel decode: commlayer.parallel.TensorParallelBlock on the default backend against NCCL.

    torchrun --standalone --nproc-per-node N benchmarks/gpu/peermem_tp.py --out DIR

A stack of Llama-style blocks (bf16; hidden 4096: 8 layers, intermediate 14336, 32 heads, 8 kv
heads; hidden 8192: 4 layers, 28672, 64, 8), one decode step of batch 1-16, timed eager and as a
CUDA graph, on three groups over the same GPUs and weights:
  - fused: the default backend (cpu:gloo,cuda:peermem), whose fused all-reduce + residual +
    RMSNorm kernel serves both all-reduces of each block;
  - unfused: the same backend with the fused kernel off (its all_reduce, then torch's ops);
  - nccl: a cpu:gloo,cuda:nccl group (NCCL's all_reduce, then torch's ops): the reference.
Checks first that the fused step's output is bitwise equal on every rank and within bf16 rounding
of the nccl step's. Rank 0 writes DIR/tp_decode_w{N}.json and prints tokens/s ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta

import torch
import torch.distributed as torch_dist
import torch.nn.functional as F
from graph_timing import captured, timed

from commlayer import dist
from commlayer.parallel import TensorParallelBlock

SHAPES = {4096: (8, 14336, 32, 8), 8192: (4, 28672, 64, 8)}
BATCHES = (1, 2, 4, 8, 16)


def step_fn(blocks, final_norm: torch.Tensor, x: torch.Tensor, group):
    def step() -> torch.Tensor:
        partial, residual = None, x
        for block in blocks:
            block.group = group
            partial, residual = block(partial, residual)
        reduced = partial.clone()
        dist.all_reduce(reduced, group=group)
        return F.rms_norm(residual + reduced, (x.shape[-1],), final_norm, 1e-6)

    return step


def measure(step, backend) -> tuple[float, float]:
    for _ in range(3):
        step()
    eager = min(timed(step, 20) for _ in range(3))
    graph = captured(step, 1, backend)
    graph.replay()
    in_graph = min(timed(graph.replay, 50) for _ in range(5))
    del graph
    return eager, in_graph


def agree(output: torch.Tensor, reference: torch.Tensor, world: int) -> dict:
    """Bitwise equal on every rank, and how far from the reference step."""
    gathered = [torch.empty_like(output) for _ in range(world)]
    torch_dist.all_gather(gathered, output)
    same = all(bool((g.view(torch.int16) == output.view(torch.int16)).all()) for g in gathered)
    diff = (output.float() - reference.float()).abs().max().item()
    return {"bitwise_equal_on_ranks": same, "max_abs_diff_vs_nccl": round(diff, 4)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.add_argument("--hidden", type=int, nargs="*", default=list(SHAPES))
    args = parser.parse_args()
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    # A kernel whose peer never comes gives up after a minute (CommTimeoutError), not half an hour.
    dist.init_process_group(timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    ranks = list(range(world))
    groups = {"fused": dist.group.WORLD, "nccl": dist.new_group(ranks, backend="cpu:gloo,cuda:nccl")}
    backend = dist.group.WORLD.backend_for("cuda")
    comm = backend.peer_comm
    rows = []
    for hidden in args.hidden:
        layers, inter, heads, kv = SHAPES[hidden]
        torch.manual_seed(1 + rank)
        make = {"device": device, "dtype": torch.bfloat16}
        blocks = [TensorParallelBlock(hidden, inter, heads, kv, **make) for _ in range(layers)]
        for param in (param for block in blocks for param in block.parameters()):
            if param.dim() > 1:
                param.data.normal_(0, 0.02)
            else:
                param.data.uniform_(0.5, 1.5)
        final_norm = torch.ones(hidden, **make)
        for batch in BATCHES:
            torch.manual_seed(100 + batch)  # the same activations on every rank
            x = torch.randn(batch, hidden, **make)
            with torch.no_grad():
                checked = agree(step_fn(blocks, final_norm, x, groups["fused"])(),
                                step_fn(blocks, final_norm, x, groups["nccl"])(), world)  # fmt: skip
                for name in ("fused", "unfused", "nccl"):
                    group = groups["nccl" if name == "nccl" else "fused"]
                    fused_norm = comm.fused_norm
                    if name == "unfused":
                        comm.fused_norm = lambda *a: False
                    eager, graph = measure(
                        step_fn(blocks, final_norm, x, group), backend if name != "nccl" else None
                    )
                    comm.fused_norm = fused_norm
                    rows.append({"hidden": hidden, "layers": layers, "batch": batch, "method": name,
                                 "eager_us": round(eager, 2), "graph_us": round(graph, 2), **checked})  # fmt: skip
            if rank == 0:
                print(json.dumps(rows[-3:]), flush=True)
        del blocks
        torch.cuda.empty_cache()
    if rank == 0:
        report = {"world": world, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                  "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows}  # fmt: skip
        with open(os.path.join(args.out, f"tp_decode_w{world}.json"), "w") as f:
            json.dump(report, f, indent=1)
        print(f"# TP decode, world {world}: tokens/s over nccl (graph / eager)")
        for hidden in args.hidden:
            for batch in BATCHES:
                cell = {r["method"]: r for r in rows if r["hidden"] == hidden and r["batch"] == batch}
                ratio = [
                    cell["nccl"][k] / cell[m][k]
                    for m in ("fused", "unfused")
                    for k in ("graph_us", "eager_us")
                ]
                print(f"hidden {hidden} batch {batch:2d}: fused {ratio[0]:.3f} / {ratio[1]:.3f}, "
                      f"unfused {ratio[2]:.3f} / {ratio[3]:.3f}, graph us nccl {cell['nccl']['graph_us']}")  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
