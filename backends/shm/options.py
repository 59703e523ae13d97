"""Options of the shm backend, passed as ``pg_options`` to init_process_group or new_group."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from commlayer.core.errors import invalid_argument

__all__ = ["ShmOptions"]


@dataclass(frozen=True)
class ShmOptions:
    """``pg_options`` of the shm backend, e.g. ``init_process_group("shm", pg_options=ShmOptions())``.

    Each rank of a group owns one region of ``2 * small_bytes + 2 * chunk_bytes`` (plus 256 bytes
    of control, rounded up to a page) in the group's segment: 2.2 MiB by default, so a group of
    ``n`` ranks maps ``n * 2.2 MiB`` on each of them.

    - ``small_bytes``: messages up to this size take the latency path (one synchronisation per op,
      double-buffered); larger ones the bandwidth path. all_reduce takes the latency path only up
      to 4 KiB (or ``small_bytes`` if smaller): above, splitting the reduction across ranks wins.
    - ``chunk_bytes``: the bandwidth path moves data in rounds of this many bytes per rank.
    - ``spins``: busy polls of a waiting rank before it yields its core (and releases the GIL).
    """

    small_bytes: int = 64 * 1024
    chunk_bytes: int = 1024 * 1024
    spins: int = 256

    def __post_init__(self) -> None:
        for name, low in (("small_bytes", 64), ("chunk_bytes", 4096), ("spins", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or value < low:
                raise invalid_argument("ShmOptions", name, f"an int >= {low}", repr(value), None)
        if self.small_bytes % 64 or self.chunk_bytes % 64:
            raise invalid_argument(
                "ShmOptions",
                "small_bytes/chunk_bytes",
                "multiples of 64",
                (self.small_bytes, self.chunk_bytes),
                None,
            )

    @classmethod
    def resolve(cls, options: Any, rank: int) -> ShmOptions:
        """``options`` if it is a ShmOptions, the defaults for None; anything else is an error."""
        if isinstance(options, ShmOptions):
            return options
        if options is not None:
            raise invalid_argument(
                "shm backend",
                "pg_options",
                "None or commlayer.backends.shm.ShmOptions",
                type(options).__name__,
                rank,
            )
        return cls()
