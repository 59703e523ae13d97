"""The mismatch check's shared-memory exchange (commlayer/contract/mismatch/shared_slots.py) on
plain memory.

The slots are the layout an MPI window or a /dev/shm segment holds (two slots per rank); here
they live in one process's bytearrays, with the peers' writes made by the test, so every case is
exact and instant. The same exchange across real ranks: tests/backends/mpi_ranks.py
(check_signatures_meet_in_shared_memory), tests/reliability/test_faults_defaults.py and
tests/reliability/test_mismatch_format.py.
"""

from __future__ import annotations

import time
from array import array

import pytest
import torch

from commlayer.contract.mismatch import Members, SharedMemoryCheck
from commlayer.contract.mismatch.host_segment import slot_words
from commlayer.contract.mismatch.shared_slots import (
    AGREED,
    DIFFERENT,
    PENDING,
    REFUSED,
    SPECULATED,
    SharedSignatures,
    WaitHooks,
)
from commlayer.contract.mismatch.signature import pack
from commlayer.core.errors import CollectiveMismatchError, CommTimeoutError
from commlayer.core.types import ReduceOp
from commlayer.core.work import WaitLimit

_WORDS = 8
LIMIT = WaitLimit(0.05, 0, "MPI", group="tp")


def _world(size: int, words: int = _WORDS) -> list[memoryview]:
    return [memoryview(bytearray(2 * words * 8)).cast("q") for _ in range(size)]


def _publish(slots: memoryview, sequence: int, key: int, count: int, words: int = _WORDS) -> None:
    at = (sequence & 1) * words
    slots[at + 1], slots[at + 2], slots[at] = key, count, sequence


def _exchange(mine: SharedSignatures, key: int, count: int, op: str, deadline_s: float) -> object:
    return mine.gather(mine.publish(key, count), key, count, op, LIMIT, deadline_s)


def _decide(slots: memoryview, sequence: int, decision: int) -> None:
    slots[(sequence & 1) * _WORDS + 3] = sequence * 4 + decision


def test_agreeing_ranks_get_none_and_slots_alternate() -> None:
    world = _world(3)
    mine = SharedSignatures(world, 0)
    for sequence in (1, 2, 3):
        for peer in (1, 2):
            _publish(world[peer], sequence, 77, 4)
        assert _exchange(mine, 77, 4, "all_reduce", 1.0) is None
        at = (sequence & 1) * _WORDS
        assert list(world[0][at : at + 3]) == [sequence, 77, 4]


def test_a_different_count_or_key_gives_the_groups_extremes_and_every_call() -> None:
    world = _world(3)
    mine = SharedSignatures(world, 1)
    _publish(world[0], 1, 77, 8)
    _publish(world[2], 1, 75, 4)
    assert _exchange(mine, 77, 4, "all_reduce", 1.0) == (77, -75, 8, -4)
    assert mine.calls(1) == [(77, 8), (77, 4), (75, 4)]


def test_a_peer_that_never_publishes_is_a_typed_timeout_at_the_deadline() -> None:
    gave_up: list[Exception] = []
    world = _world(2)
    mine = SharedSignatures(world, 0, hooks=WaitHooks(gave_up=gave_up.append))
    _publish(world[1], 1, 77, 4)
    assert _exchange(mine, 77, 4, "all_reduce", 1.0) is None
    started = time.monotonic()
    with pytest.raises(CommTimeoutError, match=r"broadcast: .* \(rank 0\) on group 'tp'"):
        _exchange(mine, 77, 4, "broadcast", 0.05)  # the peer stays at sequence 1
    assert 0.05 <= time.monotonic() - started < 1.0
    assert len(gave_up) == 1 and str(gave_up[0]).startswith("broadcast")


