"""One generation's communicators, built fresh over the quorum's members through the store.

Every generation gets its own store prefix, so a rebuilt world never meets the keys (or the
dead members) of an earlier one. Each member builds three standalone communicators
(:meth:`commlayer.contract.backend.Backend.create_standalone`), each a world of its own over its members (so only members take part, and nothing depends on torch's
default process group, which belongs to no generation): the generation's world, its replica's
shard group (ZeRO partitions within a replica) and its shard's replica group (the replicated
dimension: gradient averaging and state transfer).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from commlayer.contract.backend import Backend, StandaloneOptions
from commlayer.contract.registry import get_backend_class
from commlayer.core.errors import UnsupportedError
from commlayer.core.types import GroupSpec
from commlayer.ft.options import FaultToleranceOptions
from commlayer.ft.quorum import Decision

__all__ = ["Generation", "build_generation", "standalone_backend"]

# Every member issues the same ops by construction, and the Manager waits for each op itself,
# interruptibly: a per-op signature check would block outside that wait.
_UNCHECKED = StandaloneOptions(mismatch_checks=False)


@dataclass
class Generation:
    """The communicators of one generation, seen from one member."""

    decision: Decision
    member: int
    world: Backend
    shard_group: Backend
    replica_group: Backend

    @property
    def number(self) -> int:
        """The generation number (the quorum that made it)."""
        return self.decision.generation

    def abort(self) -> None:
        """Stop this generation's outstanding ops on this member (a peer may be dead)."""
        for communicator in (self.world, self.shard_group, self.replica_group):
            communicator.abort()


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
    store: Any, decision: Decision, member: int, options: FaultToleranceOptions
) -> Generation:
    """Build this member's communicators of ``decision`` (collective over its members)."""
    prefix = f"{options.prefix}/g{decision.generation}/comm"
    timeout = timedelta(seconds=options.comm_timeout_s)
    replica, shard = options.slot(member)
    replicas = decision.replicas(options)
    backend_class = standalone_backend(options.backend)

    def world_of(name: str, members: list[int]) -> Backend:
        spec = GroupSpec(
            f"{prefix}/{name}", tuple(range(len(members))), members.index(member), store, timeout
        )
        return backend_class.create_standalone(spec, _UNCHECKED)

    # A member that dies while the others build would hold them in a store read: bound it.
    store.set_timeout(timedelta(seconds=options.build_timeout_s))
    try:
        world = world_of("world", list(decision.members))
        shard_group = world_of(
            f"shards{replica}", [replica * options.shards + s for s in range(options.shards)]
        )
        replica_group = world_of(f"replicas{shard}", [r * options.shards + shard for r in replicas])
    finally:
        store.set_timeout(timedelta(seconds=options.store_timeout_s))
    return Generation(decision, member, world, shard_group, replica_group)
