"""Hybrid sharding: shard inside one part of the data-parallel ranks, replicate across the rest.

With a mesh ``init_mesh((2, 4), ("replicate", "dp"))`` and ``replicate_dims=("replicate",)``,
ZeRO partitions parameters, gradients and optimizer state over each "dp" group of 4 ranks (one
node, say) and keeps one replica per "replicate" group. Gradients are reduce-scattered inside
the shard group, then each rank all-reduces only its shard-sized piece with its replicas (so the
full-size traffic stays inside the shard group: MiCS's hierarchical scheme, torch's HSDP); all
parameter gathers stay inside the shard group.

``zero_optimization.mics_shard_size = S`` (DeepSpeed's key) builds that mesh for a world of ``W``:
``init_mesh((W // S, S), ("replicate", "dp"))``, i.e. shard groups of ``S`` consecutive ranks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from commlayer.mesh import Mesh
from commlayer.zero.config import ZeroConfig, ZeroConfigError

__all__ = ["DataParallelDims", "effective_dims", "partition_dims", "plan_data_parallel"]

SHARD_DIMS = ("dp", "sp")


@dataclass(frozen=True)
class DataParallelDims:
    """The mesh dims ZeRO shards over and those it replicates over (both in mesh order)."""

    shard: tuple[str, ...]
    replicate: tuple[str, ...]

    @property
    def all(self) -> tuple[str, ...]:
        return self.shard + self.replicate

    def in_mesh_order(self, mesh: Mesh) -> tuple[str, ...]:
        return tuple(dim for dim in mesh.mesh_dim_names if dim in self.all)

    def replicas(self, mesh: Mesh) -> int:
        return math.prod(mesh.size(dim) for dim in self.replicate)

    def batch_ranks(self, mesh: Mesh) -> int:
        """Ranks that see distinct samples: "dp" times the replicas ("sp" ranks share samples)."""
        return mesh.size("dp") * self.replicas(mesh)


def plan_data_parallel(
    config: ZeroConfig, mesh: Mesh | None, replicate_dims: Sequence[str], world_size: int, rank: int
) -> tuple[DataParallelDims, tuple[int, int] | None]:
    """Validate the hybrid arguments (pure: before any communication); say which dims do what.

    Also returns the shape of the ("replicate", "dp") mesh to build when ``mics_shard_size`` is
    set, else None (the caller then uses ``mesh``, or a 1-D "dp" mesh when that is None too).
    """
    shard_size = config.zero_optimization.mics_shard_size
    replicate = _check_replicate_dims(mesh, replicate_dims, rank)
    if shard_size == -1:
        shard = tuple(d for d in (mesh.mesh_dim_names if mesh else ("dp",)) if d in SHARD_DIMS)
        return DataParallelDims(shard, replicate), None
    if mesh is not None:
        raise ZeroConfigError(
            f"initialize: argument 'mesh' expected None when zero_optimization.mics_shard_size is set "
            f"(it builds its own mesh; pass replicate_dims instead), received {mesh!r} (rank {rank})"
        )
    if world_size % shard_size:
        divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
        raise ZeroConfigError(
            f"initialize: zero_optimization.mics_shard_size expected a divisor of the world size {world_size} "
            f"(one of {divisors}), received {shard_size} (rank {rank})"
        )
    return DataParallelDims(("dp",), ("replicate",)), (world_size // shard_size, shard_size)


def _check_replicate_dims(mesh: Mesh | None, replicate_dims: Sequence[str], rank: int) -> tuple[str, ...]:
    dims = (replicate_dims,) if isinstance(replicate_dims, str) else tuple(replicate_dims)
    if not dims:
        return ()
    names = mesh.mesh_dim_names if mesh is not None else ()
    allowed = tuple(d for d in names if d not in SHARD_DIMS)
    if mesh is None or any(d not in allowed for d in dims) or len(set(dims)) != len(dims):
        raise ZeroConfigError(
            f"initialize: argument 'replicate_dims' expected distinct dims of the mesh other than "
            f"{SHARD_DIMS} (mesh dims: {allowed}), received {dims!r} (rank {rank})"
        )
    return tuple(d for d in names if d in dims)


def effective_dims(dims: DataParallelDims, mesh: Mesh, stage: int) -> DataParallelDims:
    """Stage 0 shards nothing, so it reduces over every data-parallel rank at once; replicate
    dims of size 1 are dropped (no replica group to all-reduce over)."""
    if stage == 0:
        return DataParallelDims(dims.in_mesh_order(mesh), ())
    return DataParallelDims(dims.shard, tuple(d for d in dims.replicate if mesh.size(d) > 1))


def partition_dims(mesh: Mesh) -> tuple[str, ...]:
    """ZeRO partitions over the ranks holding the same parameters: "dp", with "sp" when present."""
    return tuple(dim for dim in mesh.mesh_dim_names if dim in SHARD_DIMS)