def test_a_refusing_rank_learns_which_call_the_speculators_entered() -> None:
    """Rank 0 saw a mismatch; rank 1 had entered its call (speculated), rank 2 refused too: rank 0
    marks its refusal and gets rank 1's signature, the call it must complete on scratch memory."""
    world = _world(3)
    mine = SharedSignatures(world, 0)
    _publish(world[1], 1, 75, 8)
    _publish(world[2], 1, 77, 4)
    _decide(world[1], 1, SPECULATED)
    _decide(world[2], 1, REFUSED)
    sequence = mine.publish(77, 4)
    assert mine.gather(sequence, 77, 4, "all_reduce", LIMIT, 1.0) == (77, -75, 8, -4)
    assert mine.refuse(sequence, "all_reduce", LIMIT, 1.0) == (75, 8)
    assert world[0][(sequence & 1) * _WORDS + 3] == sequence * 4 + REFUSED


def test_refusing_ranks_with_no_speculator_replay_nothing() -> None:
    world = _world(2)
    mine = SharedSignatures(world, 1)
    for sequence in (1, 2):  # an older decision in the other slot is not this check's
        _publish(world[0], sequence, 75, 8)
        _decide(world[0], sequence, REFUSED)
        assert mine.gather(mine.publish(77, 4), 77, 4, "all_reduce", LIMIT, 1.0) is not None
        assert mine.refuse(sequence, "all_reduce", LIMIT, 1.0) is None


def test_a_peer_that_never_decides_is_a_typed_timeout() -> None:
    world = _world(2)
    mine = SharedSignatures(world, 0)
    _publish(world[1], 1, 75, 8)
    sequence = mine.publish(77, 4)
    assert mine.gather(sequence, 77, 4, "broadcast", LIMIT, 1.0) is not None
    with pytest.raises(CommTimeoutError, match=r"broadcast: .* \(rank 0\) on group 'tp'"):
        mine.refuse(sequence, "broadcast", LIMIT, 0.05)


def _check(world: list[memoryview], group_rank: int) -> SharedMemoryCheck:
    signatures = SharedSignatures(world, group_rank)
    return SharedMemoryCheck(signatures, Members("tp", (4, 6, 9), group_rank), "gloo", LIMIT)


def test_a_mismatch_names_this_ranks_call_and_the_first_differing_peers() -> None:
    """Group ranks 0..2 are global ranks 4, 6, 9: the message speaks of global ranks."""
    words = slot_words(3)
    world = _world(3, words)
    _publish(world[0], 1, pack("all_reduce", torch.float32, reduce_op=ReduceOp.SUM), 4, words)
    _publish(world[2], 1, pack("all_reduce", torch.float32, reduce_op=ReduceOp.SUM), 4, words)
    with pytest.raises(CollectiveMismatchError) as raised:
        _check(world, 1).verify("all_reduce", torch.float32, 8, reduce_op=ReduceOp.SUM)
    assert str(raised.value) == (
        "all_reduce on group 'tp': the ranks called different collectives: rank 6 called "
        "all_reduce(float32[8], op sum), peer rank 4 called all_reduce(float32[4], op sum); "
        "checked by gloo before any data moved"
    )
    assert raised.value.calls == {6: "all_reduce(float32[8], op sum)", 4: "all_reduce(float32[4], op sum)"}


def test_an_exchange_compares_every_pair_of_counts() -> None:
    """Rank 0 sends 3 elements to rank 1, which expects 5 from it; rank 2 sees the pair too."""
    words, size = slot_words(3), 3
    world = _world(size, words)
    key = pack("all_to_all", torch.int64)
    sends = {0: [1, 3, 1], 1: [1, 1, 1]}
    receives = {0: [1, 1, 1], 1: [5, 1, 1]}
    for rank in (0, 1):
        at = words + _WORDS  # slot 1's counts
        world[rank][at : at + size] = array("q", sends[rank])
        world[rank][at + size : at + 2 * size] = array("q", receives[rank])
        _publish(world[rank], 1, key, 0, words)
    with pytest.raises(CollectiveMismatchError) as raised:
        _check(world, 2).verify_exchange("all_to_all", torch.int64, [1, 1, 1], [1, 1, 1])
    expected = "rank 4 called all_to_all(int64, sending 3 to rank 6), peer rank 6 called all_to_all(int64, "
    assert expected + "expecting 5 from rank 4)" in str(raised.value)
    assert "(seen by rank 9)" in str(raised.value)


