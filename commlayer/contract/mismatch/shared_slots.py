"""The signature exchange through shared memory, for a group whose ranks all share one host.

Each rank owns two slots of ``words`` int64 words (at least 8: one 64-byte cache line) in memory
every rank of the group maps, an MPI shared window (the mpi backend) or a /dev/shm segment
(:mod:`.host_segment`, gloo and ccl). For its n-th check a rank writes ``(key, count)``, then
``n``, into slot ``n % 2``, waits until every peer's slot ``n % 2`` holds ``n``, and reads their
signatures. Every rank sees the same set, so every rank decides alike; a check costs a fraction
of a microsecond where a reduction through the library is a round trip.

Word layout of a slot: 0 the sequence, 1 the key, 2 the count, 3 the decision (below), then an
exchange's per-peer counts where the slot is wider (:meth:`SharedSignatures.publish_counts`).

Two slots suffice: a rank writes check n + 2 into slot ``n % 2`` only after passing check n + 1,
which needs every peer to have published n + 1, which each does only after it is done with
check n.

A rank may also *speculate* (mpi's C fast path, csrc/mpi/fast_paths.cpp, for calls whose inputs
MPI never writes; gloo's blocking collectives, :meth:`SharedSignatures.peek`): it publishes, and
if every peer that has published agrees, it
marks its slot's decision word "speculated" and enters the call without waiting for the rest,
comparing once the call returns. A rank that sees a mismatch marks "refused" and waits for every
peer's decision (:meth:`SharedSignatures.refuse`): if any peer speculated, it runs that call on
scratch memory so that the speculator's call completes, then every rank raises (mpi's
speculation.py). Speculators all carry one signature: each publishes, fences, then reads (a
Dekker pair), so of any two ranks at least one sees the other, and a rank that sees a disagreeing
peer never speculates. Ranks that never speculate need not decide at all.

Plain loads and stores keep the writer's order (signature, then sequence) for the reader only
under x86's total store order (:data:`TOTAL_STORE_ORDER`); elsewhere a backend checks by
reduction. The wait polls, then yields the CPU (a peer may share it), and gives up at
``deadline_s`` with the group's typed error (a dead peer's PeerFailureError, else
CommTimeoutError), after telling the backend's :class:`WaitHooks`.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import platform
import threading
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from commlayer.core import health
from commlayer.core.work import WaitLimit

__all__ = [
    "AGREED",
    "DIFFERENT",
    "NO_HOOKS",
    "PENDING",
    "REFUSED",
    "SPECULATED",
    "WORDS",
    "SharedSignatures",
    "WaitHooks",
    "shared_memory_is_ordered",
]

WORDS = 8  # the smallest slot: sequence, key, count, decision, padding to one 64-byte cache line
# The decision word of check n: n << _DECISION_SHIFT | one of these (written only by ranks that
# speculate or refuse; csrc/mpi/shared_slots.hpp writes the same).
SPECULATED, REFUSED = 1, 2
_DECISION_SHIFT = 2
# What :meth:`SharedSignatures.peek` saw of the peers without waiting.
AGREED, PENDING, DIFFERENT = "agreed", "pending", "different"
_SLOTS = 2
_POLLS = 64  # polls before the first yield (~3 us of Python): a peer on another core arrives by then
_SLEEP_AFTER_S = 0.01  # then yield for this long, then sleep between polls (a slow peer, a long wait)
_SLEEP_S = 0.0001
_TOTAL_STORE_ORDER = ("x86_64", "amd64", "i386", "i686")
_monotonic = time.monotonic


def _yielder() -> Callable[[], None]:
    """How a waiting rank yields: sched_yield, except on a rank bound to one core. There a rank
    that kept yielding left its library's own threads (gloo's) waiting on that core for the
    scheduler's next tick, where a zero-length sleep lets them run."""
    one_core = hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) == 1
    return functools.partial(time.sleep, 0) if one_core else os.sched_yield


# Acquiring and releasing a lock runs a locked instruction, which x86 never reorders with the
# loads after it: the fence between a speculator's publish and its reads of the peers.
_fence_lock = threading.Lock()


def shared_memory_is_ordered() -> bool:
    """Whether this CPU keeps plain stores in order for other cores (x86's total store order)."""
    return platform.machine().lower() in _TOTAL_STORE_ORDER


