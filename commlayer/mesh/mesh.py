"""``init_mesh``: the process groups of a device mesh, built with ``commlayer.dist.new_group``.

Example, world of 8 (see :mod:`commlayer.mesh.layout` for the full rank layout)::

    mesh = init_mesh((4, 2), ("dp", "tp"), expert_parallel_size=2)
    # on global rank 5 (coordinate dp=2, tp=1):
    mesh["tp"].ranks == (4, 5)           mesh["tp"].get_local_rank() == 1
    mesh["dp"].ranks == (1, 3, 5, 7)     mesh["dp"].get_local_rank() == 2
    mesh["ep"].ranks == (5, 7)           mesh["edp"].ranks == (1, 5)
    mesh["dp", "tp"].size() == 8         mesh.get_coordinate() == (2, 1)
    dist.all_reduce(t, group=mesh["dp"].group)   # sums over ranks 1, 3, 5, 7

``new_group`` is collective, so ``init_mesh`` creates every group of every dim on every rank in
one fixed order (:meth:`MeshLayout.eager_groups`). Flattened combinations other than "dp_sp" are
created on first use of ``mesh[dims]``, which is then collective too: every rank must index the
same combinations in the same order, as with torch's ``DeviceMesh._flatten``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch

from commlayer import dist
from commlayer.core.errors import InvalidArgumentError
from commlayer.dist import ProcessGroup
from commlayer.mesh.layout import EXPERT_DIMS, MeshLayout, flat_name

__all__ = ["Mesh", "init_mesh"]


def init_mesh(
    mesh_shape: Sequence[int],
    mesh_dim_names: Sequence[str],
    *,
    expert_parallel_size: int = 1,
) -> Mesh:
    """Lay the world out as ``mesh_shape`` and create its groups (collective over the world).

    Validates everything before the first ``new_group``, so bad input fails on every rank
    alike without communicating.

    Args:
        mesh_shape: the size of each dimension; their product must be the world size.
        mesh_dim_names: one name per dimension, from ``dp``, ``sp``, ``tp``, ``pp``, ...
        expert_parallel_size: how many ranks share the experts of an MoE layer (derives the
            ``ep`` and ``edp`` dimensions from ``dp``); 1 without experts.

    Returns:
        The :class:`Mesh` of this rank, whose sub-meshes (``mesh["dp"]``) carry their groups.

    Raises:
        InvalidArgumentError: the shape, names or expert size do not fit the world.

    Example::

        >>> mesh = init_mesh((2, 2), ("dp", "sp"))  # 4 ranks
        >>> dist.all_reduce(grads, group=mesh["dp"].group)
    """
    rank, world_size = dist.get_rank(), dist.get_world_size()
    layout = MeshLayout.build(mesh_shape, mesh_dim_names, world_size, expert_parallel_size, rank)
    groups = _MeshGroups(layout, rank)
    for dims in layout.eager_groups():
        groups.get(dims)
    return Mesh(layout, layout.dim_names, groups)


class _MeshGroups:
    """This rank's ProcessGroup for each dim set, created collectively on first request."""

    def __init__(self, layout: MeshLayout, rank: int) -> None:
        self.layout = layout
        self.rank = rank
        self._created: dict[tuple[str, ...], ProcessGroup] = {}

    def get(self, dims: tuple[str, ...]) -> ProcessGroup:
        if dims not in self._created:
            self._created[dims] = create_groups(self.layout.groups(dims), self.rank)
        return self._created[dims]


def create_groups(rank_lists: Sequence[Sequence[int]], rank: int, reuse_world: bool = True) -> ProcessGroup:
    """Create one group per rank list on every rank (same order everywhere); return this rank's.

    With ``reuse_world``, a list spanning the whole world reuses the default group.
    """
    mine: ProcessGroup | None = None
    world = tuple(range(dist.get_world_size()))
    for members in rank_lists:
        group = dist.group.WORLD if reuse_world and tuple(members) == world else dist.new_group(list(members))
        if rank in members:
            mine = group
    if mine is None:
        raise InvalidArgumentError(f"create_groups: rank {rank} is in none of the groups {list(rank_lists)}")
    return mine


