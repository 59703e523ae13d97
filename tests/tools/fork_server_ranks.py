"""Rank bodies for tests/tools/test_fork_server.py: what a rank forked by the fork server sees."""

from __future__ import annotations

import os
import random
import sys
import time

from commlayer import dist
from commlayer.core import settings


def own_process_state(expected_cwd: str, marker_variable: str) -> None:
    """Each rank has its own environment, cwd, stand-in and random seed, as a fresh process would."""
    rank, world = dist.get_rank(), dist.get_world_size()
    assert os.environ["RANK"] == str(rank) and os.environ[marker_variable] == "set", rank
    assert os.getcwd() == expected_cwd, (rank, os.getcwd())
    stand_in = settings.TESTING_SUPERVISED_PID.value()
    assert stand_in is not None and stand_in != os.getpid(), (rank, stand_in)
    assert sys.path[0] == expected_cwd, (rank, sys.path[:3])
    draws: list[object] = [None] * world
    dist.all_gather_object(draws, (os.getpid(), stand_in, random.random()))
    for position in range(3):
        assert len({draw[position] for draw in draws}) == world, (position, draws)  # type: ignore[index]
    print(f"rank {rank} says hello", flush=True)


def report_pid_then_sleep() -> None:
    """Print this rank's pid, then sleep until killed."""
    print(os.getpid(), flush=True)
    time.sleep(600)
