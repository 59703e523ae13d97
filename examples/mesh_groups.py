"""The device mesh: four ranks laid out 2 x 2, each dimension's group a real commlayer group.

Gradients averaged over "dp" reach the two ranks of a column, never the other column.

Run: commlayer run -n 4 examples/mesh_groups.py
"""

from __future__ import annotations

import torch

from commlayer import dist
from commlayer.mesh import init_mesh

dist.init_process_group()
rank = dist.get_rank()
grads = torch.full((4,), float(rank))

mesh = init_mesh((2, 2), ("dp", "sp"))  # 4 ranks, collective over the world
dist.all_reduce(grads, group=mesh["dp"].group)

column = [r for r in range(4) if r % 2 == rank % 2]  # row-major: "dp" runs down a column
assert torch.equal(grads, torch.full((4,), float(sum(column)))), grads
print(f"rank {rank}: coordinate {mesh.get_coordinate()}, dp group {column}, sum {grads[0].item()}")
dist.destroy_process_group()
