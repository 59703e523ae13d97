"""Groups that can no longer be used: aborted after a failure, or destroyed.

Both replace the group's resolved-call cache with a dict whose every lookup raises, so the check
costs nothing on the happy path (it runs only on the cache's miss path).
"""

from __future__ import annotations

from typing import Any

from commlayer.core.errors import CommError, CommTimeoutError, PeerFailureError, invalid_argument
from commlayer.facade.groups.group import ProcessGroup

__all__ = ["abort_group", "mark_destroyed"]


def abort_group(group: ProcessGroup, error: CommError) -> None:
    """Make every later op on ``group`` fail at once with the reason (checked only on ``begin``'s
    miss path, so the happy path pays nothing)."""
    group.op_calls = _AbortedCalls(group, error)


class _AbortedCalls(dict):  # type: ignore[type-arg]
    """Stands in for a group's resolved-call cache once it is aborted: every lookup raises."""

    def __init__(self, group: ProcessGroup, error: CommError) -> None:
        super().__init__()
        self.group_name = group.name
        self.rank = group.global_rank
        self.error = error

    def get(self, key: Any, default: Any = None) -> Any:
        op = key[0] if isinstance(key, tuple) else str(key)
        if isinstance(self.error, PeerFailureError):
            why = f"peer rank {self.error.failed_rank} failed"
        else:
            why = "an op timed out" if isinstance(self.error, CommTimeoutError) else "an op failed"
        message = (
            f"{op}: group '{self.group_name}' cannot be used after {why}; it was aborted "
            f"(rank {self.rank}). The failure: {self.error}"
        )
        if isinstance(self.error, PeerFailureError):
            raise PeerFailureError(message, self.error.failed_rank, op, self.group_name)
        raise CommError(message)


def mark_destroyed(group: ProcessGroup) -> None:
    """Make every later op on a destroyed group raise a typed error naming op, group and rank
    (its backends are shut down: mpi's communicator is freed, gloo's would still run)."""
    group.op_calls = _DestroyedCalls(group.name, group.global_rank)


class _DestroyedCalls(dict):  # type: ignore[type-arg]
    """Stands in for a destroyed group's resolved-call cache: every lookup raises."""

    def __init__(self, group_name: str, rank: int) -> None:
        super().__init__()
        self.group_name = group_name
        self.rank = rank

    def get(self, key: Any, default: Any = None) -> Any:
        op = key[0] if isinstance(key, tuple) else str(key)
        raise invalid_argument(
            op,
            "group",
            "a process group that has not been destroyed",
            f"group '{self.group_name}', destroyed by destroy_process_group",
            self.rank,
        )
