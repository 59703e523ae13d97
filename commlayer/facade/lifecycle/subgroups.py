"""torch's group helpers and queries over commlayer's groups and backend registry.

``new_subgroups``, ``new_subgroups_by_enumeration`` and ``split_group`` are built on
:func:`new_group`, so, like it, every rank of the world calls them with the same arguments.
Example, world of 4: ``cur, groups = new_subgroups(2)`` gives rank 3 ``cur.ranks == (2, 3)``
and every rank ``len(groups) == 2``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch

from commlayer.contract.registry import get_backend_class
from commlayer.contract.selection import DEFAULT_BY_ACCELERATOR
from commlayer.core.boundary import user_facing
from commlayer.core.errors import BackendUnavailableError, UnsupportedError, invalid_argument
from commlayer.core.types import ReduceOp
from commlayer.facade.groups.group import NON_GROUP_MEMBER, ProcessGroup, current_world, resolve_group
from commlayer.facade.lifecycle.process_groups import new_group

__all__ = [
    "get_backend_config",
    "get_default_backend_for_device",
    "get_pg_count",
    "is_backend_available",
    "is_gloo_available",
    "is_mpi_available",
    "is_nccl_available",
    "is_ucc_available",
    "is_xccl_available",
    "new_subgroups",
    "new_subgroups_by_enumeration",
    "split_group",
    "supports_complex",
]

# Reductions torch refuses on complex tensors: they have no order, or no bitwise meaning.
_NOT_COMPLEX = frozenset(
    {ReduceOp.MAX, ReduceOp.MIN, ReduceOp.PRODUCT, ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR}
)


@user_facing
def new_subgroups(
    group_size: int | None = None,
    group: Any = None,
    timeout: timedelta | None = None,
    backend: str | None = None,
    pg_options: Any = None,
    group_desc: str | None = None,
) -> tuple[ProcessGroup | None, list[Any]]:
    """Split ``group`` (the world by default) into consecutive groups of ``group_size`` ranks.

    ``group_size`` defaults to this machine's CUDA device count, as in torch. Returns this rank's
    subgroup and the list of every subgroup (``GroupMember.NON_GROUP_MEMBER`` where this rank is
    not a member).
    """
    world = current_world("new_subgroups")
    parent = resolve_group("new_subgroups", group)
    ranks = list(parent.ranks) if parent is not None else list(range(world.size))
    size = torch.cuda.device_count() if group_size is None else group_size
    if not isinstance(size, int) or size <= 0 or len(ranks) % size:
        raise invalid_argument(
            "new_subgroups",
            "group_size",
            f"a positive divisor of the group size {len(ranks)}",
            size,
            world.rank,
        )
    chunks = [ranks[start : start + size] for start in range(0, len(ranks), size)]
    return new_subgroups_by_enumeration(chunks, timeout, backend, pg_options, group_desc)


@user_facing
def new_subgroups_by_enumeration(
    ranks_per_subgroup_list: Sequence[Sequence[int]],
    timeout: timedelta | None = None,
    backend: str | None = None,
    pg_options: Any = None,
    group_desc: str | None = None,
) -> tuple[ProcessGroup | None, list[Any]]:
    """One group per entry of ``ranks_per_subgroup_list`` (disjoint lists of global ranks)."""
    world = current_world("new_subgroups_by_enumeration")
    _check_disjoint(
        "new_subgroups_by_enumeration", "ranks_per_subgroup_list", ranks_per_subgroup_list, world.rank
    )
    subgroups = [
        new_group(list(ranks), timeout=timeout, backend=backend, pg_options=pg_options, group_desc=group_desc)
        for ranks in ranks_per_subgroup_list
    ]
    mine = [group for group in subgroups if group is not NON_GROUP_MEMBER]
    return (mine[0] if mine else None), subgroups


@user_facing
def split_group(
    parent_pg: Any = None,
    split_ranks: Sequence[Sequence[int]] | None = None,
    timeout: timedelta | None = None,
    pg_options: Any = None,
    group_desc: str | None = None,
    backend: str | None = None,
) -> ProcessGroup | None:
    """Split the world into the disjoint groups ``split_ranks``; returns this rank's or None.

    commlayer builds groups collectively over the world, so ``parent_pg`` must be the world.
    """
    world = current_world("split_group")
    if parent_pg is not None and parent_pg is not world.default_group:
        raise invalid_argument(
            "split_group",
            "parent_pg",
            "None or the default group (commlayer splits the world)",
            parent_pg,
            world.rank,
            UnsupportedError,
        )
    if not split_ranks:
        raise invalid_argument(
            "split_group", "split_ranks", "a non-empty list of rank lists", split_ranks, world.rank
        )
    return new_subgroups_by_enumeration(split_ranks, timeout, backend, pg_options, group_desc)[0]


def get_pg_count() -> int:
    """How many groups this process has created, the default group included (torch's count)."""
    return 1 + current_world("get_pg_count").group_counter


@user_facing
def get_backend_config(group: Any = None) -> str:
    """``"cpu:gloo,cuda:nccl"``-style device-to-backend map of ``group``, as torch reports it."""
    resolved = resolve_group("get_backend_config", group)
    if resolved is None:
        raise invalid_argument(
            "get_backend_config", "group", "a group this rank belongs to", group, current_world("x").rank
        )
    return ",".join(f"{device}:{resolved.backend_for(device).name}" for device in resolved.device_types)


@user_facing
def get_default_backend_for_device(device: str | torch.device) -> str:
    """The backend ``init_process_group(backend=None)`` picks for ``device`` ("cpu" -> shm)."""
    device_type = torch.device(device).type
    spec = DEFAULT_BY_ACCELERATOR.get(device_type)
    if spec is None:
        raise ValueError(
            f"get_default_backend_for_device: no default backend for device type '{device_type}'"
        )
    return dict(entry.split(":") for entry in spec.split(","))[device_type] if ":" in spec else spec


def is_backend_available(backend: str) -> bool:
    """Whether commlayer has a backend of that name that can run here."""
    try:
        get_backend_class(str(backend).lower())
    except BackendUnavailableError:
        return False
    return True


def is_gloo_available() -> bool:
    """Whether the ``gloo`` backend can run here (torch's spelling of ``commlayer backends``).

    Returns:
        True when a backend named ``gloo`` is installed and available.

    Example::

        >>> dist.is_gloo_available()
        True
    """
    return is_backend_available("gloo")


def is_nccl_available() -> bool:
    """Whether the ``nccl`` backend can run here (torch's spelling of ``commlayer backends``).

    Returns:
        True when a backend named ``nccl`` is installed and available.

    Example::

        >>> dist.is_nccl_available()
        False
    """
    return is_backend_available("nccl")


def is_mpi_available() -> bool:
    """Whether the ``mpi`` backend can run here (torch's spelling of ``commlayer backends``).

    Returns:
        True when a backend named ``mpi`` is installed and available.

    Example::

        >>> dist.is_mpi_available()
        False
    """
    return is_backend_available("mpi")


def is_ucc_available() -> bool:
    """Whether the ``ucc`` backend can run here (torch's spelling of ``commlayer backends``).

    Returns:
        True when a backend named ``ucc`` is installed and available.

    Example::

        >>> dist.is_ucc_available()
        False
    """
    return is_backend_available("ucc")


def is_xccl_available() -> bool:
    """Whether the ``xccl`` backend can run here (torch's spelling of ``commlayer backends``).

    Returns:
        True when a backend named ``xccl`` is installed and available.

    Example::

        >>> dist.is_xccl_available()
        False
    """
    return is_backend_available("xccl")


def supports_complex(reduceOp: Any) -> bool:
    """Whether ``reduceOp`` is defined on complex tensors (SUM and AVG are; MAX, bitwise... are not)."""
    return ReduceOp.coerce(reduceOp) not in _NOT_COMPLEX


def _check_disjoint(op: str, arg: str, lists: Sequence[Sequence[int]], rank: int) -> None:
    seen: set[int] = set()
    for ranks in lists:
        overlap = seen.intersection(ranks)
        if overlap:
            raise invalid_argument(
                op, arg, "disjoint rank lists", f"rank(s) {sorted(overlap)} listed twice", rank
            )
        seen.update(ranks)
