"""Waits of the mpi backend's own, outside any MPI call, that raise the typed error themselves.

The watchdog of synchronous calls (:mod:`.ordered`) ends the job with MPI_Abort when a stamped
call outlives the group's timeout, because a thread blocked inside MPI cannot be handed an error.
A thread that is still in one of the backend's own waits (the mismatch check's shared-memory
exchange, where a peer that skipped the op is noticed) can be: it raises CommTimeoutError or
PeerFailureError at the group's timeout, which user code may catch. The watchdog leaves the job
alone while any thread is in such a wait; once the wait has raised, the call's stamp is cleared.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

__all__ = ["in_raising_wait", "raising_wait"]

_lock = threading.Lock()
_waiting = 0


@contextlib.contextmanager
def raising_wait() -> Iterator[None]:
    """Mark this thread's wait as one that raises its own error at the group's timeout."""
    global _waiting
    with _lock:
        _waiting += 1
    try:
        yield
    finally:
        with _lock:
            _waiting -= 1


def in_raising_wait() -> bool:
    """Whether some thread is in a wait that will raise its own error (the watchdog then waits)."""
    return _waiting > 0
