"""The mismatch check's exchange through shared memory, for a communicator whose ranks share a host.

The default check (:mod:`.signature`) needs every rank's packed signature before the data moves.
Across hosts that is one 32-byte ``Allreduce(MAX)``; inside one host it is a cache line away: each
rank owns two 64-byte slots in an ``MPI.Win.Allocate_shared`` window (MPI allocates and frees it:
no /dev/shm name, nothing left behind by a killed job) and, for its n-th check, writes
``(key, count)`` then ``n`` into slot ``n % 2``, waits until every peer's slot ``n % 2`` holds
``n``, and reads their signatures. Every rank sees the same set, so every rank decides alike.

A rank may also *speculate* (only the C launcher does, csrc/mpi/fast_paths.cpp, for calls whose
inputs MPI never writes): it publishes, and if every peer that has published agrees, it marks
its slot's decision word "speculated" and enters the MPI call without waiting for the rest,
comparing once the call returns. A rank that sees a mismatch marks "refused" and waits for every
peer's decision (:meth:`SharedSignatures.refuse`): if any peer speculated, it runs that call on
scratch memory so that the speculator's call completes, then every rank raises. Speculators all
carry one signature: each publishes, fences, then reads (a Dekker pair), so of any two ranks at
least one sees the other, and a rank that sees a disagreeing peer never speculates. So inputs are
never touched; a speculator's output is undefined after the error, and its error says so.

Two slots suffice: a rank writes check n + 2 into slot ``n % 2`` only after passing check n + 1,
which needs every peer to have published n + 1, which each does only after it is done with
check n (read the signatures, waited for the decisions, replayed a speculator's call).

Plain loads and stores keep the writer's order (signature, then sequence) for the reader only
under x86's total store order, so elsewhere :func:`open_shared_signatures` returns None and the
check stays the Allreduce. The wait polls, then yields the CPU (a peer may share it), and gives up
at ``deadline_s`` with the group's typed error (a dead peer's PeerFailureError, else
CommTimeoutError), which the caller may catch: no MPI call is in progress, so the watchdog of
synchronous calls leaves this wait to raise (:mod:`.bounded_waits`); the op is then remembered as abandoned (a peer that read this rank's signature
may be inside the data call), so the job ends with MPI_Abort at exit instead of hanging in
MPI_Finalize.
"""

from __future__ import annotations

import itertools
import os
import platform
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

from commlayer.backends.mpi.bounded_waits import raising_wait
from commlayer.backends.mpi.runtime import abandon
from commlayer.core import health
from commlayer.core.work import WaitLimit

__all__ = ["SharedSignatures", "open_shared_signatures"]

_WORDS = 8  # int64 words per slot: sequence, key, count, decision, padding to one 64-byte cache line
# The decision word of check n: n << _DECISION_SHIFT | one of these (written only by ranks that
# speculate or refuse; csrc/mpi/shared_slots.hpp writes the same).
SPECULATED, REFUSED = 1, 2
_DECISION_SHIFT = 2
_SLOTS = 2
_POLLS = 64  # polls before the first yield (~3 us of Python): a peer on another core arrives by then
_SLEEP_AFTER_S = 0.01  # then yield for this long, then sleep between polls (a slow peer, a long wait)
_SLEEP_S = 0.0001
_TOTAL_STORE_ORDER = ("x86_64", "amd64", "i386", "i686")
# Open MPI asks its osc/ucx component first for every window; where UCX has no usable device it
# prints this (and a blank line) to stderr, then osc/sm serves the window as asked.
_UCX_QUERY_NOISE = "OSC UCX component priority set inside component query failed"
_monotonic = time.monotonic
_yield = os.sched_yield


