"""Fault-tolerant data parallel: two replicas of two ZeRO-2 shards commit every step through the store.

Should a member die, the survivors retry the step on the complete replicas left and a replacement
catches up from a peer (docs/guides/fault-tolerance.md); here all four finish, and the two
replicas end with the same parameters.

Run: commlayer run -n 4 examples/fault_tolerant_training.py
"""

from __future__ import annotations

import os

import torch
import torch.distributed as torch_dist

from commlayer.ft import FaultToleranceOptions, FaultTolerantDataParallel, Manager

rank, steps = int(os.environ["RANK"]), 5
# A store that outlives any member: the launcher's rendezvous address, hosted here by rank 0.
store = torch_dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=rank == 0)
replica, shard = divmod(rank, 2)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def loss_of(module: torch.nn.Module, step: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(step * 100 + rank)
    x, y = torch.randn(4, 8, generator=generator), torch.randn(4, 4, generator=generator)
    return torch.nn.functional.mse_loss(module(x), y)


options = FaultToleranceOptions(replicas=2, shards=2, backend="gloo")
manager = Manager(store, member=replica * 2 + shard, options=options, sharded=True)
engine = FaultTolerantDataParallel(model, lambda params: torch.optim.AdamW(params), manager, stage=2)
while engine.step < steps:
    engine.train_step(lambda module, step: loss_of(module, step))  # retried after a failure
manager.finish()

flat = torch.cat([p.detach().reshape(-1) for p in engine.params])
store.set(f"example/params/{rank}", str(flat.sum().item()))
twin = store.get(f"example/params/{(rank + 2) % 4}").decode()  # the same shard of the other replica
assert twin == str(flat.sum().item()), (twin, flat.sum().item())
print(f"member {rank} (replica {replica}, shard {shard}): {engine.step} steps, same shard as its twin")
store.set(f"example/read/{rank}", "1")
if rank == 0:  # the store's host serves until every member has read
    store.wait([f"example/read/{r}" for r in range(4)])
