"""The options of fault-tolerant data parallelism (one frozen dataclass)."""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["FaultToleranceOptions"]


@dataclass(frozen=True)
class FaultToleranceOptions:
    """How a replica group of a fault-tolerant job is laid out and how fast it reacts.

    Args:
        replicas: how many replicas the job plans (the replicated dimension); None: the
            launcher's world size divided by ``shards`` (resolved by the Manager).
        shards: ranks per replica (ZeRO partitions within a replica).
        backend: the commlayer backend each generation's communicators use ("gloo", "shm", ...).
        heartbeat_interval_s: how often a member publishes its heartbeat in the store.
        heartbeat_timeout_s: a heartbeat older than this marks its member dead.
        hang_timeout_s: a member whose training loop made no progress for this long while a
            peer waits on it is treated as hung and dropped.
        quorum_timeout_s: how long the job's first quorum waits for every planned member to
            start before it goes on with the complete replicas that did.
        comm_timeout_s: the timeout of each generation's communicators (a last resort: deaths
            are noticed sooner through the store).
        build_timeout_s: how long building a generation's communicators may wait for a member
            (one that dies meanwhile makes the others start the next quorum after this).
        store_timeout_s: the store's timeout outside of building.
        prefix: the key prefix of this job in the store.
    """

    replicas: int | None = None
    shards: int = 1
    backend: str = "gloo"
    heartbeat_interval_s: float = 0.1
    heartbeat_timeout_s: float = 1.5
    hang_timeout_s: float = 3.0
    quorum_timeout_s: float = 60.0
    comm_timeout_s: float = 10.0
    build_timeout_s: float = 10.0
    store_timeout_s: float = 300.0
    prefix: str = "ft"

    def __post_init__(self) -> None:
        if (self.replicas is not None and self.replicas < 1) or self.shards < 1:
            raise ValueError(
                f"FaultToleranceOptions: replicas and shards expected >= 1, received "
                f"replicas={self.replicas}, shards={self.shards}"
            )
        if self.heartbeat_timeout_s <= self.heartbeat_interval_s:
            raise ValueError(
                "FaultToleranceOptions: heartbeat_timeout_s expected > heartbeat_interval_s, received "
                f"{self.heartbeat_timeout_s} <= {self.heartbeat_interval_s}"
            )

    def for_world(self, world_size: int) -> FaultToleranceOptions:
        """These options with ``replicas`` filled in from a launcher's ``world_size``.

        Raises:
            ValueError: ``world_size`` is not ``replicas x shards``.
        """
        replicas = self.replicas if self.replicas is not None else world_size // self.shards
        if replicas * self.shards != world_size or replicas < 1:
            raise ValueError(
                f"FaultToleranceOptions: expected the launcher's {world_size} members to be replicas x "
                f"shards, received replicas={self.replicas}, shards={self.shards}"
            )
        return replace(self, replicas=replicas)

    @property
    def members(self) -> int:
        """The number of member slots (replicas x shards)."""
        if self.replicas is None:
            raise ValueError(
                "FaultToleranceOptions: replicas is unknown until the Manager reads the launcher's "
                "world size (for_world)"
            )
        return self.replicas * self.shards

    def slot(self, member: int) -> tuple[int, int]:
        """``(replica, shard)`` of member slot ``member``."""
        return divmod(member, self.shards)
