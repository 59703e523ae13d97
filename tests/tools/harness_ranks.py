"""Rank bodies for tests/tools/test_harness.py, run through commlayer.testing.run_world.

Arguments arrive as strings (``run_world(..., args=["1"])`` -> ``fn("1")``). Bodies that only test
process handling avoid importing torch, so that their worlds start in a fraction of a second.
"""

from __future__ import annotations

import os
import time

from commlayer.core.rendezvous import discover

FOREVER_SECONDS = 3600.0


def _rank() -> int:
    info = discover(os.environ)
    assert info is not None, "the harness started a rank without launcher variables"
    return info.rank


def check_environment(expected_world_size: str, *expected_args: str) -> None:
    """Under run_world's default backend: args, env and an initialised gloo commlayer.dist."""
    info = discover(os.environ)
    assert info is not None and info.world_size == int(expected_world_size), info
    assert os.environ["PYTHONUNBUFFERED"] == "1"
    assert os.environ["COMMLAYER_TEST_MARKER"] == "from-env-argument"
    assert expected_args == ("--flag", "two words"), expected_args
    _facade_collectives(info.rank)


def _facade_collectives(launcher_rank: int) -> None:
    import torch

    from commlayer import dist

    rank, size = dist.get_rank(), dist.get_world_size()
    assert (rank, dist.get_backend()) == (launcher_rank, "gloo")
    values = torch.tensor([rank + 1.0, 2.0**rank], dtype=torch.float64)
    dist.all_reduce(values)
    assert values.tolist() == [sum(range(1, size + 1)), float(2**size - 1)], values


def torch_collectives() -> None:
    """Raw torch.distributed (backend=None): every rank and element distinct, results exact."""
    import torch
    import torch.distributed as torch_dist

    torch_dist.init_process_group("gloo")
    rank, size = torch_dist.get_rank(), torch_dist.get_world_size()
    values = torch.arange(4, dtype=torch.int64) + 100 * rank
    torch_dist.all_reduce(values)
    expected = torch.arange(4, dtype=torch.int64) * size + 100 * sum(range(size))
    assert torch.equal(values, expected), (values, expected)
    gathered = [torch.empty(2, dtype=torch.int64) for _ in range(size)]
    torch_dist.all_gather(gathered, torch.tensor([rank, 10 * rank + 1]))
    assert [tensor.tolist() for tensor in gathered] == [[r, 10 * r + 1] for r in range(size)]
    torch_dist.destroy_process_group()


def raise_on(failing_rank: str) -> None:
    """The failing rank raises; the others block forever, as ranks stuck in a collective would."""
    if _rank() == int(failing_rank):
        raise ValueError(f"deliberate failure on rank {failing_rank}")
    time.sleep(FOREVER_SECONDS)


def sleep_on(sleeping_rank: str) -> None:
    if _rank() == int(sleeping_rank):
        time.sleep(FOREVER_SECONDS)


def hard_exit_on(dying_rank: str, code: str) -> None:
    """os._exit skips every Python handler: no traceback, no done marker, just an exit code."""
    if _rank() == int(dying_rank):
        os._exit(int(code))
    time.sleep(FOREVER_SECONDS)


def mpi_world() -> None:
    """Under mpirun with the default backend: mpi4py's world is the launcher's world (same rank and
    size) and the gloo facade, whose master address went over MPI, agrees; all sums exact."""
    from mpi4py import MPI

    info = discover(os.environ)
    world = MPI.COMM_WORLD
    assert (world.Get_rank(), world.Get_size()) == (info.rank, info.world_size), (
        world.Get_rank(),
        world.Get_size(),
        info,
    )
    total = world.allreduce(1000 + world.Get_rank(), op=MPI.SUM)
    assert total == 1000 * world.Get_size() + sum(range(world.Get_size())), total
    gathered = world.allgather(f"rank{world.Get_rank()}")
    assert gathered == [f"rank{r}" for r in range(world.Get_size())], gathered
    _facade_collectives(info.rank)
