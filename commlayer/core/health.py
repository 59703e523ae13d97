"""What this process knows about dead peers: set by the peer monitor, read by every wait loop.

The facade's peer monitor (:mod:`commlayer.facade.monitor.peer_monitor`) watches heartbeats and death notices
in the rendezvous store and calls :func:`report` when a peer dies. Backends whose waits poll
(MPI, oneCCL) call :func:`raise_if_failed` between polls, so a survivor blocked in a collective
raises :class:`~commlayer.core.errors.PeerFailureError` within a poll of the report instead of at the
group's timeout. Reading the state is one global load: cheap enough for any poll loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from commlayer.core.errors import PeerFailureError

__all__ = [
    "PeerFailure",
    "add_listener",
    "clear",
    "current",
    "peer_failure_error",
    "raise_if_failed",
    "report",
]


@dataclass(frozen=True)
class PeerFailure:
    """A dead peer: its global rank, how it was noticed, and when (time.monotonic())."""

    rank: int
    reason: str
    noticed_at: float


_failure: PeerFailure | None = None
_lock = threading.Lock()
# Called once with the first failure: backends whose waits run in native code stop them here.
_listeners: list[Callable[[PeerFailure], None]] = []


def report(rank: int, reason: str) -> PeerFailure:
    """Record that global ``rank`` died; the first report wins (later deaths follow from it)."""
    global _failure
    with _lock:
        first = _failure is None
        if first:
            _failure = PeerFailure(rank, reason, time.monotonic())
        failure = _failure
    if first:
        for listener in tuple(_listeners):
            listener(failure)
    return failure


def add_listener(listener: Callable[[PeerFailure], None]) -> None:
    """Call ``listener(failure)`` when a peer failure is first reported (from the monitor thread)."""
    if listener not in _listeners:
        _listeners.append(listener)


def current() -> PeerFailure | None:
    return _failure


def clear() -> None:
    """Forget a failure (a new init_process_group starts with every peer alive)."""
    global _failure
    with _lock:
        _failure = None


def raise_if_failed(op: str, group: str, rank: int, ranks: tuple[int, ...] | None = None) -> None:
    """Raise PeerFailureError if a peer (of ``ranks``, when given) died; else return."""
    failure = _failure
    if failure is not None and (ranks is None or failure.rank in ranks):
        raise peer_failure_error(op, group, rank, failure)


def peer_failure_error(op: str, group: str, rank: int, failure: PeerFailure) -> PeerFailureError:
    return PeerFailureError(
        f"{op} on group '{group}': peer rank {failure.rank} failed ({failure.reason}); this op cannot "
        f"complete and the group is aborted (rank {rank})",
        failed_rank=failure.rank,
        op=op,
        group=group,
    )
