"""A group's board in host shared memory: which segments each rank shares, and which it has mapped.

Rank ``r`` posts the IPC handle of its ``n``-th shared segment as record ``[r][n]`` and then raises
``posted[r]`` to ``n + 1``; a peer ``q`` that has mapped the first ``m`` of them sets
``acked[q][r] = m``. Reading a count is a load from mapped memory, so every call can look for news
without a system call. Counts only grow, and each is written by one rank alone; a record is
complete before its count covers it (x86-64 keeps stores in order, and the counts are written
after the records through the same mapping).

The group's rank 0 creates the file under ``/dev/shm``; every member maps it and the name is
unlinked once all have (:func:`create` / :func:`open_board` / :meth:`Board.unlink`).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import secrets
from pathlib import Path

from commlayer.core.shm_files import create_mapped

__all__ = ["HANDLE_BYTES", "MAX_RANKS", "MAX_SLOTS", "Board", "create", "open_board"]

MAX_RANKS = 8
MAX_SLOTS = 512
HANDLE_BYTES = 64
_COUNTS = MAX_RANKS + MAX_RANKS * MAX_RANKS
_RECORDS_AT = 4096
_SIZE = _RECORDS_AT + MAX_RANKS * MAX_SLOTS * HANDLE_BYTES
_FOLDER = Path("/dev/shm")


class Board:
    """The mapped board. ``posted[r]``, ``acked(q, r)`` and the records, as described above."""

    def __init__(self, path: Path, memory: mmap.mmap) -> None:
        self.path = path
        self._memory = memory
        self._counts = (ctypes.c_uint32 * _COUNTS).from_buffer(memory)

    def posted(self, rank: int) -> int:
        """How many segments ``rank`` has posted."""
        return self._counts[rank]

    def acked(self, mapper: int, owner: int) -> int:
        """How many of ``owner``'s segments ``mapper`` has mapped."""
        return self._counts[MAX_RANKS + mapper * MAX_RANKS + owner]

    def set_acked(self, mapper: int, owner: int, count: int) -> None:
        self._counts[MAX_RANKS + mapper * MAX_RANKS + owner] = count

    def post(self, rank: int, slot: int, handle: bytes) -> None:
        """Write ``rank``'s record ``slot`` and then count it as posted (slots in order from 0)."""
        if slot != self.posted(rank) or not 0 <= slot < MAX_SLOTS or len(handle) != HANDLE_BYTES:
            raise ValueError(
                f"peermem board: rank {rank} posted slot {slot} (expected {self.posted(rank)}, "
                f"below {MAX_SLOTS}) with a handle of {len(handle)} bytes (expected {HANDLE_BYTES})"
            )
        at = _RECORDS_AT + (rank * MAX_SLOTS + slot) * HANDLE_BYTES
        self._memory[at : at + HANDLE_BYTES] = handle
        self._counts[rank] = slot + 1

    def record(self, rank: int, slot: int) -> bytes:
        at = _RECORDS_AT + (rank * MAX_SLOTS + slot) * HANDLE_BYTES
        return bytes(self._memory[at : at + HANDLE_BYTES])

    def unlink(self) -> None:
        """Remove the name; the mappings stay until each member closes its own."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        del self._counts
        self._memory.close()


def create(prefix: str, folder: Path = _FOLDER) -> Board:
    """A fresh, zeroed board under ``folder`` (its name starts with ``prefix``)."""
    path = folder / f"{prefix}-{os.getpid()}-{secrets.token_hex(6)}"
    return Board(path, create_mapped(path, _SIZE))


def open_board(path: str | Path) -> Board:
    """Map the board another member created."""
    descriptor = os.open(path, os.O_RDWR)
    try:
        memory = mmap.mmap(descriptor, _SIZE)
    finally:
        os.close(descriptor)
    return Board(Path(path), memory)
