"""Exceptions raised by commlayer, with messages that say op, argument, expectation and rank."""

from __future__ import annotations

from typing import Any

__all__ = [
    "BackendUnavailableError",
    "CommError",
    "CommTimeoutError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "NotInitializedError",
    "UnsupportedError",
    "invalid_argument",
]


class CommError(RuntimeError):
    """Base class of every commlayer error."""


class NotInitializedError(CommError):
    """An operation ran before init_process_group (or init ran twice)."""


class CommTimeoutError(CommError, TimeoutError):
    """A wait or a rendezvous did not finish within its timeout."""


class BackendUnavailableError(CommError):
    """A backend name is unknown, or its backend cannot run on this machine."""


class InvalidArgumentError(CommError, ValueError):
    """An argument was rejected before any communication started."""


class InvalidTypeError(InvalidArgumentError, TypeError):
    """An argument of the wrong Python type."""


class UnsupportedError(InvalidArgumentError):
    """The backend does not support this op, dtype, device or reduce op."""


def invalid_argument(
    op: str,
    arg: str,
    expected: str,
    received: Any,
    rank: int | None,
    error: type[InvalidArgumentError] = InvalidArgumentError,
) -> InvalidArgumentError:
    """Build the uniform message: ``all_reduce: argument 'op' expected X, received Y (rank 3)``."""
    where = f" (rank {rank})" if rank is not None and rank >= 0 else ""
    return error(f"{op}: argument '{arg}' expected {expected}, received {received}{where}")
