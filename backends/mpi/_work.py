"""Work handles over MPI requests."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from commlayer import health
from commlayer.errors import CommTimeoutError
from commlayer.work import Work

__all__ = ["MpiWork", "WaitLimit", "wait_for"]

# How many MPI_Test calls run between two deadline checks, and after how many the poll starts
# yielding the core between calls. MPI_Test also drives the progress of non-blocking collectives,
# so a wait keeps polling rather than sleeping (a sleeping rank stalls its peers). Yielding early
# matters when ranks outnumber cores: measured with 4 ranks on 2 cores, an 8-byte Iallreduce took
# ~70 us yielding after 16 polls and ~7.5 ms after 4096, since the spinning rank held the core its
# peer needed; with a core per rank, sched_yield returns at once and costs well under a microsecond.
_POLLS_PER_CLOCK_CHECK = 32
_POLLS_BEFORE_YIELDING = 16


# Requests whose wait passed the group's timeout, with their buffers (see _group_timeout).
_ABANDONED: list[tuple[Any, Sequence[Any]]] = []


@dataclass(frozen=True)
class WaitLimit:
    """What an untimed wait on one communicator may take, and who is waiting (for messages)."""

    group_timeout_s: float
    rank: int  # global rank
    group: str = ""  # the group's name, for messages


class MpiWork(Work):
    """An MPI request in flight.

    MPI's own waits have no deadline, so every wait polls MPI_Test until one: the caller's
    timeout, else the group's. The group's timeout passing means a peer never joined the op;
    MPI cannot cancel a started collective, so the error says to end the job (uncaught, it does:
    see ``_runtime``). ``keep_alive`` holds every buffer MPI may still read or write -- they are
    views of tensor memory, not owners -- until completion; ``epilogue`` runs once after it
    (copy out, AVG's division).
    """

    def __init__(
        self,
        request: Any,
        op: str,
        limit: WaitLimit,
        result: Sequence[torch.Tensor],
        keep_alive: Sequence[Any] = (),
        epilogue: Callable[[], None] | None = None,
        status: Any = None,
    ) -> None:
        super().__init__(result)
        self._request = request
        self._op = op
        self._limit = limit
        self._keep_alive = keep_alive
        self._epilogue = epilogue
        self._status = status
        # MPI forbids testing one request from two threads at once (get_future waits on a thread).
        self._request_lock = threading.Lock()

    def _test(self) -> bool:
        with self._request_lock:
            return bool(self._request.Test(self._status))

    def _block(self, timeout_s: float | None) -> bool:
        limit = self._limit.group_timeout_s if timeout_s is None else timeout_s
        if _poll(self._test, limit):
            return True
        if timeout_s is not None and health.current() is None:
            return False  # the caller's own deadline: the op stays pending and can be waited for again
        raise _gave_up(self._op, self._limit, self._request, self._keep_alive)

    def _on_complete(self) -> None:
        self._keep_alive = ()
        if self._epilogue is not None:
            self._epilogue()

    def source_rank(self) -> int:
        """The group rank that sent a receive-from-any-source."""
        if self._status is None:
            raise RuntimeError("source_rank: this work is not a receive")
        self.wait()
        return int(self._status.Get_source())


def wait_for(request: Any, op: str, limit: WaitLimit, keep_alive: Sequence[Any]) -> None:
    """Wait for a request only this thread knows, until the group's timeout."""
    if not _poll(request.Test, limit.group_timeout_s):
        raise _gave_up(op, limit, request, keep_alive)


def _poll(test: Callable[[], bool], limit_s: float) -> bool:
    """Call ``test`` until it returns True (then True), or ``limit_s`` seconds pass or the peer
    monitor reports a dead rank (then False)."""
    if test():
        return True
    deadline = time.monotonic() + limit_s
    polls = 0
    while not test():
        polls += 1
        if polls >= _POLLS_BEFORE_YIELDING:
            os.sched_yield()
        if polls % _POLLS_PER_CLOCK_CHECK == 0 and (
            time.monotonic() >= deadline or health.current() is not None
        ):
            return False
    return True


def _gave_up(op: str, limit: WaitLimit, request: Any, keep_alive: Sequence[Any]) -> Exception:
    """The error of a wait that ended unfinished: a dead peer, else the group's timeout."""
    # The request may still complete later and write into its buffers: keep them alive for good.
    _ABANDONED.append((request, keep_alive))
    failure = health.current()
    if failure is not None:
        return health.peer_failure_error(op, limit.group or "?", limit.rank, failure)
    return CommTimeoutError(
        f"{op} on group '{limit.group or '?'}': the MPI operation did not complete within the group's "
        f"timeout of {limit.group_timeout_s:g} s "
        f"(rank {limit.rank}); a peer failed or did not call the same op in the same order. "
        "MPI cannot cancel it: end the job (an uncaught exception aborts every rank)"
    )
