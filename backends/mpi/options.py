"""Options of the mpi backend, passed as ``pg_options`` to init_process_group or new_group."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from commlayer.errors import invalid_argument

__all__ = ["BLOCKING_SYNC_ENV", "MpiOptions"]

BLOCKING_SYNC_ENV = "COMMLAYER_MPI_BLOCKING_SYNC"


@dataclass(frozen=True)
class MpiOptions:
    """``pg_options`` of the mpi backend, e.g. ``init_process_group("mpi", pg_options=MpiOptions(True))``.

    ``blocking_sync_ops``: synchronous collectives as MPI's blocking calls (see the module doc for
    the price). A subgroup created without options keeps its parent's.
    """

    blocking_sync_ops: bool = False

    @classmethod
    def resolve(cls, options: Any, environ: Mapping[str, str], rank: int) -> MpiOptions:
        """``options`` if it is an MpiOptions, else the defaults with $COMMLAYER_MPI_BLOCKING_SYNC."""
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
        return cls(
            blocking_sync_ops=environ.get(BLOCKING_SYNC_ENV, "").strip().lower() in ("1", "true", "yes", "on")
        )