class Mesh:
    """A device mesh, or a sub-mesh of some of its dims (flattened into one group)."""

    def __init__(self, layout: MeshLayout, dims: tuple[str, ...], groups: _MeshGroups) -> None:
        self.layout = layout
        self.dims = dims
        self._groups = groups

    # --- structure ---------------------------------------------------------------------------

    @property
    def mesh_dim_names(self) -> tuple[str, ...]:
        """The names of this mesh's dimensions, outermost first (torch's DeviceMesh spelling)."""
        return self.dims

    @property
    def shape(self) -> tuple[int, ...]:
        """The size of each dimension, in ``mesh_dim_names`` order."""
        return tuple(self.layout.dim_size(dim) for dim in self.dims)

    @property
    def ndim(self) -> int:
        """How many dimensions this mesh has."""
        return len(self.dims)

    def __getitem__(self, dims: str | Sequence[str]) -> Mesh:
        """``mesh["dp"]`` or ``mesh["dp", "sp"]`` (several dims flattened into one group)."""
        wanted = (dims,) if isinstance(dims, str) else tuple(dims)
        checked = self.layout.check_dims(wanted, self._groups.rank)
        allowed = self.dims + (EXPERT_DIMS if "dp" in self.dims else ())
        if not set(checked) <= set(allowed):
            raise InvalidArgumentError(
                f"Mesh.__getitem__: argument 'dims' expected names among {allowed} (the dims of "
                f"{self!r}), received {wanted!r} (rank {self._groups.rank})"
            )
        return Mesh(self.layout, checked, self._groups)

    # --- this rank's view --------------------------------------------------------------------

    @property
    def group(self) -> ProcessGroup:
        """The group spanning all of this (sub-)mesh's dims that contains this rank."""
        return self._groups.get(self.dims)

    def get_group(self, dim: str | None = None) -> ProcessGroup:
        """torch's spelling: the group of ``dim``, or of the whole (sub-)mesh when None."""
        return self.group if dim is None else self[dim].group

    @property
    def ranks(self) -> tuple[int, ...]:
        """Global ranks of this rank's group, in group-rank order."""
        return self.layout.group_of(self.dims, self._groups.rank)

    def size(self, dim: str | None = None) -> int:
        """Number of ranks in the (sub-)mesh, or along one of its dims."""
        if dim is None:
            return len(self.ranks)
        return self[dim].size()

    def get_local_rank(self, dim: str | None = None) -> int:
        """This rank's index in the group of ``dim`` (of the whole sub-mesh when None)."""
        if dim is None:
            return self.ranks.index(self._groups.rank)
        return self[dim].get_local_rank()

    def get_coordinate(self) -> tuple[int, ...]:
        """This rank's index along each of the (sub-)mesh's dims."""
        return tuple(self[dim].get_local_rank() for dim in self.dims)

    def duplicate_group(self) -> ProcessGroup:
        """A second communicator over the same ranks (collective over the whole world).

        Engines use one for parameter all-gathers and one for gradient reductions, so the two
        kinds of collective are ordered independently and can run concurrently.
        """
        return create_groups(self.layout.groups(self.dims), self._groups.rank, reuse_world=False)

    def to_device_mesh(self, device_type: str = "cpu") -> Any:
        """This (sub-)mesh as a torch ``DeviceMesh`` over the same groups, for FSDP2/DTensor/TP.

        Each dim's group answers through its torch ProcessGroup (the commlayer bridge for mpi,
        ccl, shm and plugins), so torch's parallelism runs on commlayer's backends. Dims must be
        the layout's own (not flattened ones such as "dp_sp").
        """
        from torch.distributed.device_mesh import DeviceMesh

        rank = self._groups.rank
        unknown = [dim for dim in self.dims if dim not in self.layout.dim_names]
        if unknown:
            raise InvalidArgumentError(
                f"Mesh.to_device_mesh: expected the layout's dims {self.layout.dim_names}, received "
                f"flattened or expert dims {unknown} (rank {rank})"
            )
        here = list(self.layout.coordinate(rank))
        positions = [self.layout.dim_names.index(dim) for dim in self.dims]
        ranks = []
        for coordinate in itertools.product(*(range(size) for size in self.shape)):
            for position, index in zip(positions, coordinate):
                here[position] = index
            ranks.append(self.layout.rank_at(here))
        groups = [self[dim].group.torch_group for dim in self.dims]
        layout = torch.tensor(ranks, dtype=torch.int64).view(self.shape)
        return DeviceMesh.from_group(groups, device_type, mesh=layout, mesh_dim_names=self.dims)

    def __repr__(self) -> str:
        name = flat_name(self.dims)
        return f"Mesh({name}, shape={self.shape}, ranks={list(self.ranks)})"
