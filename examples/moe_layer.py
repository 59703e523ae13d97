"""An expert-parallel mixture of experts: eight experts spread over pairs of ranks.

Each token goes to its top two experts (with a capacity), wherever they live; one all-to-all takes
the tokens there and one brings them back. The layer trains like any module.

Run: commlayer run -n 4 examples/moe_layer.py
"""

from __future__ import annotations

import torch
from torch import nn

from commlayer import dist
from commlayer.mesh import init_mesh
from commlayer.parallel import GateOptions, MoE

dist.init_process_group()
torch.manual_seed(dist.get_rank())
width = 16
expert_module = nn.Sequential(nn.Linear(width, 32), nn.GELU(), nn.Linear(32, width))
x = torch.randn(2, 8, width)

mesh = init_mesh((4,), ("dp",), expert_parallel_size=2)
moe = MoE(width, expert_module, num_experts=8, mesh=mesh, options=GateOptions(k=2, capacity_factor=1.25))
out, aux_loss, load = moe(x)  # top-k routing, capacity, dropping, all-to-all over "ep"

(out.square().mean() + aux_loss).backward()
assert out.shape == x.shape and torch.isfinite(out).all()
print(
    f"rank {dist.get_rank()}: output {tuple(out.shape)}, aux loss {aux_loss.item():.4f}, load {load.tolist()}"
)
dist.destroy_process_group()
