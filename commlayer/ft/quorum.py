"""The per-generation quorum: who trains next, from which step, and who sends each shard.

Members register for quorum ``N`` in the store with their incarnation and the step of the state
they hold. Once every member that looks alive has registered, any of them proposes a
:class:`Decision` with ``compare_set``: the first proposal wins and every member reads it back,
so all agree. Only complete replicas train; a member of an incomplete replica waits on standby.
A member also registers the communicators it left idle (by key, with its count of finished ops):
the decision keeps those that every one of their members registered at the same count.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from commlayer.ft.errors import NoHealthyReplicaError
from commlayer.ft.options import FaultToleranceOptions

__all__ = ["Decision", "Registration", "decide", "joinable_replicas", "reusable"]


@dataclass(frozen=True)
class Registration:
    """One member's entry in a quorum: ``step`` is -1 when it holds no state; ``idle`` maps the key
    of each communicator it could use again to the number of ops it finished on it."""

    incarnation: str
    step: int
    idle: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str | bytes) -> Registration:
        return Registration(**json.loads(text))


@dataclass(frozen=True)
class Decision:
    """The outcome of quorum ``generation``: members (sorted slots), the step they resume at,
    the member that sends each shard's state (empty when nobody needs any), their incarnations
    and the keys of the communicators they keep."""

    generation: int
    members: tuple[int, ...]
    step: int
    sources: dict[int, int] = field(default_factory=dict)
    incarnations: dict[int, str] = field(default_factory=dict)
    reuse: tuple[str, ...] = ()

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str | bytes) -> Decision:
        raw = json.loads(text)
        return Decision(
            raw["generation"],
            tuple(raw["members"]),
            raw["step"],
            {int(k): v for k, v in raw["sources"].items()},
            {int(k): v for k, v in raw["incarnations"].items()},
            tuple(raw.get("reuse", ())),
        )

    def replicas(self, options: FaultToleranceOptions) -> list[int]:
        """The replicas that train in this generation, in order."""
        return sorted({options.slot(member)[0] for member in self.members})


def complete_replicas(present: set[int], options: FaultToleranceOptions) -> list[int]:
    """Replicas all of whose member slots are in ``present``."""
    return [
        replica
        for replica in range(options.members // options.shards)
        if all(replica * options.shards + shard in present for shard in range(options.shards))
    ]


def joinable_replicas(standby: set[int], members: set[int], options: FaultToleranceOptions) -> list[int]:
    """Replicas outside ``members`` that the standby members complete (worth a new quorum)."""
    return [r for r in complete_replicas(standby | members, options) if r * options.shards not in members]


def decide(
    generation: int, registered: Mapping[int, Registration], options: FaultToleranceOptions, sharded: bool
) -> Decision | None:
    """The decision of quorum ``generation`` from its registrations (pure; see the module docstring).

    Returns None while no decision can be made yet: no replica is complete, or the newest state
    of some shard is held only outside the complete replicas (a replacement may still come).

    Raises:
        NoHealthyReplicaError: no registered member holds the newest state of some shard.
    """
    step = max((reg.step for reg in registered.values()), default=-1)
    holders = [m for m, reg in sorted(registered.items()) if reg.step == step] if step >= 0 else []
    shard_of = (lambda m: options.slot(m)[1]) if sharded else (lambda m: 0)
    shards = range(options.shards) if sharded else range(1)
    lost = [shard for shard in shards if step >= 0 and not any(shard_of(m) == shard for m in holders)]
    if lost:
        raise NoHealthyReplicaError(
            f"fault tolerance: no live member holds shard {lost[0]} of the state at step {step} "
            f"(live members: {sorted(registered)}, holders: {holders}); restart from the last checkpoint"
        )
    replicas = complete_replicas(set(registered), options)
    members = tuple(r * options.shards + s for r in replicas for s in range(options.shards))
    if not members:
        return None
    incarnations = {m: registered[m].incarnation for m in members}
    reuse = reusable(members, registered)
    if step < 0 or all(registered[m].step == step for m in members):
        return Decision(generation, members, max(step, 0), {}, incarnations, reuse)
    sources = {}
    for shard in shards:
        found = [m for m in holders if m in members and shard_of(m) == shard]
        if not found:
            return None
        sources[shard] = found[0]
    return Decision(generation, members, step, sources, incarnations, reuse)


def reusable(members: tuple[int, ...], registered: Mapping[int, Registration]) -> tuple[str, ...]:
    """Keys of the communicators that every one of their members registered idle at one count,
    all of them among ``members``."""
    counts: dict[str, dict[int, int]] = {}
    for member in members:
        for key, count in registered[member].idle.items():
            counts.setdefault(key, {})[member] = count
    return tuple(
        sorted(
            key
            for key, by_member in counts.items()
            if set(by_member) == {int(part.split(":")[0]) for part in key.split(",")}
            and len(set(by_member.values())) == 1
        )
    )