@dataclass(frozen=True)
class WaitHooks:
    """What a backend adds around the exchange's waits: ``waiting()`` is entered while this rank
    waits for a peer (mpi's watchdog then leaves the wait to raise), and ``gave_up(error)`` runs
    before the wait raises ``error`` at its deadline (mpi remembers the op as abandoned)."""

    waiting: Callable[[], contextlib.AbstractContextManager[Any]] = field(default=contextlib.nullcontext)
    gave_up: Callable[[Exception], None] = field(default=lambda error: None)


NO_HOOKS = WaitHooks()


class SharedSignatures:
    """Each rank's slots in one shared memory; see the module docstring.

    ``slots[r]`` is group rank r's two slots as int64 words; ``release`` frees the memory (called
    by :meth:`free`); ``addresses``, where given, are the same slots' addresses for C code.
    """

    def __init__(
        self,
        slots: Sequence[memoryview],
        rank: int,
        release: Callable[[], None] | None = None,
        addresses: Sequence[int] | None = None,
        hooks: WaitHooks = NO_HOOKS,
    ) -> None:
        self._release = release
        self._all = tuple(slots)
        self._mine = slots[rank]
        self._rank = rank
        self._peers = tuple(view for index, view in enumerate(slots) if index != rank)
        self._words = len(self._mine) // _SLOTS
        self._addresses = (
            None
            if addresses is None
            else (addresses[rank], tuple(at for index, at in enumerate(addresses) if index != rank))
        )
        self._hooks = hooks
        self._yield = _yielder()
        self._sequences = itertools.count(1)
        self._next_sequence = self._sequences.__next__

    @property
    def size(self) -> int:
        """How many ranks share these slots."""
        return len(self._all)

    def addresses(self) -> tuple[int, tuple[int, ...]] | None:
        """(this rank's slots, its peers') as addresses: where C code publishes and reads, the same
        memory as :meth:`publish` and :meth:`gather`; None if not given."""
        return self._addresses

    def sequence_counter(self) -> Iterator[int]:
        """The iterator every check takes its sequence number from, C code's included."""
        return self._sequences

    def publish(self, key: int, count: int) -> int:
        """Write this rank's next signature; its sequence number is what :meth:`gather` waits for.

        Publishing as early as the call is known, and gathering right before the data call, lets
        the peers' arrival overlap the caller's own work in between."""
        sequence = self._next_sequence()
        at = (sequence & 1) * self._words
        mine = self._mine
        mine[at + 1] = key
        mine[at + 2] = count
        mine[at] = sequence  # last: a peer that sees it sees the signature
        return sequence

    def publish_counts(self, key: int, sends: Sequence[int], receives: Sequence[int]) -> int:
        """:meth:`publish` of an exchange (count 0) with its per-peer element counts: what this
        rank sends to each group rank, and expects from each (slots of ``8 + 2 x size`` words)."""
        sequence = self._next_sequence()
        at = (sequence & 1) * self._words
        size, mine = len(self._all), self._mine
        mine[at + WORDS : at + WORDS + size] = array("q", sends)
        mine[at + WORDS + size : at + WORDS + 2 * size] = array("q", receives)
        mine[at + 1] = key
        mine[at + 2] = 0
        mine[at] = sequence
        return sequence

    def gather(
        self, sequence: int, key: int, count: int, op: str, limit: WaitLimit, deadline_s: float
    ) -> tuple[int, int, int, int] | None:
        """Wait for every peer's ``sequence`` and compare: None when every rank passed ``key`` and
        ``count``, else the group's ``(max key, -min key, max count, -min count)``, as a
        reduction's check gives it. A rank that may face speculators then calls :meth:`refuse`."""
        at = (sequence & 1) * self._words
        agreed = True
        for slots in self._peers:
            if slots[at] != sequence:
                self._wait(slots, at, sequence, op, limit, deadline_s)
            if slots[at + 1] != key or slots[at + 2] != count:
                agreed = False
        return None if agreed else self._extremes(at, key, count)

    def peek(self, sequence: int, key: int, count: int) -> str:
        """After :meth:`publish` and a fence: AGREED when every peer published ``sequence`` with
        ``key`` and ``count``, PENDING when those who did agree and some did not yet, else
        DIFFERENT. Never waits; a PENDING rank may :meth:`speculate`."""
        _fence_lock.acquire()
        _fence_lock.release()
        return self._seen(sequence, key, count)

    def agreed(self, sequence: int, key: int, count: int) -> bool:
        """Whether every peer has published ``sequence`` with ``key`` and ``count``, read without
        waiting or fencing: a speculator's confirmation, once its call has returned."""
        return self._seen(sequence, key, count) is AGREED

    def _seen(self, sequence: int, key: int, count: int) -> str:
        at, missing = (sequence & 1) * self._words, False
        for slots in self._peers:
            if slots[at] != sequence:
                missing = True
            elif slots[at + 1] != key or slots[at + 2] != count:
                return DIFFERENT
        return PENDING if missing else AGREED

    def speculate(self, sequence: int) -> None:
        """Mark check ``sequence`` speculated: this rank enters its call before every peer has
        published; a peer that then finds a mismatch runs the call on scratch memory (see
        :meth:`refuse`) and this rank compares once its call returns (:meth:`gather`)."""
        at = (sequence & 1) * self._words
        self._mine[at + 3] = sequence << _DECISION_SHIFT | SPECULATED

    def calls(self, sequence: int) -> list[tuple[int, int]]:
        """Every group rank's ``(key, count)`` of check ``sequence``, once :meth:`gather` returned."""
        at = (sequence & 1) * self._words
        return [(slots[at + 1], slots[at + 2]) for slots in self._all]

    def counts(self, sequence: int) -> list[tuple[list[int], list[int]]]:
        """Every group rank's (sends, receives) of exchange ``sequence``, once gathered."""
        at, size = (sequence & 1) * self._words + WORDS, len(self._all)
        return [(list(slots[at : at + size]), list(slots[at + size : at + 2 * size])) for slots in self._all]

    def refuse(self, sequence: int, op: str, limit: WaitLimit, deadline_s: float) -> tuple[int, int] | None:
        """After :meth:`gather` found a mismatch: mark this rank's check ``sequence`` refused and
        wait for every peer's decision. Returns the ``(key, count)`` the speculators entered their
        call with, which this rank must run on scratch memory before raising, or None if none did."""
        at = (sequence & 1) * self._words
        self._mine[at + 3] = sequence << _DECISION_SHIFT | REFUSED
        speculated = None
        for slots in self._peers:
            decided = slots[at + 3]
            if decided >> _DECISION_SHIFT != sequence:
                self._wait(slots, at + 3, sequence, op, limit, deadline_s, _DECISION_SHIFT)
                decided = slots[at + 3]
            if decided - (sequence << _DECISION_SHIFT) == SPECULATED:
                speculated = (slots[at + 1], slots[at + 2])
        return speculated

    def _extremes(self, at: int, key: int, count: int) -> tuple[int, int, int, int]:
        keys = [key, *(slots[at + 1] for slots in self._peers)]
        counts = [count, *(slots[at + 2] for slots in self._peers)]
        return max(keys), -min(keys), max(counts), -min(counts)

    def _wait(
        self,
        slots: memoryview,
        at: int,
        sequence: int,
        op: str,
        limit: WaitLimit,
        deadline_s: float,
        shift: int = 0,
    ) -> None:
        """Until the peer's word ``at``, shifted right by ``shift`` (``_DECISION_SHIFT`` for a
        decision word), is ``sequence``: poll, then yield, then sleep; typed error at the deadline."""
        for _ in range(_POLLS):
            if slots[at] >> shift == sequence:
                return
        started = _monotonic()
        with self._hooks.waiting():
            while slots[at] >> shift != sequence:
                waited = _monotonic() - started
                if waited > _SLEEP_AFTER_S:
                    if waited > deadline_s or health.current() is not None:
                        error = limit.expired(op)
                        self._hooks.gave_up(error)
                        raise error
                    time.sleep(_SLEEP_S)
                else:
                    self._yield()

    def free(self) -> None:
        """Release the memory (for an MPI window, collective over the communicator)."""
        self._mine = memoryview(b"").cast("q")
        self._peers = self._all = ()
        if self._release is not None:
            self._release()
