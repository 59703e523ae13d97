"""Rank code of test_monitored_barrier: rank 0 runs monitored_barrier on torch's own gloo and on
commlayer, and compares what each raises, first while ranks 1.. are alive but never arrive, then
once they have exited.

The reference is torch's default group over a FileStore (``path``) beside the commlayer world;
on commlayer's gloo backend, which owns torch's default group, a torch gloo group of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as torch_dist

from commlayer import dist
from commlayer.core.errors import PeerFailureError


def main(backend: str, path: str) -> None:
    dist.init_process_group(backend=backend)
    rank, size = dist.get_rank(), dist.get_world_size()
    if torch_dist.is_initialized():  # commlayer's gloo: torch's default group is its own
        reference = torch_dist.new_group(backend="gloo")
    else:
        torch_dist.init_process_group(
            "gloo", store=torch_dist.FileStore(path, size), rank=rank, world_size=size
        )
        reference = None
    meeting = torch_dist.new_group(backend="gloo")  # the ranks' own meeting point, outside the checks
    torch_dist.barrier(group=meeting)
    if rank == 0:  # the peers are alive but never arrive: every one of them is named
        _compare(reference, size, wait_all_ranks=True, exited=False)
    torch_dist.barrier(group=meeting)
    if rank != 0:
        return  # this process exits: no destroy, as a rank that crashed would not
    time.sleep(1.0)  # the peers are gone
    for wait_all_ranks in (False, True):
        _compare(reference, size, wait_all_ranks, exited=True)


def _compare(reference: Any, size: int, wait_all_ranks: bool, exited: bool) -> None:
    """torch's and commlayer's monitored_barrier raise the same type and the same first line."""
    timeout = timedelta(seconds=1)
    expected = _raised(
        lambda: torch_dist.monitored_barrier(group=reference, timeout=timeout, wait_all_ranks=wait_all_ranks)
    )
    got = _raised(lambda: dist.monitored_barrier(timeout=timeout, wait_all_ranks=wait_all_ranks))
    case = (wait_all_ranks, exited, type(got), type(expected), str(got), str(expected))
    assert isinstance(got, type(expected)) and not isinstance(got, PeerFailureError), case
    first_line = str(expected).split("\n")[0]
    assert str(got).startswith(first_line), case
    if not exited:  # torch names the ranks that did not arrive (an exited peer: gloo's own words)
        missing = ", ".join(str(peer) for peer in range(1, size))
        assert first_line == f"[Rank 0]: Ranks {missing} failed to pass monitoredBarrier in 1000 ms", case


def _raised(call: Callable[[], Any]) -> BaseException:
    try:
        call()
    except Exception as error:  # noqa: BLE001 - the error is what is compared
        return error
    raise AssertionError(f"{call} raised nothing")
