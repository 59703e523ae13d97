"""Async handles returned by every op, whatever the library underneath.

A backend wraps its library's request (a torch Work, an MPI request, a oneCCL event) in one of the
small adapters here; the facade chains epilogues onto it (copy a staged output back, divide for
AVG) with :meth:`Work.then`, so callers see one behaviour on every backend.
"""

from __future__ import annotations

import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn

import torch

from commlayer.core import health
from commlayer.core.boundary import hide_internal_frames
from commlayer.core.errors import CommError, CommTimeoutError
from commlayer.core.metrics import format_duration

__all__ = [
    "CompletedWork",
    "DeadlineWork",
    "TorchWork",
    "WaitLimit",
    "Work",
    "WorkList",
    "completed_on_stream",
    "poll_until",
    "set_wait_error_hook",
    "to_seconds",
    "wait_or_expire",
]

# Epilogues run once, under one process-wide lock: completion is rare next to starting, and a
# lock per Work would cost every call an allocation. Re-entrant, as an epilogue may wait on others.
_COMPLETION_LOCK = threading.RLock()


def to_seconds(timeout: timedelta | float | None) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        return timeout.total_seconds()
    return float(timeout)


_markers: dict[int, torch.cuda.Stream] = {}  # per device: where stream futures are completed


def completed_on_stream(work: Work, result: list[torch.Tensor]) -> torch.futures.Future | None:
    """A future completed now, for an op that completes on a CUDA stream (``Work.stream_event``)
    with its results on one GPU: the future's consumers, and its ``then`` callbacks, wait for the
    op's event on their own streams instead of the host waiting. None for every other op."""
    stream_event = getattr(work, "stream_event", None)  # C Works are virtual subclasses: none
    event = None if stream_event is None else stream_event()
    devices = {tensor.device for tensor in result}
    if event is None or len(devices) != 1:
        return None
    (device,) = devices
    if device.type != "cuda":
        return None
    marker = _markers.get(device.index)
    if marker is None:
        marker = _markers.setdefault(device.index, torch.cuda.Stream(device))
    marker.wait_event(event)
    future: torch.futures.Future = torch.futures.Future(devices=[device])
    with torch.cuda.stream(marker):  # the future records its completion on the marker stream
        future.set_result(result)
    return future


class Work(ABC):
    """Handle of an operation in flight, shaped like ``torch.distributed.Work``."""

    # Class-level defaults, shadowed per instance on completion: one Work is built per op, so
    # its constructor stays a single assignment.
    _done: bool = False
    _error: BaseException | None = None
    # Appended to a timed-out wait's message where the op provably stays pending.
    _pending_note: str = ""

    def __init__(self, result: Sequence[torch.Tensor] = ()) -> None:
        self._result = result

    @abstractmethod
    def _test(self) -> bool:
        """Return True once the operation has completed; never blocks."""

    @abstractmethod
    def _block(self, timeout_s: float | None) -> bool:
        """Block until completion; return False if ``timeout_s`` seconds passed first."""

    def _on_complete(self) -> None:
        """Hook for subclasses that run an epilogue exactly once after completion."""

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        """Block until done; raise CommTimeoutError if ``timeout`` passes first."""
        try:
            if not self._done:
                if not self._block(to_seconds(timeout)):
                    raise CommTimeoutError(
                        f"{type(self).__name__}: wait timed out after {format_duration(to_seconds(timeout))}{self._pending_note}"
                    )
                self._complete()
            if self._error is not None:
                raise self._error
            return True
        except CommError as error:
            hide_internal_frames(error)
            raise

    def is_completed(self) -> bool:
        if not self._done and self._test():
            self._complete()
        return self._done

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def result(self) -> list[torch.Tensor]:
        return list(self._result)

    def source_rank(self) -> int:
        """The group rank that sent the message of a receive from any source (``recv(src=None)``).

        Backends that declare ``Capabilities.recv_any_source`` return Works that override this.
        """
        raise RuntimeError(f"source_rank: {type(self).__name__} is not a receive from any source")

    def _source_rank(self) -> int:
        """torch's spelling of ``source_rank()``: the sender of a receive from any source."""
        return self.source_rank()

    def then(self, epilogue: Callable[[], None], result: Sequence[torch.Tensor] | None = None) -> Work:
        """A Work that runs ``epilogue`` once, after this one completes and before it reports done.

        Its ``result()`` is this Work's, unless ``result`` names other tensors (a staged op hands
        back the caller's tensors, not its staging copies).
        """
        return _ChainedWork(self, epilogue, result)

    def stream_event(self) -> torch.cuda.Event | None:
        """The CUDA event after which the op's results are ready, for an op that completes on a
        CUDA stream with nothing left for the host to do (peermem's kernels), else None.

        A torch bridge future of such an op completes at once, and its consumers' streams wait for
        the event, as NCCL's futures do: DDP's buckets then overlap the rest of backward. Never
        blocks and never waits.
        """
        return None

    def get_future(self) -> torch.futures.Future:
        """A future holding :meth:`result` once the op completes (waited for on a helper thread,
        or, for an op that completes on a CUDA stream, complete at once: its users wait for the
        op on their own streams)."""
        on_stream = completed_on_stream(self, self.result())
        if on_stream is not None:
            return on_stream
        future: torch.futures.Future = torch.futures.Future()

        def settle() -> None:
            try:
                self.wait()
                future.set_result(self.result())
            except BaseException as error:  # noqa: BLE001 - handed to the future's consumer
                future.set_exception(error)

        if self.is_completed():
            settle()
        else:
            threading.Thread(target=settle, daemon=True, name="commlayer-future").start()
        return future

    def _complete(self) -> None:
        with _COMPLETION_LOCK:
            if self._done:
                return
            try:
                self._on_complete()
            except BaseException as error:  # noqa: BLE001 - re-raised from wait()
                self._error = error
            self._done = True


