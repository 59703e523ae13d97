"""An unmodified torch HSDP script on commlayer: torch's own init, mesh and fully_shard, every group
on the backend $COMMLAYER_BACKEND names (here MPI).

Run: COMMLAYER_BACKEND=mpi MASTER_ADDR=127.0.0.1 MASTER_PORT=29513 mpirun -n 4 python examples/torch_hsdp.py
"""

import torch
from torch.distributed.fsdp import fully_shard

model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))

torch.distributed.init_process_group("commlayer")  # COMMLAYER_BACKEND=mpi, under mpirun
mesh = torch.distributed.init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
fully_shard(model, mesh=mesh)  # HSDP, every group on MPI

torch.manual_seed(torch.distributed.get_rank())
model(torch.randn(4, 8)).square().mean().backward()
torch.optim.SGD(model.parameters(), lr=0.1).step()
print(f"rank {torch.distributed.get_rank()}: one HSDP step on {torch.distributed.get_backend()}")
torch.distributed.destroy_process_group()
