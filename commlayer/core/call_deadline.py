"""The deadline of the facade call running on this thread, for waits that happen while it starts its op.

A call with ``timeout=`` (see ``commlayer.facade.calls.timeouts``) sets it while it starts its op; a
backend step that blocks before the op's Work exists (gloo's signature check, a reduction on the
same group) waits with :func:`wait_polled` instead of an untimed wait, so the call's timeout bounds
it too. Without a deadline (every call without ``timeout=``) nothing changes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from commlayer.core.errors import CommTimeoutError

__all__ = ["current", "polled_until", "set_for", "wait_polled"]

_local = threading.local()
_LONGEST_PAUSE_S = 1e-3


def current() -> float | None:
    """This thread's call deadline (``time.monotonic()`` seconds), or None."""
    return getattr(_local, "deadline", None)


@contextmanager
def set_for(seconds: float) -> Iterator[None]:
    """Set this thread's call deadline ``seconds`` from now while the block runs."""
    previous = current()
    _local.deadline = time.monotonic() + seconds
    try:
        yield
    finally:
        _local.deadline = previous


def polled_until(work: Any, deadline: float) -> bool:
    """Poll ``work.is_completed()`` until ``deadline``: yields the CPU at once, backs off to 1 ms."""
    pause = 0.0
    while not work.is_completed():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(pause, left))
        pause = min(max(pause * 2, 20e-6), _LONGEST_PAUSE_S)
    return True


def wait_polled(work: Any, what: str) -> None:
    """``work.wait()``, bounded by this thread's call deadline when one is set (torch's gloo Work
    ignores a timed wait's timeout, so the deadline is polled)."""
    deadline = current()
    if deadline is not None and not polled_until(work, deadline):
        raise CommTimeoutError(f"{what} did not complete within the call's timeout")
    work.wait()
