"""The compatibility suite on CUDA tensors over the mpi backend (GPU machine only).

Whether the MPI library is CUDA-aware decides the path: device pointers handed to MPI, or tensors
staged through host memory (logged once). Force each path with COMMLAYER_MPI_CUDA_AWARE=1 / 0::

    COMMLAYER_MPI_CUDA_AWARE=0 mpirun -n 2 python -m commlayer.testing.worker --backend mpi tests.backends.mpi_cuda_ranks:main

(under the harness: ``run_world("tests.backends.mpi_cuda_ranks:main", 2, backend="mpi", launcher="mpirun")``).
Group layout as in :mod:`commlayer.testing.conformance`: world of 2 uses [0, 1] in a new group, larger worlds
use [1, ..., n-1], leaving global rank 0 outside.
"""

from __future__ import annotations

import os

import torch

from commlayer import dist
from commlayer.core.rendezvous import discover
from commlayer.testing.conformance import run_suite


def main() -> None:
    info = discover(os.environ)
    assert info is not None and torch.cuda.is_available(), "needs a GPU per local rank and a launcher"
    torch.cuda.set_device(info.local_rank % torch.cuda.device_count())
    device = torch.device("cuda", torch.cuda.current_device())
    me = dist.get_rank()
    backend = dist.group.WORLD.backend_for("cuda")
    assert backend is not None and backend.name == "mpi", backend
    failures = run_suite(backend=backend, device=device).failures()
    assert not failures, "\n".join(f"{v.cell.label}: {v.detail}" for v in failures)
    mode = "CUDA-aware" if backend._cuda_aware else "staged through host memory"
    print(f"rank {me}: compatibility suite on CUDA tensors passed ({mode}; {backend.library})", flush=True)
