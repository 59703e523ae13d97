"""Uneven collectives: every rank contributes a part of its own size, and every rank knows them all.

``all_gather_v`` gathers parts of different sizes, ``reduce_scatter_v`` hands rank r the reduction
of everyone's part r; the sizes are agreed across the group before any data moves.

Run: commlayer run -n 3 examples/uneven_collectives.py
"""

from __future__ import annotations

import torch

from commlayer import dist

dist.init_process_group()
rank, world = dist.get_rank(), dist.get_world_size()
sizes = [r + 1 for r in range(world)]  # sizes[r]: rank r's element count

out = [torch.empty(n) for n in sizes]
dist.all_gather_v(out, torch.full((sizes[rank],), float(rank)))
mine = torch.empty(sizes[rank])
dist.reduce_scatter_v(mine, [torch.ones(n) for n in sizes])

assert all(torch.equal(part, torch.full((n,), float(r))) for r, (part, n) in enumerate(zip(out, sizes)))
assert torch.equal(mine, torch.full((sizes[rank],), float(world)))
print(f"rank {rank}: gathered {[part.tolist() for part in out]}, reduced {mine.tolist()}")
dist.destroy_process_group()
