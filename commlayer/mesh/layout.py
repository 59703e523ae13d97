"""The rank layout of a device mesh: which global ranks form each group. Pure: no communication.

Ranks fill the mesh row-major (the last dim varies fastest), as in torch's DeviceMesh. A group
along a set of dims holds the ranks that agree on every *other* coordinate; its members are
listed in increasing rank order, which is also the order of their coordinates along those dims.

Worked example: ``MeshLayout.build((4, 2), ("dp", "tp"), expert_parallel_size=2)``, world 8::

    coordinate (dp, tp) of each rank     rank = 2 * dp + tp
        tp=0 tp=1
    dp=0   0    1
    dp=1   2    3
    dp=2   4    5
    dp=3   6    7

    "tp"  groups: [0, 1] [2, 3] [4, 5] [6, 7]      (same dp coordinate)
    "dp"  groups: [0, 2, 4, 6] [1, 3, 5, 7]        (same tp coordinate)
    "ep"  groups: [0, 2] [1, 3] [4, 6] [5, 7]      each dp group cut into runs of ep=2 ranks
    "edp" groups: [0, 4] [1, 5] [2, 6] [3, 7]      dp members with the same position in their ep group

Expert parallelism is carved out of data parallelism (DeepSpeed's idea): the experts of a layer
are spread over an "ep" group, and each expert's replicas -- one per ep group of the same dp
group -- average their gradients over an "edp" (expert-data-parallel) group, so ``ep * edp == dp``.
With both a "dp" and an "sp" dim, "dp_sp" is the sequence-data-parallel group over which dense
gradients are reduced (every rank holding the same parameters).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from commlayer.core.errors import InvalidArgumentError

__all__ = ["EXPERT_DIMS", "MeshLayout", "factorisations", "flat_name"]

#: Dims derived from "dp" by ``expert_parallel_size``; a mesh may not use these names itself.
EXPERT_DIMS = ("ep", "edp")

Groups = tuple[tuple[int, ...], ...]


def flat_name(dims: Sequence[str]) -> str:
    """The name torch gives a flattened sub-mesh: ``("dp", "sp") -> "dp_sp"``."""
    return "_".join(dims)


def factorisations(world_size: int, ndims: int) -> list[tuple[int, ...]]:
    """Every ordered way to write ``world_size`` as a product of ``ndims`` positive ints."""
    if ndims == 1:
        return [(world_size,)]
    divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
    return [(d, *rest) for d in divisors for rest in factorisations(world_size // d, ndims - 1)]


@dataclass(frozen=True)
class MeshLayout:
    """Shape, dim names and expert-parallel size of a mesh; answers rank-layout questions."""

    shape: tuple[int, ...]
    dim_names: tuple[str, ...]
    expert_parallel_size: int = 1

    @classmethod
    def build(
        cls,
        mesh_shape: Sequence[int],
        mesh_dim_names: Sequence[str],
        world_size: int | None = None,
        expert_parallel_size: int = 1,
        rank: int | None = None,
    ) -> MeshLayout:
        """Validate the arguments of ``init_mesh`` (``world_size`` None: the shape's product)."""
        shape = _check_shape(mesh_shape, world_size, rank)
        names = _check_names(mesh_dim_names, len(shape), rank)
        layout = cls(shape, names, 1)
        _check_expert_size(layout, expert_parallel_size, rank)
        return cls(shape, names, expert_parallel_size)

    # --- sizes and coordinates -------------------------------------------------------------

    @property
    def world_size(self) -> int:
        """The number of ranks the layout covers (the product of its shape)."""
        return math.prod(self.shape)

    @property
    def has_expert_dims(self) -> bool:
        """Whether expert dimensions (``ep``, ``edp``) can be derived: true when the layout has ``dp``."""
        return "dp" in self.dim_names

    def valid_dims(self) -> tuple[str, ...]:
        """Every name ``Mesh[...]`` accepts as a single dim."""
        return self.dim_names + (EXPERT_DIMS if self.has_expert_dims else ())

    def dim_size(self, dim: str) -> int:
        """The size of dimension ``dim`` (``ep`` and ``edp`` included).

        Args:
            dim: a dimension name of the layout, or ``ep``/``edp``.

        Returns:
            The number of ranks along ``dim``.
        """
        if dim == "ep":
            return self.expert_parallel_size
        if dim == "edp":
            return self.dim_size("dp") // self.expert_parallel_size
        return self.shape[self.dim_names.index(dim)]

    def coordinate(self, rank: int) -> tuple[int, ...]:
        """Rank -> its index along every mesh dim (row-major)."""
        coordinate = []
        for size in reversed(self.shape):
            rank, index = divmod(rank, size)
            coordinate.append(index)
        return tuple(reversed(coordinate))

    def rank_at(self, coordinate: Sequence[int]) -> int:
        """The global rank at ``coordinate`` (row-major over the shape).

        Args:
            coordinate: one index per dimension, outermost first.

        Returns:
            The rank at that position; ``(1, 0)`` in a ``(2, 2)`` layout is rank 2.
        """
        rank = 0
        for index, size in zip(coordinate, self.shape):
            rank = rank * size + index
        return rank

    # --- groups ----------------------------------------------------------------------------

    def groups(self, dims: Sequence[str]) -> Groups:
        """Rank lists of the groups spanning ``dims`` (mesh dims in mesh order, or "ep"/"edp")."""
        dims = tuple(dims)
        if dims == ("ep",):
            return self._expert_groups(consecutive=True)
        if dims == ("edp",):
            return self._expert_groups(consecutive=False)
        spanned = [self.dim_names.index(dim) for dim in dims]
        buckets: dict[tuple[int, ...], list[int]] = {}
        for rank in range(self.world_size):
            coordinate = self.coordinate(rank)
            fixed = tuple(c for axis, c in enumerate(coordinate) if axis not in spanned)
            buckets.setdefault(fixed, []).append(rank)
        return tuple(sorted(tuple(members) for members in buckets.values()))

    def group_of(self, dims: Sequence[str], rank: int) -> tuple[int, ...]:
        """The members of ``rank``'s group spanning ``dims``."""
        return next(members for members in self.groups(dims) if rank in members)

    def eager_groups(self) -> tuple[tuple[str, ...], ...]:
        """The dim sets whose groups ``init_mesh`` creates, in creation order.

        Every single mesh dim, then "dp_sp" when both exist, then "ep" and "edp" when there is
        a "dp" dim. Every rank creates all of them in this order (``new_group`` is collective).
        """
        order: list[tuple[str, ...]] = [(dim,) for dim in self.dim_names]
        if "dp" in self.dim_names and "sp" in self.dim_names:
            order.append(tuple(d for d in self.dim_names if d in ("dp", "sp")))
        if self.has_expert_dims:
            order += [("ep",), ("edp",)]
        return tuple(order)

    def _expert_groups(self, consecutive: bool) -> Groups:
        ep = self.expert_parallel_size
        result: list[tuple[int, ...]] = []
        for dp_group in self.groups(("dp",)):
            if consecutive:
                result += [dp_group[start : start + ep] for start in range(0, len(dp_group), ep)]
            else:
                result += [dp_group[offset::ep] for offset in range(ep)]
        return tuple(sorted(result))

    def check_dims(self, dims: Sequence[str], rank: int | None = None) -> tuple[str, ...]:
        """Validate a ``Mesh[...]`` key: known names, no repeats, mesh order, experts alone."""
        dims = tuple(dims)
        valid = self.valid_dims()
        unknown = [dim for dim in dims if dim not in valid]
        if not dims or unknown or len(set(dims)) != len(dims):
            raise _error("Mesh.__getitem__", "dims", f"distinct names among {valid}", dims, rank)
        if any(dim in EXPERT_DIMS for dim in dims) and len(dims) > 1:
            raise _error(
                "Mesh.__getitem__", "dims", "'ep' or 'edp' on its own (they are not mesh dims)", dims, rank
            )
        in_mesh_order = tuple(dim for dim in self.dim_names if dim in dims)
        if len(dims) > 1 and dims != in_mesh_order:
            raise _error("Mesh.__getitem__", "dims", f"dims in mesh order, i.e. {in_mesh_order}", dims, rank)
        return dims


# --- validation ------------------------------------------------------------------------------


def _error(op: str, arg: str, expected: str, received: object, rank: int | None) -> InvalidArgumentError:
    where = f" (rank {rank})" if rank is not None and rank >= 0 else ""
    return InvalidArgumentError(f"{op}: argument '{arg}' expected {expected}, received {received!r}{where}")


def _check_shape(mesh_shape: Sequence[int], world_size: int | None, rank: int | None) -> tuple[int, ...]:
    try:
        shape = tuple(mesh_shape)
    except TypeError:
        raise _error("init_mesh", "mesh_shape", "a sequence of positive ints", mesh_shape, rank) from None
    if not shape or any(not isinstance(s, int) or isinstance(s, bool) or s < 1 for s in shape):
        raise _error("init_mesh", "mesh_shape", "a non-empty sequence of positive ints", mesh_shape, rank)
    if world_size is not None and math.prod(shape) != world_size:
        valid = ", ".join(map(str, factorisations(world_size, len(shape))[:12]))
        expected = f"dims whose product is the world size {world_size}; with {len(shape)} dims: {valid}"
        raise _error("init_mesh", "mesh_shape", expected, shape, rank)
    return shape


def _check_names(mesh_dim_names: Sequence[str], ndims: int, rank: int | None) -> tuple[str, ...]:
    names = tuple(mesh_dim_names) if not isinstance(mesh_dim_names, str) else (mesh_dim_names,)
    bad = [n for n in names if not isinstance(n, str) or not n.isidentifier()]
    if len(names) != ndims or bad or len(set(names)) != len(names):
        expected = f"{ndims} distinct identifiers, one per mesh dim (such as 'pp', 'dp', 'sp', 'tp')"
        raise _error("init_mesh", "mesh_dim_names", expected, names, rank)
    reserved = [n for n in names if n in EXPERT_DIMS or "_" in n and set(n.split("_")) <= set(names)]
    if reserved:
        expected = "names other than 'ep'/'edp' (derived from 'dp' by expert_parallel_size) and other than flattened names like 'dp_sp'"
        raise _error("init_mesh", "mesh_dim_names", expected, names, rank)
    return names


def _check_expert_size(layout: MeshLayout, ep: int, rank: int | None) -> None:
    if not isinstance(ep, int) or isinstance(ep, bool) or ep < 1:
        raise _error("init_mesh", "expert_parallel_size", "a positive int", ep, rank)
    if ep == 1:
        return
    if "dp" not in layout.dim_names:
        raise _error(
            "init_mesh",
            "expert_parallel_size",
            f"1, since mesh_dim_names {layout.dim_names} has no 'dp' dim to carve experts from",
            ep,
            rank,
        )
    dp = layout.dim_size("dp")
    if dp % ep:
        divisors = [d for d in range(1, dp + 1) if dp % d == 0]
        raise _error(
            "init_mesh",
            "expert_parallel_size",
            f"a divisor of the 'dp' size {dp}: one of {divisors}",
            ep,
            rank,
        )
