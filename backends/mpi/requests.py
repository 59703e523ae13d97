"""Work handles over MPI requests: the core's deadline-bounded Work, tested with MPI_Test."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from commlayer.backends.mpi.runtime import abandon
from commlayer.core.errors import CommError
from commlayer.core.work import DeadlineWork, WaitLimit, wait_or_expire

__all__ = ["CANNOT_CANCEL", "MpiWork", "wait_in_place"]

# MPI cannot cancel a started collective: a process that abandoned one never finalizes (_runtime).
CANNOT_CANCEL = (
    "MPI cannot cancel it, so at exit this process ends the job with MPI_Abort instead of MPI_Finalize"
)


class MpiWork(DeadlineWork):
    """An MPI request in flight; MPI's own waits have no deadline, so the core's polling wait runs.

    ``status`` is the MPI.Status a receive from any source fills in (see :meth:`source_rank`).
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
        # The request object joins the buffers kept alive: an abandoned one must outlive them too.
        super().__init__(op, limit, result, (request, keep_alive), epilogue)
        self._request = request
        self._status = status
        # MPI forbids testing one request from two threads at once (get_future waits on a thread).
        self._request_lock = threading.Lock()

    def _test(self) -> bool:
        with self._request_lock:
            return bool(self._request.Test(self._status))

    def _on_expired(self, message: str) -> None:
        abandon(message, lambda: not self._test())

    def source_rank(self) -> int:
        """The group rank that sent a receive-from-any-source."""
        if self._status is None:
            return super().source_rank()
        self.wait()
        return int(self._status.Get_source())


def wait_in_place(request: Any, op: str, limit: WaitLimit, keep_alive: Sequence[Any]) -> None:
    """Wait for a request no Work wraps until the group's timeout; an expired one is remembered
    as abandoned (see :func:`.runtime.abandon`)."""
    try:
        wait_or_expire(request.Test, op, limit, (request, keep_alive))
    except CommError as error:
        abandon(f"{type(error).__name__}: {error}", lambda: not request.Test())
        raise
