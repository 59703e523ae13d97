"""One generation's communicators, built fresh over the quorum's members through the store.

Every generation gets its own store prefix, so a rebuilt world never meets the keys (or the
dead members) of an earlier one. Each member builds three standalone communicators, each a
world of its own over its members (so only members take part, and nothing depends on torch's
default process group, which belongs to no generation): the generation's world, its replica's
shard group (ZeRO partitions within a replica) and its shard's replica group (the replicated
dimension: gradient averaging and state transfer).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as torch_dist

from ..backend import Backend
from ..types import GroupSpec
from .options import FaultToleranceOptions
from .quorum import Decision

__all__ = ["FRESH_WORLD_BACKENDS", "Generation", "build_generation", "fresh_world"]

#: Backends whose communicators can be built again and again in one process, over any members.
FRESH_WORLD_BACKENDS = ("gloo", "shm")


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


def fresh_world(backend: str, spec: GroupSpec) -> Backend:
    """A new communicator of ``backend`` over ``spec`` (a world of its own: ranks ``0..size-1``).

    Raises:
        ValueError: ``backend`` cannot build worlds again in one process (see FRESH_WORLD_BACKENDS).
    """
    store = torch_dist.PrefixStore(f"{spec.name}/gloo", spec.store)
    companion = _unchecked_gloo()(
        spec, torch_dist.ProcessGroupGloo(store, spec.global_rank, spec.size, spec.timeout)
    )
    if backend == "gloo":
        return companion
    if backend == "shm":
        from ..backends.shm._setup import build_comm, exchange_hosts
        from ..backends.shm.backend import ShmBackend
        from ..backends.shm.options import ShmOptions

        options = ShmOptions.resolve(None, spec.global_rank)
        prefix = f"{spec.name}/shm"
        hosts = exchange_hosts(spec, prefix, os.environ)
        comm = build_comm(spec, prefix, range(spec.size), hosts.pids, options)
        return ShmBackend(spec, companion, comm, options, hosts)
    raise ValueError(
        f"fault tolerance: argument 'backend' expected one of {FRESH_WORLD_BACKENDS}, received {backend!r}"
    )


def _unchecked_gloo() -> type[Backend]:
    from ..backends.gloo import GlooBackend  # backends load lazily; gloo is always there

    class UncheckedGloo(GlooBackend):
        """gloo without the per-op signature exchange: it blocks outside the Manager's
        interruptible wait, and every member issues the same ops by construction."""

        def _verify(self, *args: Any, **kwargs: Any) -> None:
            return None

    return UncheckedGloo


def build_generation(
    store: Any, decision: Decision, member: int, options: FaultToleranceOptions
) -> Generation:
    """Build this member's communicators of ``decision`` (collective over its members)."""
    prefix = f"{options.prefix}/g{decision.generation}/comm"
    timeout = timedelta(seconds=options.comm_timeout_s)
    replica, shard = options.slot(member)
    replicas = decision.replicas(options)

    def world_of(name: str, members: list[int]) -> Backend:
        spec = GroupSpec(
            f"{prefix}/{name}", tuple(range(len(members))), members.index(member), store, timeout
        )
        return fresh_world(options.backend, spec)

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