class SharedSignatures:
    """Each rank's ``(sequence, key, count)`` slots in one shared window; see the module docstring."""

    def __init__(
        self, window: Any, slots: list[memoryview], rank: int, addresses: Sequence[int] | None = None
    ) -> None:
        self._window = window
        self._mine = slots[rank]
        self._peers = tuple(view for index, view in enumerate(slots) if index != rank)
        self._addresses = (
            None
            if addresses is None
            else (addresses[rank], tuple(at for index, at in enumerate(addresses) if index != rank))
        )
        self._sequences = itertools.count(1)
        self._next_sequence = self._sequences.__next__

    def addresses(self) -> tuple[int, tuple[int, ...]] | None:
        """(this rank's slots, its peers') as addresses: where the C launcher (csrc/mpi) publishes
        and reads, the same memory as :meth:`publish` and :meth:`gather`; None if not given."""
        return self._addresses

    def sequence_counter(self) -> Iterator[int]:
        """The iterator every check takes its sequence number from, the C launcher's included."""
        return self._sequences

    def publish(self, key: int, count: int) -> int:
        """Write this rank's next signature; its sequence number is what :meth:`gather` waits for.

        Publishing as early as the call is known, and gathering right before the data call, lets
        the peers' arrival overlap the caller's own work in between."""
        sequence = self._next_sequence()
        at = (sequence & 1) * _WORDS
        mine = self._mine
        mine[at + 1] = key
        mine[at + 2] = count
        mine[at] = sequence  # last: a peer that sees it sees the signature
        return sequence

    def gather(
        self, sequence: int, key: int, count: int, op: str, limit: WaitLimit, deadline_s: float
    ) -> tuple[int, int, int, int] | None:
        """Wait for every peer's ``sequence`` and compare: None when every rank passed ``key`` and
        ``count``, else the group's ``(max key, -min key, max count, -min count)``, as the
        Allreduce check's. A rank that did not speculate then calls :meth:`refuse`."""
        at = (sequence & 1) * _WORDS
        agreed = True
        for slots in self._peers:
            if slots[at] != sequence:
                _wait(slots, at, sequence, op, limit, deadline_s)
            if slots[at + 1] != key or slots[at + 2] != count:
                agreed = False
        return None if agreed else self._extremes(at, key, count)

    def refuse(self, sequence: int, op: str, limit: WaitLimit, deadline_s: float) -> tuple[int, int] | None:
        """After :meth:`gather` found a mismatch: mark this rank's check ``sequence`` refused and
        wait for every peer's decision. Returns the ``(key, count)`` the speculators entered MPI
        with, which this rank must run on scratch memory before raising, or None if none did."""
        at = (sequence & 1) * _WORDS
        self._mine[at + 3] = sequence << _DECISION_SHIFT | REFUSED
        speculated = None
        for slots in self._peers:
            decided = slots[at + 3]
            if decided >> _DECISION_SHIFT != sequence:
                _wait(slots, at + 3, sequence, op, limit, deadline_s, _DECISION_SHIFT)
                decided = slots[at + 3]
            if decided - (sequence << _DECISION_SHIFT) == SPECULATED:
                speculated = (slots[at + 1], slots[at + 2])
        return speculated

    def _extremes(self, at: int, key: int, count: int) -> tuple[int, int, int, int]:
        keys = [key, *(slots[at + 1] for slots in self._peers)]
        counts = [count, *(slots[at + 2] for slots in self._peers)]
        return max(keys), -min(keys), max(counts), -min(counts)

    def free(self) -> None:
        """Release the window (collective over the communicator, like freeing it)."""
        self._mine = memoryview(b"")
        self._peers = ()
        self._window.Free()


def _wait(
    slots: memoryview,
    at: int,
    sequence: int,
    op: str,
    limit: WaitLimit,
    deadline_s: float,
    shift: int = 0,
) -> None:
    """Until the peer's word ``at``, shifted right by ``shift`` (``_DECISION_SHIFT`` for a decision
    word), is ``sequence``: poll, then yield, then sleep; typed error at the deadline."""
    for _ in range(_POLLS):
        if slots[at] >> shift == sequence:
            return
    started = _monotonic()
    with raising_wait():  # no MPI call is in progress: the error can reach the caller
        while slots[at] >> shift != sequence:
            waited = _monotonic() - started
            if waited > _SLEEP_AFTER_S:
                if waited > deadline_s or health.current() is not None:
                    error = limit.expired(op)
                    abandon(f"{type(error).__name__}: {error}", lambda: True)
                    raise error
                time.sleep(_SLEEP_S)
            else:
                _yield()


def open_shared_signatures(comm: Any, mpi: Any) -> SharedSignatures | None:
    """The shared slots of ``comm``'s ranks (collective), or None: ranks on several hosts, or no TSO.

    Every rank of ``comm`` must call it; all of them get None or all a window.
    """
    if platform.machine().lower() not in _TOTAL_STORE_ORDER:
        return None
    node = comm.Split_type(mpi.COMM_TYPE_SHARED)
    try:
        if node.Get_size() != comm.Get_size():  # the same answer on every rank: a partition of comm
            return None
        window = _allocate_quietly(mpi, comm)
    finally:
        node.Free()
    buffers = [window.Shared_query(rank)[0] for rank in range(comm.Get_size())]
    slots = [memoryview(buffer).cast("B").cast("q") for buffer in buffers]
    mine = slots[comm.Get_rank()]
    for index in range(len(mine)):
        mine[index] = 0  # MPI does not zero the window; sequences start at 1
    comm.Barrier()  # every slot is zero before any rank publishes its first check
    return SharedSignatures(window, slots, comm.Get_rank(), [buffer.address for buffer in buffers])


def _allocate_quietly(mpi: Any, comm: Any) -> Any:
    """``Win.Allocate_shared`` of the slots, without Open MPI's osc/ucx query error on stderr (every
    group's creation would print it); anything else written meanwhile is passed on."""
    sys.stderr.flush()
    with tempfile.TemporaryFile() as captured:
        saved = os.dup(2)
        os.dup2(captured.fileno(), 2)
        try:
            return mpi.Win.Allocate_shared(_SLOTS * _WORDS * 8, 8, comm=comm)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            lines = captured.read().decode(errors="replace").splitlines(keepends=True)
            kept = [line for line in lines if line.strip() and _UCX_QUERY_NOISE not in line]
            sys.stderr.write("".join(kept))
