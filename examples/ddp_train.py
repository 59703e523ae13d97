"""DistributedDataParallel on a commlayer group.

A commlayer group built on gloo or nccl exposes the torch ProcessGroup behind it, so DDP (and
FSDP) accept it directly. Each rank trains on its own shard of a synthetic regression problem; at
the end every rank holds identical weights and the loss has dropped::

    commlayer run -n 2 examples/ddp_train.py

Run: commlayer run -n 2 examples/ddp_train.py
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from commlayer import dist

STEPS = 50


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.new_group()  # all ranks; a commlayer ProcessGroup
    torch.manual_seed(0)  # same initial weights everywhere (DDP also broadcasts them)
    model = DistributedDataParallel(nn.Linear(8, 1), process_group=group.torch_group)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    inputs, targets = _shard(rank)
    first = last = 0.0
    for step in range(STEPS):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(inputs), targets)
        loss.backward()  # DDP all-reduces gradients over the commlayer group
        optimizer.step()
        first, last = (loss.item(), last) if step == 0 else (first, loss.item())
    checksum = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    replicas = [torch.zeros_like(checksum) for _ in range(world)]
    dist.all_gather(replicas, checksum, group=group)
    assert all(torch.equal(replica, checksum) for replica in replicas), "replicas diverged"
    assert last < first, f"loss did not drop: {first:.4f} -> {last:.4f}"
    print(f"rank {rank}: loss {first:.4f} -> {last:.4f}, replicas identical across {world} ranks")
    dist.destroy_process_group()


def _shard(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + rank)
    inputs = torch.randn(64, 8, generator=generator)
    true_weights = torch.arange(8, dtype=torch.float32).unsqueeze(1) / 8
    return inputs, inputs @ true_weights + 0.5


if __name__ == "__main__":
    main()
