"""Exceptions raised by commlayer, with messages that say op, argument, expectation and rank.

Each one subclasses torch's distributed error and the built-in type torch raises in the same case,
so ``except dist.DistError``, ``except dist.DistBackendError`` or ``except ValueError`` written
for ``torch.distributed`` catch commlayer's errors too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch.distributed import DistBackendError, DistError, DistNetworkError

__all__ = [
    "AlreadyInitializedError",
    "BackendUnavailableError",
    "CheckpointError",
    "CollectiveMismatchError",
    "CommError",
    "CommTimeoutError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "NotInitializedError",
    "PeerFailureError",
    "RendezvousEnvError",
    "RendezvousError",
    "UnsupportedError",
    "invalid_argument",
    "missing_extra",
]


class CommError(DistError):
    """Base class of every commlayer error (a ``torch.distributed.DistError``, so a RuntimeError)."""


class NotInitializedError(CommError, ValueError):
    """An operation ran before init_process_group (or init ran twice); torch raises ValueError."""


class AlreadyInitializedError(CommError, ValueError):
    """init_process_group ran while a default group exists (torch raises ValueError there too)."""


class CommTimeoutError(CommError, DistBackendError, TimeoutError):
    """A wait or a rendezvous did not finish within its timeout (torch: DistBackendError)."""


class RendezvousError(CommError, DistNetworkError):
    """The rendezvous store could not be hosted (e.g. MASTER_PORT held by another program)."""


class BackendUnavailableError(CommError):
    """A backend name is unknown, or its backend cannot run on this machine."""


class InvalidArgumentError(CommError, ValueError):
    """An argument was rejected before any communication started."""


class InvalidTypeError(InvalidArgumentError, TypeError):
    """An argument of the wrong Python type."""


class RendezvousEnvError(InvalidArgumentError):
    """A launcher variable is present but malformed or inconsistent with the others (a ValueError
    and a ``torch.distributed.DistError``); ``commlayer.core.rendezvous`` raises it."""

    def __init__(self, variable: str, expected: str, received: str | None) -> None:
        self.variable = variable
        self.expected = expected
        self.received = received
        shown = "nothing (it is unset)" if received is None else repr(received)
        super().__init__(f"launcher environment variable {variable}: expected {expected}, received {shown}")

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.variable, self.expected, self.received)


class UnsupportedError(InvalidArgumentError):
    """The backend does not support this op, dtype, device or reduce op."""


class PeerFailureError(CommError, DistBackendError):
    """A peer process of the group died (or announced its failure) while this rank needed it.

    ``failed_rank`` is the global rank that died, ``op`` and ``group`` what this rank was doing.
    """

    def __init__(self, message: str, failed_rank: int | None = None, op: str = "", group: str = "") -> None:
        super().__init__(message)
        self.failed_rank = failed_rank
        self.op = op
        self.group = group


class CollectiveMismatchError(CommError, ValueError):
    """Ranks of one group called different collectives (op, dtype, shape, root) at the same sequence.

    ``calls`` maps each global rank to a description of the call it made; raised on every rank.
    """

    def __init__(self, message: str, calls: dict[int, str] | None = None) -> None:
        super().__init__(message)
        self.calls = dict(calls or {})


class CheckpointError(CommError):
    """A checkpoint file is missing or damaged (its checksum differs from the one recorded)."""


def describe_ranks(ranks: Sequence[int]) -> str:
    """``rank 2`` or ``ranks 0, 1, 3``: the wording every multi-rank message uses."""
    ordered = sorted(ranks)
    return ("rank " if len(ordered) == 1 else "ranks ") + ", ".join(map(str, ordered))


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


def missing_extra(missing: ModuleNotFoundError, extra: str, feature: str) -> ModuleNotFoundError:
    """The error to raise when ``feature`` needs a module of the optional part ``extra``.

    ``raise missing_extra(error, "zero", "commlayer.zero") from None`` says
    ``commlayer.zero needs pydantic, which is not installed: pip install 'commlayer[zero]'``.
    """
    module = (missing.name or "a module").split(".")[0]
    hint = ModuleNotFoundError(
        f"{feature} needs {module}, which is not installed: pip install 'commlayer[{extra}]'",
        name=missing.name,
    )
    return hint
