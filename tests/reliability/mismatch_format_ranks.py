"""Rank code of test_mismatch_format: rank 1 all-reduces 8 elements where rank 0 all-reduces 4;
each rank writes the message it got to ``<folder>/rank<r>.txt``."""

from __future__ import annotations

from pathlib import Path

import torch

from commlayer import dist
from commlayer.core.errors import CollectiveMismatchError


def main(folder: str) -> None:
    rank = dist.get_rank()
    tensor = torch.ones(8 if rank == 1 else 4)
    try:
        dist.all_reduce(tensor)
    except CollectiveMismatchError as error:
        message = str(error)
    else:
        raise AssertionError(f"rank {rank}: a mismatched all_reduce returned {tensor}")
    (Path(folder) / f"rank{rank}.txt").write_text(message, encoding="utf-8")
    dist.barrier()  # the group is still usable: nothing moved
