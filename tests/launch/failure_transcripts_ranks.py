"""Rank programs of the failure transcripts: ``commlayer run -n N THIS_FILE SCENARIO``.

``typo``: every rank mistypes a ReduceOp after init. ``timeout``: rank 1 computes past the group
timeout (3 s) and skips an all_reduce the others wait in. ``dead-peer``: rank 1 exits abruptly while the others wait.
``bad-argument``: every rank passes a root outside the world, refused before any communication.
"""

from __future__ import annotations

import datetime
import os
import sys
import time

import torch

from commlayer import dist


def typo() -> None:
    dist.init_process_group(timeout=datetime.timedelta(seconds=30))
    dist.all_reduce(torch.ones(4), op=dist.ReduceOp.SUMM)


def timeout() -> None:
    dist.init_process_group(timeout=datetime.timedelta(seconds=3))
    dist.all_reduce(torch.ones(4))  # everyone, so the world is connected
    if dist.get_rank() == 1:
        time.sleep(5)  # busy past the others' timeout, then done: it skipped the next all_reduce
        return
    dist.all_reduce(torch.ones(4))


def dead_peer() -> None:
    dist.init_process_group(timeout=datetime.timedelta(seconds=30))
    dist.all_reduce(torch.ones(4))
    if dist.get_rank() == 1:
        os._exit(3)  # dies without a word, as a killed process would
    dist.all_reduce(torch.ones(4))


def bad_argument() -> None:
    dist.init_process_group(timeout=datetime.timedelta(seconds=30))
    dist.all_reduce(torch.ones(4))
    dist.broadcast(torch.ones(4), src=dist.get_world_size())


SCENARIOS = {"typo": typo, "timeout": timeout, "dead-peer": dead_peer, "bad-argument": bad_argument}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]]()
