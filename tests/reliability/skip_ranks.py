"""A rank that skips a collective: do the others name it?

``python -m tests.reliability.skip_ranks BACKEND [OP]`` forks a fresh 3-rank world (3 s group
timeout); ``mpirun -n 3 python -m tests.reliability.skip_ranks mpi OP OUT_DIR`` is one rank of an
mpi world, writing its record to OUT_DIR. After four exactly checked all_reduces rank 2 skips OP (all_reduce or barrier) and
waits; ranks 0 and 1 time out in it and record their error; every rank stays until both have. One JSON line per waiting rank
on stdout.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from commlayer import dist
from commlayer.core.ports import free_port
from tests.reliability.forked_worlds import run_forked, write_record

WORLD_SIZE = 3
SKIPPER = 2


def run_rank(backend: str, op: str, rank: int, port: int, out: Path) -> dict[str, Any] | None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank))
    os.environ.update(WORLD_SIZE=str(WORLD_SIZE), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD_SIZE))
    _skip_in_world(backend, op, out)
    return None


def _skip_in_world(backend: str, op: str, out: Path) -> None:
    dist.init_process_group(backend, timeout=timedelta(seconds=3))
    rank = dist.get_rank()
    for step in range(4):
        tensor = torch.full((4,), float(rank + step))
        dist.all_reduce(tensor)
        assert torch.equal(tensor, torch.full((4,), float(3 * step + 3))), tensor
    if rank != SKIPPER:
        try:
            if op == "barrier":
                dist.barrier()
            else:
                dist.all_reduce(torch.ones(4))
            record = {"rank": rank, "outcome": "returned"}
        except Exception as error:  # noqa: BLE001 - the record is what the test checks
            bases = [kind.__name__ for kind in type(error).__mro__]
            record = {"rank": rank, "outcome": "error", "type": type(error).__name__, "bases": bases}
            record["message"] = str(error)
        write_record(out, record)
    # Every rank stays (the store's host included) until the waiting ones have recorded.
    deadline = time.monotonic() + 60
    while not all((out / f"rank{peer}.json").exists() for peer in range(SKIPPER)):
        assert time.monotonic() < deadline, "the other ranks never recorded their outcome"
        time.sleep(0.05)


def _rank(backend: str, op: str, port: int, rank: int, out: Path) -> None:
    if run_rank(backend, op, rank, port, out) is None:
        dist.destroy_process_group()


def main(backend: str, op: str) -> None:
    run_forked(WORLD_SIZE, functools.partial(_rank, backend, op, free_port()))


def under_mpirun(op: str, out: Path) -> None:
    """One rank of a world mpirun started: the records go to ``out``, read by the test itself.

    A survivor then ends the job with MPI_Abort at exit (its abandoned op keeps MPI_Finalize from
    returning), so only the records show that it caught its error first."""
    _skip_in_world("mpi", op, out)


if __name__ == "__main__":
    if sys.argv[1] == "mpi":
        under_mpirun(sys.argv[2], Path(sys.argv[3]))
    else:
        main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "all_reduce")
