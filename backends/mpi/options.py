"""Options of the mpi backend, passed as ``pg_options`` to init_process_group or new_group."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from commlayer.core import settings
from commlayer.core.errors import invalid_argument

__all__ = ["BLOCKING_SYNC_ENV", "MODES", "MODE_ENV", "VERIFY_ENV", "MpiOptions"]

MODE_ENV = settings.MPI_MODE.name
# "0" turns off the check that ranks agree on each collective's signature (see _signature).
VERIFY_ENV = settings.MPI_VERIFY.name
# Kept from before modes existed: "1" means mode "blocking".
BLOCKING_SYNC_ENV = settings.MPI_BLOCKING_SYNC.name

#: How collectives reach MPI (see the mpi backend's module doc):
#: "ordered"  every collective is MPI's blocking call, in call order; async ones on a worker thread;
#: "requests" every collective is a non-blocking request; synchronous ones wait for it in place;
#: "blocking" synchronous ops are blocking calls, async ones requests: ranks must agree on async_op.
MODES = settings.MPI_MODE.choices


@dataclass(frozen=True)
class MpiOptions:
    """``pg_options`` of the mpi backend, e.g. ``init_process_group("mpi", pg_options=MpiOptions("requests"))``.

    A subgroup created without options keeps its parent's. ``verify`` (default on, or
    ``$COMMLAYER_MPI_VERIFY``) checks before each collective that every rank called the same op
    with the same dtype, element count, root and reduce op (one 32-byte Allreduce), raising
    CollectiveMismatchError instead of letting MPI return garbage.
    """

    mode: str = "ordered"
    verify: bool = True

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise invalid_argument("MpiOptions", "mode", f"one of {MODES}", repr(self.mode), None)

    @classmethod
    def resolve(cls, options: Any, environ: Mapping[str, str], rank: int) -> MpiOptions:
        """``options`` if it is an MpiOptions, else the mode from $COMMLAYER_MPI_MODE (default ordered)."""
        if isinstance(options, MpiOptions):
            return options
        if options is not None:
            raise invalid_argument(
                "mpi backend",
                "pg_options",
                "None or commlayer.backends.mpi.MpiOptions",
                type(options).__name__,
                rank,
            )
        mode = (settings.MPI_MODE.text(environ) or "").lower()
        if not mode and settings.MPI_BLOCKING_SYNC.value(environ):
            mode = "blocking"
        if mode and mode not in MODES:
            raise invalid_argument("mpi backend", f"${MODE_ENV}", f"one of {MODES}", repr(mode), rank)
        return cls(mode or "ordered", bool(settings.MPI_VERIFY.value(environ)))
