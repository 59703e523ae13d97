"""mpi's shared-memory signature exchange (backends/mpi/shared_signatures.py) on plain memory.

The slots are the layout the MPI window holds (two 64-byte slots per rank); here they live in
one process's bytearrays, with the peer's writes made by the test, so every case is exact and
instant. The same exchange across real ranks: tests/backends/mpi_ranks.py
(check_signatures_meet_in_shared_memory) and tests/reliability/test_faults_defaults.py.
"""

from __future__ import annotations

import time

import pytest

from commlayer.backends.mpi import shared_signatures as _shared_signatures
from commlayer.backends.mpi.shared_signatures import SharedSignatures
from commlayer.core.errors import CommTimeoutError
from commlayer.core.work import WaitLimit

_WORDS = 8
LIMIT = WaitLimit(0.05, 0, "MPI", group="tp")


def _world(size: int) -> list[memoryview]:
    return [memoryview(bytearray(2 * _WORDS * 8)).cast("q") for _ in range(size)]


def _publish(slots: memoryview, sequence: int, key: int, count: int) -> None:
    at = (sequence & 1) * _WORDS
    slots[at + 1], slots[at + 2], slots[at] = key, count, sequence


def _exchange(mine: SharedSignatures, key: int, count: int, op: str, deadline_s: float) -> object:
    return mine.gather(mine.publish(key, count), key, count, op, LIMIT, deadline_s)


def _decide(slots: memoryview, sequence: int, decision: int) -> None:
    slots[(sequence & 1) * _WORDS + 3] = sequence * 4 + decision


def test_agreeing_ranks_get_none_and_slots_alternate() -> None:
    world = _world(3)
    mine = SharedSignatures(None, world, 0)
    for sequence in (1, 2, 3):
        for peer in (1, 2):
            _publish(world[peer], sequence, 77, 4)
        assert _exchange(mine, 77, 4, "all_reduce", 1.0) is None
        at = (sequence & 1) * _WORDS
        assert list(world[0][at : at + 3]) == [sequence, 77, 4]


def test_a_different_count_or_key_gives_the_groups_extremes() -> None:
    world = _world(3)
    mine = SharedSignatures(None, world, 1)
    _publish(world[0], 1, 77, 8)
    _publish(world[2], 1, 75, 4)
    assert _exchange(mine, 77, 4, "all_reduce", 1.0) == (77, -75, 8, -4)


def test_a_peer_that_never_publishes_is_a_typed_timeout_at_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    abandoned: list[str] = []
    monkeypatch.setattr(_shared_signatures, "abandon", lambda error, pending: abandoned.append(error))
    world = _world(2)
    mine = SharedSignatures(None, world, 0)
    _publish(world[1], 1, 77, 4)
    assert _exchange(mine, 77, 4, "all_reduce", 1.0) is None
    started = time.monotonic()
    with pytest.raises(CommTimeoutError, match=r"broadcast: .* \(rank 0\) on group 'tp'"):
        _exchange(mine, 77, 4, "broadcast", 0.05)  # the peer stays at sequence 1
    assert 0.05 <= time.monotonic() - started < 1.0
    assert len(abandoned) == 1 and abandoned[0].startswith("CommTimeoutError: broadcast")


def test_a_refusing_rank_learns_which_call_the_speculators_entered() -> None:
    """Rank 0 saw a mismatch; rank 1 had entered its call (speculated), rank 2 refused too: rank 0
    marks its refusal and gets rank 1's signature, the call it must complete on scratch memory."""
    world = _world(3)
    mine = SharedSignatures(None, world, 0)
    _publish(world[1], 1, 75, 8)
    _publish(world[2], 1, 77, 4)
    _decide(world[1], 1, _shared_signatures.SPECULATED)
    _decide(world[2], 1, _shared_signatures.REFUSED)
    sequence = mine.publish(77, 4)
    assert mine.gather(sequence, 77, 4, "all_reduce", LIMIT, 1.0) == (77, -75, 8, -4)
    assert mine.refuse(sequence, "all_reduce", LIMIT, 1.0) == (75, 8)
    assert world[0][(sequence & 1) * _WORDS + 3] == sequence * 4 + _shared_signatures.REFUSED


def test_refusing_ranks_with_no_speculator_replay_nothing() -> None:
    world = _world(2)
    mine = SharedSignatures(None, world, 1)
    for sequence in (1, 2):  # an older decision in the other slot is not this check's
        _publish(world[0], sequence, 75, 8)
        _decide(world[0], sequence, _shared_signatures.REFUSED)
        assert mine.gather(mine.publish(77, 4), 77, 4, "all_reduce", LIMIT, 1.0) is not None
        assert mine.refuse(sequence, "all_reduce", LIMIT, 1.0) is None


def test_a_peer_that_never_decides_is_a_typed_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_shared_signatures, "abandon", lambda error, pending: None)
    world = _world(2)
    mine = SharedSignatures(None, world, 0)
    _publish(world[1], 1, 75, 8)
    sequence = mine.publish(77, 4)
    assert mine.gather(sequence, 77, 4, "broadcast", LIMIT, 1.0) is not None
    with pytest.raises(CommTimeoutError, match=r"broadcast: .* \(rank 0\) on group 'tp'"):
        mine.refuse(sequence, "broadcast", LIMIT, 0.05)
