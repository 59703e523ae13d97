"""Rank body for the third-party plugin test: the store-based backend does real work."""

from __future__ import annotations

import torch

import commlayer
from commlayer import dist


def main() -> None:
    rows = {info.name: info for info in commlayer.list_backends()}
    assert rows["storecomm"].origin == "commlayer_storecomm:StoreBackend", rows["storecomm"]
    assert dist.get_backend() == "storecomm"
    rank, world = dist.get_rank(), dist.get_world_size()
    tensor = torch.arange(3, dtype=torch.float64) + 10 * rank
    dist.all_reduce(tensor)
    assert torch.equal(tensor, torch.arange(3, dtype=torch.float64) * world + 10 * sum(range(world))), tensor
    # Ops the plugin never implemented come from commlayer's generic fallbacks.
    output = torch.zeros(2, dtype=torch.int64)
    dist.reduce_scatter_tensor(output, torch.arange(2 * world, dtype=torch.int64) * (rank + 1))
    scale = sum(r + 1 for r in range(world))
    assert torch.equal(output, torch.arange(2 * rank, 2 * rank + 2) * scale), output
    received = torch.zeros(world, dtype=torch.float32)
    dist.all_to_all_single(received, torch.full((world,), float(rank)))
    assert torch.equal(received, torch.arange(world, dtype=torch.float32)), received
    objects = [None] * world
    dist.all_gather_object(objects, f"rank{rank}")
    assert objects == [f"rank{r}" for r in range(world)], objects
