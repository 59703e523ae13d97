"""Which of the callers' tensors peers can reach in place: the group's registered segments.

A tensor lies in a segment of the caching allocator (one cudaMalloc). The first time a call meets
a segment, this rank posts its IPC handle on the group's board (:mod:`.board`) under the next free
slot; each peer maps it at its next call and acknowledges it. From then on, a call whose tensor
lies in that segment tells its peers ``(slot, offset)`` and they read or write the tensor where it
lies; until every peer has acknowledged the slot the call stages the tensor as before. No rank
ever waits for another here, and a rank names a slot only once every peer has it mapped, so the
kernels never meet a slot they cannot resolve.

A segment is known by the driver's buffer id, unique for the process's lifetime: a segment freed
and allocated again at the same address is a new segment with a new slot. Slots are never
reused; once all are taken, new segments stay staged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

from commlayer.backends.peermem.board import MAX_SLOTS, Board

__all__ = ["NOT_PLACED", "Registry", "Segment"]

#: The place of a tensor peers cannot reach in place: the call stages it.
NOT_PLACED = (-1, 0)


class Segment(NamedTuple):
    """One allocation, as the driver describes the memory behind a pointer (looked up every
    zero-copy call: a tuple, the cheapest to make)."""

    buffer_id: int
    base: int
    size: int
    shareable: bool


class Registry:
    """This rank's view of the group's registered segments (its own and its peers')."""

    def __init__(self, board: Board, rank: int, world: int, max_slots: int = MAX_SLOTS) -> None:
        self.board, self.rank, self.world, self.max_slots = board, rank, world, max_slots
        self._slots: dict[int, int] = {}
        self._next = 0
        self._ready = 0
        self._peers = [peer for peer in range(world) if peer != rank]
        self._mapped = [0] * world
        self._stuck = [False] * world

    def place(self, segment: Segment | None, pointer: int) -> tuple[int, int]:
        """``(slot, offset)`` of ``pointer`` when every peer maps its segment, else NOT_PLACED."""
        if segment is None:
            return NOT_PLACED
        slot = self._slots.get(segment.buffer_id)
        if slot is None or not self.is_ready(slot):
            return NOT_PLACED
        return slot, pointer - segment.base

    def is_ready(self, slot: int) -> bool:
        """Whether every peer has mapped this rank's ``slot``."""
        if slot < self._ready:
            return True
        self._ready = min((self.board.acked(peer, self.rank) for peer in self._peers), default=self._next)
        return slot < self._ready

    def share(self, segment: Segment | None, export: Callable[[int], bytes | None]) -> int | None:
        """Post ``segment`` under a new slot unless it has one; returns the new slot, or None.

        ``export(base)`` gives the segment's IPC handle, or None when it cannot be shared.
        """
        if segment is None or not segment.shareable or segment.buffer_id in self._slots:
            return None
        if self._next >= self.max_slots:
            return None
        handle = export(segment.base)
        if handle is None:
            return None
        slot = self._next
        self.board.post(self.rank, slot, handle)
        self._slots[segment.buffer_id] = slot
        self._next += 1
        return slot

    def news(self) -> Iterator[tuple[int, int, bytes]]:
        """Peers' posted segments this rank has yet to map: ``(peer, slot, handle)``, in order.

        Each is read as it is taken, so a peer whose segment failed to map (:meth:`mapped`) yields
        no more, not even the rest of this pass's.
        """
        for peer in self._peers:
            for slot in range(self._mapped[peer], self.board.posted(peer)):
                if self._stuck[peer]:
                    break
                yield peer, slot, self.board.record(peer, slot)

    def mapped(self, peer: int, slot: int, ok: bool) -> None:
        """Record the outcome of mapping ``peer``'s ``slot`` (in order); acknowledge it if ``ok``.

        A slot that failed to map is never acknowledged, so ``peer`` keeps staging it and every
        later segment of its own: this rank stops mapping that peer's segments.
        """
        if self._stuck[peer] or slot != self._mapped[peer]:
            return
        if not ok:
            self._stuck[peer] = True
            return
        self._mapped[peer] = slot + 1
        self.board.set_acked(self.rank, peer, slot + 1)

    def slot_of(self, segment: Segment) -> int | None:
        """This rank's slot for ``segment``, mapped by its peers or not."""
        return self._slots.get(segment.buffer_id)