class CompletedWork(Work):
    """An op that finished synchronously (or had nothing to send)."""

    _done = True

    def _test(self) -> bool:
        return True

    def _block(self, timeout_s: float | None) -> bool:
        return True


# Installed by the facade: turns a library's raw error raised by a wait into a typed one naming the
# op, group and rank, which this layer does not know (the facade finds them in its flight recorder).
_wait_error_hook: Callable[[Work, Exception], Exception] | None = None


def set_wait_error_hook(hook: Callable[[Work, Exception], Exception] | None) -> None:
    """Set the translation of errors raised by a torch Work's wait (None: raise them as they are)."""
    global _wait_error_hook
    _wait_error_hook = hook


def _raise_typed(work: Work, error: Exception) -> NoReturn:
    """Called inside an ``except`` block: re-raise ``error``, or its typed translation."""
    typed = error if _wait_error_hook is None else _wait_error_hook(work, error)
    if typed is error:
        raise error
    # The C launchers' Work raises it to the caller from here: its message quotes the library's error.
    hidden = isinstance(typed, CommError) and hide_internal_frames(typed)
    raise typed from (None if hidden else error)


class TorchWork(Work):
    """Adapter for a ``torch.distributed`` Work; a failed wait raises the facade's typed error."""

    def __init__(self, work: Any, result: Sequence[torch.Tensor] = ()) -> None:
        # Built once per async op on the hot path: assignments only, no super() frame.
        self._result = result
        self.torch_work = work

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        """Untimed, not yet done: torch's own wait is all there is to do (no epilogue here)."""
        if timeout is None and not self._done:
            try:
                self.torch_work.wait()  # raises on failure, and on the group's timeout, as torch does
            except RuntimeError as error:
                try:
                    _raise_typed(self, error)
                except CommError as typed:
                    hide_internal_frames(typed)
                    raise
            self._done = True  # never wait twice: a second wait on a finished gloo recv blocks
            return True
        return super().wait(timeout)

    def _test(self) -> bool:
        return bool(self.torch_work.is_completed())

    def _block(self, timeout_s: float | None) -> bool:
        try:
            if timeout_s is None:
                return bool(self.torch_work.wait())
            return bool(self.torch_work.wait(timedelta(seconds=timeout_s)))
        except RuntimeError as error:
            lowered = str(error).lower()
            if timeout_s is not None and ("timed out" in lowered or "timeout" in lowered):
                return False
            _raise_typed(self, error)

    def source_rank(self) -> int:
        return int(self.torch_work._source_rank())


@dataclass(frozen=True)
class WaitLimit:
    """How long an untimed wait on one communicator may take, and what to say when it passes.

    ``library`` names the library in messages ("MPI", "oneCCL"); ``advice`` tells the user what
    to do once an op has been abandoned (the library may be unable to cancel it).
    """

    group_timeout_s: float
    rank: int  # global rank, for messages
    library: str
    advice: str = ""
    group: str = ""  # the group's name, for messages

    def expired(self, op: str) -> Exception:
        """The error of a wait that ended unfinished: a dead peer's, else the group timeout's."""
        failure = health.current()
        if failure is not None:
            return health.peer_failure_error(op, self.group or "?", self.rank, failure)
        advice = f" {self.advice}" if self.advice else ""
        return CommTimeoutError(
            f"{op}: the {self.library} operation did not complete within the group's timeout of "
            f"{format_duration(self.group_timeout_s)} (rank {self.rank}) on group '{self.group or '?'}'; a peer "
            f"failed or did not call the same op in the same order.{advice}"
        )


