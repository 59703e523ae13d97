"""torch's DDP and FSDP2 on an MPI group: the bridge gives every commlayer group a torch ProcessGroup.

DDP takes the world's ``torch_group``; FSDP2 takes torch's DeviceMesh, built on the same groups
by ``dist.init_device_mesh`` or from commlayer's own mesh. One training step each; every rank
ends with the same DDP weights.

Run: mpirun -n 2 python examples/torch_bridge.py
"""

from __future__ import annotations

import torch
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

import commlayer
from commlayer import dist


def step(module: torch.nn.Module) -> None:
    torch.manual_seed(dist.get_rank())  # each rank its own batch
    module(torch.randn(4, 8)).square().mean().backward()
    torch.optim.SGD(module.parameters(), lr=0.1).step()


dist.init_process_group("mpi")
torch.manual_seed(0)
model, sharded = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

ddp = DistributedDataParallel(model, process_group=dist.group.WORLD.torch_group)
mesh = dist.init_device_mesh("cpu", (dist.get_world_size(),))  # torch's DeviceMesh, on mpi
fully_shard(sharded, mesh=mesh)
device_mesh = commlayer.mesh.init_mesh((dist.get_world_size(),), ("dp",)).to_device_mesh("cpu")
step(ddp)
step(sharded)

weights = model.weight.detach().clone()
everyone = [torch.empty_like(weights) for _ in range(dist.get_world_size())]
dist.all_gather(everyone, weights)
assert all(torch.equal(weights, other) for other in everyone), "DDP replicas diverged"
print(f"rank {dist.get_rank()}: DDP and FSDP2 stepped on {dist.get_backend()}; mesh {device_mesh}")
dist.destroy_process_group()
