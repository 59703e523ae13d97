"""monitored_barrier: a barrier built from send and recv that names the ranks that did not arrive."""

from __future__ import annotations

import time
import warnings
from datetime import timedelta
from typing import Any

import torch

from commlayer.contract.fallbacks import FALLBACK_TAG
from commlayer.core.boundary import user_facing
from commlayer.core.errors import CommTimeoutError, InvalidTypeError, invalid_argument
from commlayer.core.work import Work
from commlayer.facade.calls.dispatch import begin
from commlayer.facade.groups.group import extend_groups

__all__ = ["monitored_barrier"]


@user_facing
def monitored_barrier(
    group: Any = None, timeout: timedelta | None = None, wait_all_ranks: bool = False
) -> None:
    """A barrier that names the ranks that did not arrive within ``timeout``.

    Group rank 0 collects a token from every other rank, then releases them; it works on every
    backend because it uses only send and recv.
    """
    call = begin("monitored_barrier", group)
    if call is None:
        return
    timeout = _as_timedelta(call, timeout)
    deadline = time.monotonic() + (timeout or call.group.timeout).total_seconds()
    token = torch.zeros(1, dtype=torch.int32, device=call.backend.object_device())
    peers = range(1, call.group.size())
    if call.group.rank() != 0:
        call.backend.send(token, 0, FALLBACK_TAG, async_op=True).wait(_remaining(deadline))
        call.backend.recv(token, 0, FALLBACK_TAG, async_op=True).wait(_remaining(deadline))
        return
    tokens = {peer: torch.zeros_like(token) for peer in peers}
    arrivals = {peer: call.backend.recv(tokens[peer], peer, FALLBACK_TAG, async_op=True) for peer in peers}
    missing = _ranks_missing(arrivals, deadline, wait_all_ranks)
    if missing:
        raise _not_arrived(call, missing, timeout or call.group.timeout, wait_all_ranks)
    for peer in peers:
        call.backend.send(token, peer, FALLBACK_TAG, async_op=True).wait(_remaining(deadline))


def _as_timedelta(call: Any, timeout: Any) -> timedelta | None:
    """``timeout`` as a timedelta: torch also takes a float, as seconds (with a warning), and
    refuses anything else with a TypeError."""
    if timeout is None or isinstance(timeout, timedelta):
        return timeout
    if isinstance(timeout, float):
        warnings.warn(
            "Please specify timeout arg as a timedelta. "
            f"Converting current value of {timeout} assuming it represents seconds",
            stacklevel=3,
        )
        return timedelta(seconds=timeout)
    detail = invalid_argument("monitored_barrier", "timeout", "a timedelta", repr(timeout), call.rank)
    raise InvalidTypeError(
        f"Expected timeout argument to be of type datetime.timedelta, got {timeout}. {detail}"
    )


def _not_arrived(call: Any, missing: list[int], timeout: timedelta, wait_all_ranks: bool) -> CommTimeoutError:
    """torch's message (its group ranks, its milliseconds) first, then the global ranks."""
    milliseconds = int(timeout.total_seconds() * 1000)
    listed = ", ".join(str(peer) for peer in missing)
    who = f"Ranks {listed}" if wait_all_ranks else f"Rank {listed}"
    global_missing = [call.group.ranks[peer] for peer in missing]
    return CommTimeoutError(
        f"[Rank {call.group.rank()}]: {who} failed to pass monitoredBarrier in {milliseconds} ms. "
        f"monitored_barrier: global ranks {global_missing} did not reach the barrier within {timeout} "
        f"(rank {call.rank})"
    )


def _ranks_missing(arrivals: dict[int, Work], deadline: float, wait_all_ranks: bool) -> list[int]:
    missing = []
    for peer, work in arrivals.items():
        try:
            work.wait(_remaining(deadline) if not missing else 0.0)
        except CommTimeoutError:
            missing.append(peer)
            if not wait_all_ranks:
                break
    return missing


def _remaining(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


extend_groups("monitored_barrier", monitored_barrier)  # group.monitored_barrier(...), as torch's