# Buffers of requests abandoned at the group's timeout: the library may still write into them.
_ABANDONED: list[Sequence[Any]] = []


class DeadlineWork(Work):
    """Base of every Work over a library request whose own wait has no deadline.

    A subclass implements ``_test`` (never blocks) and may override ``_wait_until`` when its
    library can block with a limit (the default polls ``_test``); either returns early once the
    peer monitor reports a dead rank (:mod:`commlayer.core.health`), and the wait raises
    PeerFailureError. A wait without a timeout ends at the group's timeout: then the request's buffers are kept alive for good (the library may
    still write into them), ``_on_expired`` runs (a backend may mark its communicator unusable)
    and CommTimeoutError says which op, rank and timeout. A caller's shorter timeout leaves the op
    pending, so it can be waited for again. ``keep_alive`` holds every buffer the library reads
    or writes through raw pointers until completion; ``epilogue`` runs once after it.
    """

    def __init__(
        self,
        op: str,
        limit: WaitLimit,
        result: Sequence[torch.Tensor] = (),
        keep_alive: Sequence[Any] = (),
        epilogue: Callable[[], Any] | None = None,
    ) -> None:
        super().__init__(result)
        self._op = op
        self._limit = limit
        self._keep_alive = keep_alive
        self._epilogue = epilogue

    _pending_note = "; the op is still pending and can be waited for again"

    def _wait_until(self, limit_s: float) -> bool:
        """Block until completion (True) or until ``limit_s`` seconds pass (False)."""
        return poll_until(self._test, limit_s)

    def _block(self, timeout_s: float | None) -> bool:
        limit = self._limit.group_timeout_s if timeout_s is None else timeout_s
        if self._wait_until(max(0.0, limit)):
            return True
        if timeout_s is not None and health.current() is None:
            return False  # the caller's own deadline: the op stays pending
        _ABANDONED.append(self._keep_alive)
        error = self._limit.expired(self._op)
        self._on_expired(str(error))
        raise error

    def _on_expired(self, message: str) -> None:
        """Hook: the group's timeout passed with this op unfinished."""

    def _on_complete(self) -> None:
        self._keep_alive = ()
        if self._epilogue is not None:
            self._epilogue()


# How many tests run between two clock checks, and after how many the poll starts yielding the
# core between tests. Libraries such as MPI progress non-blocking collectives only inside their
# test calls, so a wait keeps testing rather than sleeping (a sleeping rank stalls its peers).
# Yielding early matters when ranks outnumber cores: measured with MPI, 4 ranks on 2 cores, an
# 8-byte Iallreduce took ~70 us yielding after 16 polls and ~7.5 ms after 4096, since the spinning
# rank held the core its peer needed; with a core per rank, sched_yield returns at once.
_POLLS_PER_CLOCK_CHECK = 32
_POLLS_BEFORE_YIELDING = 16


def poll_until(test: Callable[[], bool], limit_s: float) -> bool:
    """Call ``test`` until it returns True (then True), or until ``limit_s`` seconds pass or the
    peer monitor reports a dead rank (then False)."""
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


def wait_or_expire(test: Callable[[], bool], op: str, limit: WaitLimit, keep_alive: Sequence[Any]) -> None:
    """Wait for a request no Work wraps (a synchronous op waited in place) until the group's timeout."""
    if not poll_until(test, limit.group_timeout_s):
        _ABANDONED.append(keep_alive)
        raise limit.expired(op)


class WorkList(Work):
    """Completes when every member completes; used by fallbacks built from several core ops."""

    def __init__(self, works: Sequence[Work], result: Sequence[torch.Tensor] = ()) -> None:
        super().__init__(result)
        self._works = list(works)

    def _test(self) -> bool:
        return all(work.is_completed() for work in self._works)

    def _block(self, timeout_s: float | None) -> bool:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for work in self._works:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                work.wait(remaining)
            except CommTimeoutError:
                return False
        return True


class _ChainedWork(Work):
    def __init__(
        self, base: Work, epilogue: Callable[[], None], result: Sequence[torch.Tensor] | None
    ) -> None:
        super().__init__(base.result() if result is None else result)
        self._base = base
        self._epilogue = epilogue

    def _test(self) -> bool:
        return self._base.is_completed()

    def _block(self, timeout_s: float | None) -> bool:
        try:
            return self._base.wait(timeout_s)
        except CommTimeoutError:
            return False

    def _on_complete(self) -> None:
        self._base.wait()
        self._epilogue()

    def source_rank(self) -> int:
        return self._base.source_rank()
