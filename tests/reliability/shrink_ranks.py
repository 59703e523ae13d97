"""Training goes on after a death: the survivors shrink the world and check every collective.

``python -m tests.reliability.shrink_ranks BACKEND`` forks the three ranks of a fresh world (no
launcher watching them). Rank 1 is SIGKILLed after a few exactly checked all_reduces; ranks 0
and 2 catch the PeerFailureError, call ``dist.shrink_group([failed_rank])`` and run exactly
checked collectives on the shrunk world (renumbered 0 and 1), a subgroup built after it, and
torch's DistributedDataParallel over the bridge rebuilt on the shrunk world, each step equal to a
one-process replay; then destroy it. One JSON line per survivor on stdout.
"""

from __future__ import annotations

import copy
import os
import signal
import sys
import time
from datetime import timedelta
from typing import Any

import torch
from torch import nn

from commlayer import dist
from commlayer.core.errors import PeerFailureError
from commlayer.core.ports import free_port
from tests.reliability.forked_worlds import run_forked

WORLD_SIZE = 3
VICTIM = 1


def run_rank(backend: str, rank: int, port: int) -> dict[str, Any]:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank))
    os.environ.update(WORLD_SIZE=str(WORLD_SIZE), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD_SIZE))
    dist.init_process_group(backend, timeout=timedelta(seconds=20))
    try:
        for step in range(10**9):
            if rank == VICTIM and step == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            _check_all_reduce(None, rank, WORLD_SIZE, step)
    except PeerFailureError as failure:
        failed = failure.failed_rank
    started = time.monotonic()
    world = dist.shrink_group([failed])
    record = {"rank": rank, "failed_rank": failed, "shrink_s": round(time.monotonic() - started, 3)}
    record.update(_check_shrunk_world(world))
    record["ddp_steps"] = _train_ddp_on(world)
    dist.destroy_process_group()
    return record


def _check_all_reduce(group: Any, rank: int, size: int, step: int) -> None:
    tensor = torch.arange(6, dtype=torch.float64) + 100 * rank + step
    dist.all_reduce(tensor, group=group)
    expected = (torch.arange(6, dtype=torch.float64) + step) * size + 100 * sum(range(size))
    assert torch.equal(tensor, expected), (tensor.tolist(), expected.tolist())


def _check_shrunk_world(world: Any) -> dict[str, Any]:
    rank, size = dist.get_rank(), dist.get_world_size()
    assert (size, dist.get_world_size(world), world.rank()) == (2, 2, rank), (size, world.rank(), rank)
    for step in range(5):
        _check_all_reduce(None, rank, size, step)
    tensor = torch.arange(4, dtype=torch.int32) + 10 * rank
    dist.broadcast(tensor, src=1)
    assert torch.equal(tensor, torch.arange(4, dtype=torch.int32) + 10), tensor
    gathered = torch.empty(8, dtype=torch.float32)
    dist.all_gather_into_tensor(gathered, torch.full((4,), float(rank + 1)))
    assert torch.equal(gathered, torch.tensor([1.0] * 4 + [2.0] * 4)), gathered
    work = dist.all_reduce(torch.ones(3) * (rank + 1), async_op=True)
    work.wait()
    dist.barrier()
    pair = dist.new_group([0, 1])
    _check_all_reduce(pair, rank, size, 7)
    return {"checked": True, "rank_after": rank, "size_after": size}


def _train_ddp_on(world: Any, steps: int = 3) -> int:
    """torch's DDP on the shrunk world's torch group; every step equals a local replay of all ranks."""
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).double()
    replay = copy.deepcopy(model)
    ddp = nn.parallel.DistributedDataParallel(model, process_group=world.torch_group)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    replay_optimizer = torch.optim.SGD(replay.parameters(), lr=0.1)
    for step in range(steps):
        ddp(_ddp_batch(step, rank)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        for contributor in range(size):  # DDP averages by dividing each rank's gradient first
            (replay(_ddp_batch(step, contributor)).square().mean() / size).backward()
        replay_optimizer.step()
        replay_optimizer.zero_grad()
        for trained, replayed in zip(model.parameters(), replay.parameters(), strict=True):
            assert torch.equal(trained, replayed), (step, (trained - replayed).abs().max().item())
    return steps


def _ddp_batch(step: int, rank: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(4, 8, generator=generator, dtype=torch.float64)


def main(backend: str) -> None:
    port = free_port()
    run_forked(WORLD_SIZE, lambda rank, out: run_rank(backend, rank, port))


if __name__ == "__main__":
    main(sys.argv[1])
