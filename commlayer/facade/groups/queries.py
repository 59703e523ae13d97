"""What torch.distributed answers about groups: is_available, is_initialized and the rank/size
getters (get_rank, get_world_size, get_backend, get_process_group_ranks, get_global_rank,
get_group_rank)."""

from __future__ import annotations

from commlayer.core.boundary import hide_internal_frames, user_facing
from commlayer.core.errors import CommError, InvalidArgumentError, invalid_argument
from commlayer.facade.groups.group import ProcessGroup, current_world, resolve_group, world_or_none

__all__ = [
    "get_backend",
    "get_global_rank",
    "get_group_rank",
    "get_process_group_ranks",
    "get_rank",
    "get_world_size",
    "is_available",
    "is_initialized",
    "member_group",
]


def is_available() -> bool:
    """Whether distributed support is usable in this process (it is whenever commlayer imports).

    Returns:
        True.

    Example::

        >>> dist.is_available()
        True
    """
    return True


def is_initialized() -> bool:
    """Whether init_process_group has run (and destroy_process_group has not since).

    Returns:
        True once a default group exists.

    Example::

        >>> dist.is_initialized()
        False
    """
    return world_or_none() is not None


def get_rank(group: ProcessGroup | None = None) -> int:
    """This process's rank in ``group`` (global rank by default); -1 when not a member."""
    try:
        resolved = resolve_group("get_rank", group)
        return -1 if resolved is None else resolved.rank()
    except CommError as error:
        hide_internal_frames(error)
        raise


def get_world_size(group: ProcessGroup | None = None) -> int:
    """The number of ranks in ``group``.

    Args:
        group (ProcessGroup, optional): the group to work on; None is the default (world) group.

    Returns:
        The size of ``group``; -1 on a rank outside it.

    Raises:
        NotInitializedError: (a ValueError) init_process_group has not run.

    Example::

        >>> dist.get_world_size()
        2
    """
    try:
        resolved = resolve_group("get_world_size", group)
        return -1 if resolved is None else resolved.size()
    except CommError as error:
        hide_internal_frames(error)
        raise


@user_facing
def get_backend(group: ProcessGroup | None = None) -> str:
    """The backend specification ``group`` runs on.

    Args:
        group (ProcessGroup, optional): the group to work on; None is the default (world) group.

    Returns:
        A string such as ``"gloo"`` or ``"cpu:gloo,cuda:nccl"``.

    Raises:
        NotInitializedError: (a ValueError) init_process_group has not run.

    Example::

        >>> dist.get_backend()
        'gloo'
    """
    resolved = member_group("get_backend", group)
    return resolved.backend_spec


@user_facing
def get_process_group_ranks(group: ProcessGroup | None) -> list[int]:
    """The global ranks of ``group``, in group rank order.

    Args:
        group (ProcessGroup): the group.

    Returns:
        A list of global ranks.

    Raises:
        NotInitializedError: (a ValueError) init_process_group has not run.

    Example::

        >>> dist.get_process_group_ranks(dist.new_group([3, 1]))
        [1, 3]
    """
    resolved = member_group("get_process_group_ranks", group)
    return list(resolved.ranks)


@user_facing
def get_global_rank(group: ProcessGroup | None, group_rank: int) -> int:
    """The global rank of ``group``'s rank ``group_rank``.

    Args:
        group (ProcessGroup): the group.
        group_rank (int): a rank inside ``group``.

    Returns:
        The matching global rank.

    Raises:
        NotInitializedError: (a ValueError) init_process_group has not run.
        InvalidArgumentError: ``group_rank`` is not a rank of ``group``.

    Example::

        >>> g = dist.new_group([1, 3])
        >>> dist.get_global_rank(g, 1)
        3
    """
    resolved = member_group("get_global_rank", group)
    if not isinstance(group_rank, int) or not 0 <= group_rank < resolved.size():
        raise invalid_argument(
            "get_global_rank",
            "group_rank",
            f"an int in [0, {resolved.size()})",
            group_rank,
            resolved.global_rank,
        )
    return resolved.ranks[group_rank]


@user_facing
def get_group_rank(group: ProcessGroup | None, global_rank: int) -> int:
    """The rank inside ``group`` of global rank ``global_rank``.

    Args:
        group (ProcessGroup): the group.
        global_rank (int): a global rank that belongs to ``group``.

    Returns:
        The matching group rank.

    Raises:
        NotInitializedError: (a ValueError) init_process_group has not run.
        InvalidArgumentError: ``global_rank`` is not a member of ``group``.

    Example::

        >>> g = dist.new_group([1, 3])
        >>> dist.get_group_rank(g, 3)
        1
    """
    resolved = member_group("get_group_rank", group)
    if global_rank not in resolved.ranks:
        raise invalid_argument(
            "get_group_rank",
            "global_rank",
            f"one of the group's ranks {list(resolved.ranks)}",
            global_rank,
            resolved.global_rank,
        )
    return resolved.ranks.index(global_rank)


def member_group(op: str, group: ProcessGroup | None) -> ProcessGroup:
    """``group`` resolved, refused with InvalidArgumentError on a rank outside it."""
    resolved = resolve_group(op, group)
    if resolved is None:
        world = current_world(op)
        raise InvalidArgumentError(f"{op}: rank {world.rank} is not a member of {group!r}")
    return resolved