def test_peek_tells_agreed_pending_and_different_without_waiting() -> None:
    world = _world(3)
    mine = SharedSignatures(world, 0)
    sequence = mine.publish(77, 4)
    assert mine.peek(sequence, 77, 4) == PENDING  # nobody else yet
    _publish(world[1], sequence, 77, 4)
    assert mine.peek(sequence, 77, 4) == PENDING  # rank 2 still missing
    _publish(world[2], sequence, 77, 4)
    assert mine.peek(sequence, 77, 4) == AGREED
    sequence = mine.publish(77, 4)
    _publish(world[2], sequence, 77, 8)  # rank 1 missing, rank 2 differs: no speculating
    assert mine.peek(sequence, 77, 4) == DIFFERENT


def test_a_speculator_is_what_a_refusing_peer_replays() -> None:
    """Rank 0 speculates (rank 1 not yet published); rank 1 then finds the mismatch and learns
    rank 0's call, the one it must complete on scratch memory."""
    world = _world(2)
    early, late = SharedSignatures(world, 0), SharedSignatures(world, 1)
    sequence = early.publish(77, 4)
    assert early.peek(sequence, 77, 4) == PENDING
    early.speculate(sequence)
    assert late.publish(77, 8) == sequence
    assert late.peek(sequence, 77, 8) == DIFFERENT
    assert late.gather(sequence, 77, 8, "all_reduce", LIMIT, 1.0) is not None
    assert late.refuse(sequence, "all_reduce", LIMIT, 1.0) == (77, 4)
    assert early.gather(sequence, 77, 4, "all_reduce", LIMIT, 1.0) is not None  # its confirmation


def test_a_speculating_check_replays_the_speculators_call_and_both_raise() -> None:
    """Through SharedMemoryCheck: the early rank's speculation confirms with the "after" ending,
    the late rank replays the early rank's (key, count) and raises with the "before" ending."""
    words = slot_words(2)
    world = _world(2, words)
    replayed: list[tuple[int, int]] = []
    members = [Members("tp", (4, 6), rank) for rank in (0, 1)]
    early, late = (
        SharedMemoryCheck(
            SharedSignatures(world, rank), members[rank], "gloo", LIMIT, lambda *call: replayed.append(call)
        )
        for rank in (0, 1)
    )
    speculation = early.speculate("all_reduce", torch.float32, 4, reduce_op=ReduceOp.SUM)
    assert speculation is not None
    with pytest.raises(CollectiveMismatchError, match="checked by gloo before any data moved"):
        late.speculate("all_reduce", torch.float32, 8, reduce_op=ReduceOp.SUM)
    assert replayed == [(pack("all_reduce", torch.float32, reduce_op=ReduceOp.SUM), 4)]
    with pytest.raises(CollectiveMismatchError, match="after this rank's call ran") as raised:
        speculation.confirm()
    assert "rank 4 called all_reduce(float32[4], op sum), peer rank 6 called all_reduce(float32[8]" in str(
        raised.value
    )


def test_a_late_matching_rank_neither_speculates_nor_replays() -> None:
    words = slot_words(2)
    world = _world(2, words)
    replayed: list[tuple[int, int]] = []
    checks = [
        SharedMemoryCheck(
            SharedSignatures(world, rank), Members("tp", (0, 1), rank), "gloo", LIMIT, replayed.append
        )
        for rank in (0, 1)
    ]
    speculation = checks[0].speculate("broadcast", torch.int64, 3, root=1)
    assert speculation is not None
    assert checks[1].speculate("broadcast", torch.int64, 3, root=1) is None
    speculation.confirm()
    assert replayed == []
