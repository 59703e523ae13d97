"""One generation's communicators, built over the quorum's members through the store, or kept.

Each communicator is a standalone world of its own over its members
(:meth:`commlayer.contract.backend.Backend.create_standalone`), so only members take part and
nothing depends on torch's default process group. Sharded state (ZeRO stages 1-2) needs the
member's replica's shard group (partitions within a replica) and its shard's replica group (the
replicated dimension: gradient averaging and state transfer); replicated state (stage 0) needs
the generation's world. A group of one member needs no communicator.

A communicator is named by its members and their incarnations (:func:`communicator_key`). One
that every member left idle after the same number of ops, and that nobody aborted, survives into
the next generation when its members are unchanged: the survivors of a death keep their own
replica's shard group instead of building it again (on NCCL the build is most of a recovery).
A new one is built under the generation's own store prefix, so it never meets the keys (or the
dead members) of an earlier one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from commlayer.contract.backend import Backend, StandaloneOptions
from commlayer.contract.registry import get_backend_class
from commlayer.core.errors import UnsupportedError
from commlayer.core.types import GroupSpec
from commlayer.ft.options import FaultToleranceOptions
from commlayer.ft.quorum import Decision

__all__ = ["Communicator", "Generation", "build_generation", "communicator_key", "standalone_backend"]

# Every member issues the same ops by construction, and the Manager waits for each op itself,
# interruptibly: a per-op signature check would block outside that wait.
_UNCHECKED = StandaloneOptions(mismatch_checks=False)


def communicator_key(members: Sequence[int], incarnations: Mapping[int, str]) -> str:
    """``"0:ab12,1:cd34"``: a communicator's members and their incarnations, in rank order."""
    return ",".join(f"{member}:{incarnations[member]}" for member in members)


@dataclass
class Communicator:
    """One standalone communicator and the ops this member issued and finished on it."""

    key: str
    members: tuple[int, ...]  # member slots, in rank order
    backend: Backend
    issued: int = 0
    completed: int = 0

    @property
    def idle(self) -> bool:
        """No op of this member is outstanding on it."""
        return self.issued == self.completed

    def abort(self) -> None:
        """Stop its outstanding ops on this member (a peer may be dead)."""
        self.backend.abort()


@dataclass
class Generation:
    """The communicators of one generation, seen from one member (None: a group of one)."""

    decision: Decision
    member: int
    world: Communicator | None  # replicated state (stage 0)
    shard_group: Communicator | None  # sharded state: this member's replica's shards
    replica_group: Communicator | None  # sharded state: this member's shard across replicas

    @property
    def number(self) -> int:
        """The generation number (the quorum that made it)."""
        return self.decision.generation

    def communicators(self) -> list[Communicator]:
        """The communicators this member holds in this generation."""
        groups = (self.world, self.shard_group, self.replica_group)
        return [group for group in groups if group is not None]


def standalone_backend(name: str) -> type[Backend]:
    """The backend class ``name``, checked able to build communicators again and again.

    Raises:
        BackendUnavailableError: ``name`` is unknown or cannot run here.
        UnsupportedError: the backend cannot build standalone communicators.
    """
    backend_class = get_backend_class(name)
    if not backend_class.builds_standalone:
        raise UnsupportedError(
            f"fault tolerance: argument 'backend' expected a backend that builds standalone "
            f"communicators (builds_standalone), received {name!r}"
        )
    return backend_class


def build_generation(
    store: Any,
    decision: Decision,
    member: int,
    options: FaultToleranceOptions,
    sharded: bool,
    kept: Mapping[str, Communicator],
) -> Generation:
    """This member's communicators of ``decision`` (collective over each one's members): those in
    ``kept`` (by key) are used again, the others built."""
    prefix = f"{options.prefix}/g{decision.generation}/comm"
    timeout = timedelta(seconds=options.comm_timeout_s)
    replica, shard = options.slot(member)
    backend_class = standalone_backend(options.backend)

    def group(name: str, members: list[int]) -> Communicator | None:
        if len(members) == 1:
            return None
        key = communicator_key(members, decision.incarnations)
        if key in kept:
            return kept[key]
        spec = GroupSpec(
            f"{prefix}/{name}", tuple(range(len(members))), members.index(member), store, timeout
        )
        return Communicator(key, tuple(members), backend_class.create_standalone(spec, _UNCHECKED))

    # A member that dies while the others build would hold them in a store read: bound it.
    store.set_timeout(timedelta(seconds=options.build_timeout_s))
    try:
        if not sharded:
            return Generation(decision, member, group("world", list(decision.members)), None, None)
        shards = group(f"shards{replica}", [replica * options.shards + s for s in range(options.shards)])
        replicas = [r * options.shards + shard for r in decision.replicas(options)]
        return Generation(decision, member, None, shards, group(f"replicas{shard}", replicas))
    finally:
        store.set_timeout(timedelta(seconds=options.store_timeout_s))
