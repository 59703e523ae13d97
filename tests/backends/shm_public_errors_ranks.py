"""Rank body of tests/backends/test_shm_public_errors.py: shm's native errors reach the caller as
commlayer's public types (run on a gloo world; the checked groups are shm)."""

from __future__ import annotations

import traceback
from datetime import timedelta

import torch

from commlayer import dist


def run() -> None:
    rank = dist.get_rank()
    mismatch_group = dist.new_group(backend="shm")
    try:
        dist.all_reduce(torch.ones(4 if rank == 0 else 8), group=mismatch_group)
    except Exception as error:  # noqa: BLE001 - its type is what is checked
        _check_public(error, "CollectiveMismatchError")
    else:
        raise AssertionError(f"rank {rank}: all_reduce of 4 against 8 elements raised nothing")
    timeout_group = dist.new_group(backend="shm", timeout=timedelta(seconds=1))
    if rank == 0:  # rank 1 never enters: rank 0 waits out the group's timeout
        try:
            dist.all_reduce(torch.ones(4), group=timeout_group)
        except Exception as error:  # noqa: BLE001
            _check_public(error, "CommTimeoutError")
            assert "timeout of 1 s" in str(error), str(error)
        else:
            raise AssertionError("rank 0: an all_reduce rank 1 never entered raised nothing")
    dist.barrier()


def _check_public(error: BaseException, name: str) -> None:
    kind = type(error)
    assert (kind.__module__, kind.__name__) == ("commlayer.core.errors", name), (
        f"{kind.__module__}.{kind.__qualname__}"
    )
    printed = traceback.format_exception_only(kind, error)[-1]
    assert printed.startswith(f"commlayer.core.errors.{name}: "), printed
