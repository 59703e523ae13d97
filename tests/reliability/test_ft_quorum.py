"""Pure logic of the fault-tolerance quorum: who trains, from which step, who sends each shard."""

from __future__ import annotations

import pytest

from commlayer.ft import (
    Decision,
    FaultToleranceOptions,
    NoHealthyReplicaError,
    Registration,
    decide,
    joinable_replicas,
)

OPTIONS = FaultToleranceOptions(replicas=2, shards=2)


def regs(**steps: int) -> dict[int, Registration]:
    return {int(name[1:]): Registration(f"inc{name}", step) for name, step in steps.items()}


def test_fresh_start_needs_no_transfer() -> None:
    decision = decide(1, regs(m0=0, m1=0, m2=0, m3=0), OPTIONS, sharded=True)
    assert decision == Decision(1, (0, 1, 2, 3), 0, {}, {m: f"incm{m}" for m in range(4)})


def test_survivors_keep_complete_replicas_only() -> None:
    decision = decide(2, regs(m0=5, m1=5, m3=5), OPTIONS, sharded=True)
    assert decision is not None and decision.members == (0, 1) and decision.sources == {}
    assert decision.replicas(OPTIONS) == [0]


def test_replacement_gets_each_shard_from_a_holder() -> None:
    decision = decide(3, regs(m0=7, m1=7, m2=-1, m3=7), OPTIONS, sharded=True)
    assert decision is not None and decision.members == (0, 1, 2, 3)
    assert decision.step == 7 and decision.sources == {0: 0, 1: 1}


def test_lost_shard_raises_a_clear_error() -> None:
    with pytest.raises(NoHealthyReplicaError, match="no live member holds shard 0 of the state at step 4"):
        decide(4, regs(m0=-1, m1=4, m2=-1, m3=4), OPTIONS, sharded=True)


def test_unsharded_state_survives_any_single_holder() -> None:
    decision = decide(4, regs(m0=-1, m1=4, m2=-1, m3=-1), OPTIONS, sharded=False)
    assert decision is not None and decision.sources == {0: 1}


def test_waits_while_no_replica_is_complete_or_a_holder_stands_by() -> None:
    assert decide(1, regs(m0=-1), OPTIONS, sharded=True) is None
    # shard 0's newest state is on member 2, whose replica is incomplete: wait for its replacement
    assert decide(5, regs(m0=-1, m1=6, m2=6), OPTIONS, sharded=True) is None


def test_joinable_replicas() -> None:
    assert joinable_replicas({2, 3}, {0, 1}, OPTIONS) == [1]
    assert joinable_replicas({3}, {0, 1}, OPTIONS) == []


def test_decision_round_trips_through_json() -> None:
    decision = Decision(3, (0, 1, 2, 3), 7, {0: 0, 1: 1}, {0: "a", 1: "b", 2: "c", 3: "d"})
    assert Decision.from_json(decision.to_json()) == decision


def test_options_reject_bad_layouts() -> None:
    with pytest.raises(ValueError, match="replicas and shards expected >= 1"):
        FaultToleranceOptions(replicas=0)
    assert OPTIONS.slot(3) == (1, 1) and OPTIONS.members == 4


def test_idle_communicators_of_unchanged_members_are_kept() -> None:
    shards01, shards23, across02 = "0:incm0,1:incm1", "2:incm2,3:incm3", "0:incm0,2:incm2"
    registered = {
        0: Registration("incm0", 7, {shards01: 20, across02: 9}),
        1: Registration("incm1", 7, {shards01: 20}),
        2: Registration("incm2", 7, {shards23: 20, across02: 8}),  # one op behind on 0-2: broken
        3: Registration("incm3", 7, {shards23: 19}),  # its partner finished one more op: broken
    }
    decision = decide(5, registered, OPTIONS, sharded=True)
    assert decision is not None and decision.reuse == (shards01,)
    assert Decision.from_json(decision.to_json()) == decision


def test_a_communicator_with_a_member_outside_the_decision_is_not_kept() -> None:
    registered = {0: Registration("incm0", 3, {"0:incm0,2:incm2": 4}), 1: Registration("incm1", 3)}
    decision = decide(2, registered, OPTIONS, sharded=True)
    assert decision is not None and decision.members == (0, 1) and decision.reuse == ()
