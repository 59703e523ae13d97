"""A job in which rank 1 dies while the others sit in collectives; mpirun must end it with an error.

Started by mpirun directly, not through the harness worker (which catches exceptions itself)::

    mpirun -n 2 python -m tests.backends.mpi_death_ranks raise mpi    # rank 1 raises an uncaught exception
    mpirun -n 2 python -m tests.backends.mpi_death_ranks raise gloo   # same, gloo rendezvoused over MPI
    mpirun -n 2 python -m tests.backends.mpi_death_ranks kill mpi     # rank 1 is SIGKILLed

Rank 0 loops on all_reduce forever: only the launcher ending the job stops it.
"""

from __future__ import annotations

import os
import signal
import sys

import torch

from commlayer import dist

FAILURE_TEXT = "rank 1 fails on purpose"


def main(mode: str, backend: str) -> None:
    dist.init_process_group(backend)
    assert dist.get_backend() == backend, dist.get_backend()
    tensor = torch.ones(4)
    dist.all_reduce(tensor)
    if dist.get_rank() == 1:
        if mode == "raise":
            raise RuntimeError(FAILURE_TEXT)
        os.kill(os.getpid(), signal.SIGKILL)
    while True:
        dist.all_reduce(tensor)


if __name__ == "__main__":
    main(*sys.argv[1:3])
