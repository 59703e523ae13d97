"""Rank code of test_monitored_barrier: rank 0 runs monitored_barrier on torch's own gloo and on
commlayer, and compares what each raises, first while ranks 1.. are alive but never arrive, then
once they have exited.

The reference is torch's own gloo (:func:`tests.facade.torch_fidelity_ranks.torch_reference`).
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import torch.distributed as torch_dist

from commlayer import dist
from commlayer.core.errors import PeerFailureError
from tests.facade.torch_fidelity_ranks import raised, torch_reference


def main(backend: str, path: str) -> None:
    dist.init_process_group(backend=backend)
    rank, size = dist.get_rank(), dist.get_world_size()
    reference = torch_reference(path)
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
    expected = raised(
        lambda: torch_dist.monitored_barrier(group=reference, timeout=timeout, wait_all_ranks=wait_all_ranks)
    )
    got = raised(lambda: dist.monitored_barrier(timeout=timeout, wait_all_ranks=wait_all_ranks))
    case = (wait_all_ranks, exited, type(got), type(expected), str(got), str(expected))
    assert isinstance(got, type(expected)) and not isinstance(got, PeerFailureError), case
    first_line = str(expected).split("\n")[0]
    assert str(got).startswith(first_line), case
    if not exited:  # torch names the ranks that did not arrive (an exited peer: gloo's own words)
        missing = ", ".join(str(peer) for peer in range(1, size))
        assert first_line == f"[Rank 0]: Ranks {missing} failed to pass monitoredBarrier in 1000 ms", case
