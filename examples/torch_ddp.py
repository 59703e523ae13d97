"""A plain torch DDP script: nothing here mentions commlayer except the backend's name.

Run: COMMLAYER_BACKEND=mpi MASTER_ADDR=127.0.0.1 MASTER_PORT=29512 mpirun -n 3 python examples/torch_ddp.py

torch finds the "commlayer" backend through the entry point commlayer installs; commlayer picks its
backend as ``commlayer.dist.init_process_group(backend=None)`` does ($COMMLAYER_BACKEND here).
"""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    dist.init_process_group("commlayer")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(5):
        inputs = torch.randn(4, 8, generator=torch.Generator().manual_seed(step * world_size + rank))
        loss = model(inputs).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world_size)]
    dist.all_gather(gathered, flat)
    assert all(torch.equal(flat, other) for other in gathered), "replicas diverged"
    print(
        f"rank {rank}/{world_size} on {dist.group.WORLD!r}: replicas identical after 5 steps",
        flush=True,
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
