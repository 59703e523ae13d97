"""Per-call ``timeout=``: every collective and p2p call of commlayer.dist takes one.

The facade starts the op asynchronously and waits on its Work with that deadline
(``Work.wait(timeout)``, which every backend's Work honours); expiry becomes a
:class:`~commlayer.core.errors.CommTimeoutError` naming the op, the group and the rank, translated
like any failed op (the group is aborted and the flight recorders dump). An async call returns a
:class:`CallTimeoutWork`, whose untimed ``wait()`` ends at the same deadline. The keyword is
torchcomms' (``timeout``: a timedelta or seconds); without it (None) nothing here runs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from typing import Any

from commlayer.core import call_deadline
from commlayer.core.call_deadline import polled_until
from commlayer.core.errors import CommTimeoutError, InvalidArgumentError, InvalidTypeError
from commlayer.core.work import Work, to_seconds
from commlayer.facade.calls.failures import raise_translated
from commlayer.facade.groups.group import resolve_group

__all__ = ["CallTimeoutWork", "checked_timeout", "rerun_with_timeout", "with_timeout"]


def checked_timeout(op: str, timeout: Any, rank: int = -1) -> float:
    """``timeout`` in seconds: a positive timedelta or number, else a clear error."""
    if isinstance(timeout, bool) or not isinstance(timeout, (timedelta, int, float)):
        raise InvalidTypeError(
            f"{op}: argument 'timeout' expected a datetime.timedelta or seconds, received "
            f"{type(timeout).__name__} {timeout!r} (rank {rank})"
        )
    seconds = to_seconds(timeout)
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        raise InvalidArgumentError(
            f"{op}: argument 'timeout' expected a positive duration, received {timeout!r} (rank {rank})"
        )
    return seconds


def _rank() -> int:
    from commlayer.facade.groups.group import world_or_none

    world = world_or_none()
    return -1 if world is None else world.rank


class CallTimeoutWork(Work):
    """An async op's Work that carries its call's deadline: an untimed ``wait()`` ends there."""

    def __init__(self, work: Work, op: str, group_arg: Any, seconds: float) -> None:
        super().__init__()
        self.inner = work
        self.op = op
        self.group_arg = group_arg
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        remaining = max(0.0, self.deadline - time.monotonic())
        asked = to_seconds(timeout)
        if asked is not None and asked < remaining and not _completes_within(self.inner, self.op, asked):
            raise CommTimeoutError(f"{self.op}: wait timed out after {timeout}; the op is still pending")
        _wait_by(self.inner, self.op, self.group_arg, self.seconds, remaining)
        self._done = True
        return True

    def _test(self) -> bool:
        return self.inner.is_completed()

    def _block(self, timeout_s: float | None) -> bool:  # pragma: no cover - wait() is overridden
        return self.inner.wait(timeout_s)

    def is_completed(self) -> bool:
        return self.inner.is_completed()

    def exception(self) -> BaseException | None:
        return self.inner.exception()

    def result(self) -> list[Any]:
        return self.inner.result()

    def source_rank(self) -> int:
        return self.inner.source_rank()


def _wait_by(work: Work, op: str, group_arg: Any, seconds: float, remaining: float) -> None:
    """Wait for ``work`` at most ``remaining`` seconds; expiry becomes the per-call
    CommTimeoutError, translated (the group is aborted, as after its own timeout)."""
    if _completes_within(work, op, remaining):
        work.wait()  # done: runs its epilogue, raises its (translated) failure
        return
    group = resolve_group(op, group_arg)
    if group is None:
        raise _expired(op, group_arg, seconds)
    with call_deadline.set_for(seconds):  # a per-call expiry: translated without asking the peers
        raise_translated(group, op, _expired(op, group_arg, seconds))


def _expired(op: str, group_arg: Any, seconds: float) -> CommTimeoutError:
    group = resolve_group(op, group_arg)
    name = "?" if group is None else group.name
    rank = _rank() if group is None else group.global_rank
    return CommTimeoutError(
        f"{op}: did not complete within its timeout of {seconds:g} s (the call's timeout=) "
        f"(rank {rank}) on group '{name}'"
    )


def _completes_within(work: Work, op: str, seconds: float) -> bool:
    """Whether ``work`` completes within ``seconds``.

    A collective's Work is polled (:func:`~commlayer.core.call_deadline.polled_until`): torch's gloo
    collective Work ignores a timed wait's timeout and waits out the group's. A p2p Work gets a
    timed ``wait``, which every library honours for p2p, while gloo's completes only inside a
    wait, so cannot be polled.
    """
    if op in _P2P_OPS:
        try:
            return work.wait(timedelta(seconds=seconds))
        except CommTimeoutError:
            return False
    return polled_until(work, time.monotonic() + seconds)


_P2P_OPS = frozenset({"send", "recv", "isend", "irecv", "batch_isend_irecv"})


@contextmanager
def _bounded(op: str, group_arg: Any, seconds: float) -> Iterator[None]:
    """The start's own waits bounded by ``seconds``: the thread's call deadline (gloo's signature
    check) and each backend's ``call_timeout`` (shm, whose ops run to completion)."""
    group = resolve_group(op, group_arg)
    with ExitStack() as stack:
        stack.enter_context(call_deadline.set_for(seconds))
        for backend in () if group is None else group.unique_backends():
            stack.enter_context(backend.call_timeout(seconds))
        yield


def with_timeout(
    op: str, group_arg: Any, async_op: bool, timeout: Any, start: Callable[[bool], Work | None]
) -> Any:
    """Run ``start(True)`` (the op, async) and wait on its Work for ``timeout``; an async call
    gets a :class:`CallTimeoutWork`. None on a rank outside the group, as the op itself returns."""
    seconds = checked_timeout(op, timeout, _rank())
    try:
        with _bounded(op, group_arg, seconds):
            work = start(True)
    except CommTimeoutError as error:  # a wait inside the start ended; run_op translated it
        raise _expired(op, group_arg, seconds) from error
    if work is None:
        return None
    if async_op:
        return CallTimeoutWork(work, op, group_arg, seconds)
    _wait_by(work, op, group_arg, seconds, seconds)
    return None


def rerun_with_timeout(op: Callable[..., Work | None], arguments: dict[str, Any]) -> Any:
    """Run the collective ``op`` again under its call's ``timeout`` (see :func:`with_timeout`).

    ``arguments`` are the call's own, as ``locals()`` reads them on entry to ``op``; the rerun
    starts async without the timeout, so it takes the op's ordinary path.
    """
    rerun = {name: value for name, value in arguments.items() if name not in ("timeout", "async_op")}
    return with_timeout(
        op.__name__,
        arguments.get("group"),
        arguments["async_op"],
        arguments["timeout"],
        lambda wait_async: op(**rerun, async_op=wait_async),
    )
