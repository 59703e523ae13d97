"""The smallest commlayer program: every rank contributes, every rank checks the exact sum.

Written exactly as for torch.distributed; only the import differs. Run it with any launcher::

    commlayer run -n 4 examples/allreduce.py
    torchrun --nproc-per-node 4 examples/allreduce.py
    mpirun -n 4 python examples/allreduce.py                     # gloo, rendezvous over MPI
    COMMLAYER_BACKEND=mpi mpirun -n 4 python examples/allreduce.py

Run: commlayer run -n 4 examples/allreduce.py
Run: COMMLAYER_BACKEND=gloo commlayer run -n 2 examples/allreduce.py
Run: COMMLAYER_BACKEND=ccl commlayer run -n 2 examples/allreduce.py
Run: COMMLAYER_BACKEND=mpi mpirun -n 2 python examples/allreduce.py
"""

from __future__ import annotations

import os

import torch

from commlayer import dist  # instead of: import torch.distributed as dist


def main() -> None:
    dist.init_process_group()  # backend from the accelerator, or $COMMLAYER_BACKEND
    rank, world = dist.get_rank(), dist.get_world_size()
    device = _device()
    tensor = torch.arange(4, dtype=torch.float32, device=device) + 100 * rank
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    expected = torch.arange(4, dtype=torch.float32) * world + 100 * sum(range(world))
    assert torch.equal(tensor.cpu(), expected), f"rank {rank}: {tensor.tolist()} != {expected.tolist()}"
    print(f"rank {rank}/{world} on {dist.get_backend()}: all_reduce -> {tensor.tolist()} (correct)")
    dist.destroy_process_group()


def _device() -> torch.device:
    backend = dist.get_backend()
    if ("nccl" in backend or "peermem" in backend) and torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


if __name__ == "__main__":
    main()
