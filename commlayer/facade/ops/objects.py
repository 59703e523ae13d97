"""Collectives on picklable Python objects, built on the tensor collectives of this facade.

Objects are pickled into uint8 tensors on the backend's object device; sizes travel first so
every rank can pad to the largest payload, as torch does.
"""

from __future__ import annotations

import pickle
from typing import Any

import torch

from commlayer.core.boundary import user_facing
from commlayer.core.errors import InvalidTypeError, invalid_argument
from commlayer.facade.calls.docstrings import shared_docs
from commlayer.facade.groups.group import ProcessGroup, resolve_group
from commlayer.facade.ops import in_place as planned
from commlayer.facade.ops import into_tensor as paired
from commlayer.facade.ops import p2p, rooted

__all__ = [
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "recv_object_list",
    "scatter_object_list",
    "send_object_list",
]


@user_facing
@shared_docs
def all_gather_object(object_list: list[Any], obj: Any, group: Any = None) -> None:
    """Gather a picklable object from every rank into ``object_list`` on every rank.

    Args:
        object_list (list): one slot per rank of ``group``, filled in group rank order.
        obj (Any): this rank's picklable object.
        {{group}}

    Returns:
        None (``object_list`` is filled in place).

    Raises:
        {{argument errors}}
        CommTimeoutError: the op did not complete within the group's timeout.
        {{peer failure}}

    Example::

        >>> gathered = [None] * dist.get_world_size()
        >>> dist.all_gather_object(gathered, {'rank': dist.get_rank()})
        >>> gathered  # 2 ranks
        [{'rank': 0}, {'rank': 1}]
    """
    resolved = resolve_group("all_gather_object", group)
    if resolved is None:
        return
    _check_list("all_gather_object", "object_list", object_list, resolved.size(), resolved)
    payload = _pickle(obj, _device(resolved))
    sizes = _all_sizes(payload, group, resolved)
    padded = _pad(payload, max(sizes))
    gathered = padded.new_empty(resolved.size() * padded.numel())
    paired.all_gather_into_tensor(gathered, padded, group=group)
    for index, rows in enumerate(gathered.view(resolved.size(), -1)):
        object_list[index] = _unpickle(rows[: sizes[index]])


@user_facing
@shared_docs
def gather_object(
    obj: Any,
    object_gather_list: list[Any] | None = None,
    dst: int | None = None,
    group: Any = None,
    group_dst: int | None = None,
) -> None:
    """Collect a picklable object from every rank into ``object_gather_list`` on rank ``dst``.

    Args:
        obj (Any): this rank's picklable object.
        object_gather_list (list, optional): one slot per rank on ``dst``; None elsewhere.
        dst (int): global rank that collects (default 0).
        {{group}}
        group_dst (int, optional): ``dst`` given as a rank of ``group`` instead (not both).

    Returns:
        None (``object_gather_list`` is filled in place on ``dst``).

    Raises:
        {{argument errors}}
        CommTimeoutError: the op did not complete within the group's timeout.
        {{peer failure}}

    Example::

        >>> slots = [None, None] if dist.get_rank() == 0 else None
        >>> dist.gather_object(dist.get_rank(), slots, dst=0)
        >>> slots  # rank 0
        [0, 1]
    """
    resolved = resolve_group("gather_object", group)
    if resolved is None:
        return
    root = resolved.ranks[group_dst] if group_dst is not None else (0 if dst is None else dst)
    is_root = resolved.global_rank == root
    if is_root:
        _check_list("gather_object", "object_gather_list", object_gather_list, resolved.size(), resolved)
    payload = _pickle(obj, _device(resolved))
    sizes = _all_sizes(payload, group, resolved)
    padded = _pad(payload, max(sizes))
    slots = [torch.empty_like(padded) for _ in range(resolved.size())] if is_root else None
    rooted.gather(padded, slots, dst=root, group=group)
    if is_root:
        for index, slot in enumerate(slots or []):
            object_gather_list[index] = _unpickle(slot[: sizes[index]])  # type: ignore[index]


@user_facing
@shared_docs
def broadcast_object_list(
    object_list: list[Any],
    src: int | None = None,
    group: Any = None,
    device: torch.device | None = None,
    group_src: int | None = None,
) -> None:
    """Replace ``object_list``'s items on every rank with rank ``src``'s (picklable objects).

    Args:
        object_list (list): the objects on ``src``; a list of the same length elsewhere.
        src (int): global rank that sends (default 0).
        {{group}}
        device (torch.device, optional): where the pickled bytes are staged (the backend's choice by
            default).
        group_src (int, optional): ``src`` given as a rank of ``group`` instead (not both).

    Returns:
        None (``object_list`` is updated in place).

    Raises:
        {{argument errors}}
        CommTimeoutError: the op did not complete within the group's timeout.
        {{peer failure}}

    Example::

        >>> items = ['config', 3] if dist.get_rank() == 0 else [None, None]
        >>> dist.broadcast_object_list(items, src=0)
        >>> items
        ['config', 3]
    """
    resolved = resolve_group("broadcast_object_list", group)
    if resolved is None:
        return
    if not isinstance(object_list, list):
        raise invalid_argument(
            "broadcast_object_list",
            "object_list",
            "a list",
            type(object_list).__name__,
            resolved.global_rank,
            InvalidTypeError,  # torch's TypeError: it iterates over the argument
        )
    root = resolved.ranks[group_src] if group_src is not None else (0 if src is None else src)
    target = torch.device(device) if device is not None else _device(resolved)
    is_root = resolved.global_rank == root
    payloads = [_pickle(item, target) for item in object_list] if is_root else []
    sizes = torch.tensor(
        [p.numel() for p in payloads] or [0] * len(object_list), dtype=torch.int64, device=target
    )
    planned.broadcast(sizes, src=root, group=group)
    data = torch.cat(payloads) if is_root else torch.empty(int(sizes.sum()), dtype=torch.uint8, device=target)
    planned.broadcast(data, src=root, group=group)
    _unpickle_into(object_list, data, sizes)


@user_facing
@shared_docs
def scatter_object_list(
    scatter_object_output_list: list[Any],
    scatter_object_input_list: list[Any] | None = None,
    src: int | None = None,
    group: Any = None,
    group_src: int | None = None,
) -> None:
    """Send ``scatter_object_input_list[i]`` from rank ``src`` to group rank ``i``.

    Args:
        scatter_object_output_list (list): a list of at least one slot; slot 0 receives this rank's
            object.
        scatter_object_input_list (list, optional): one picklable object per rank on ``src``; None
            elsewhere.
        src (int): global rank that sends (default 0).
        {{group}}
        group_src (int, optional): ``src`` given as a rank of ``group`` instead (not both).

    Returns:
        None (``scatter_object_output_list[0]`` is set in place).

    Raises:
        {{argument errors}}
        CommTimeoutError: the op did not complete within the group's timeout.
        {{peer failure}}

    Example::

        >>> received = [None]
        >>> dist.scatter_object_list(received, ['a', 'b'] if dist.get_rank() == 0 else None, src=0)
        >>> received  # rank 1
        ['b']
    """
    resolved = resolve_group("scatter_object_list", group)
    if resolved is None:
        return
    if not isinstance(scatter_object_output_list, list) or not scatter_object_output_list:
        detail = invalid_argument(
            "scatter_object_list",
            "scatter_object_output_list",
            "a non-empty list",
            scatter_object_output_list,
            resolved.global_rank,
        )
        raise type(detail)(
            f"Expected argument scatter_object_output_list to be a list of size at least 1. {detail}"
        )
    root = resolved.ranks[group_src] if group_src is not None else (0 if src is None else src)
    is_root = resolved.global_rank == root
    device = _device(resolved)
    if is_root:
        _check_list(
            "scatter_object_list",
            "scatter_object_input_list",
            scatter_object_input_list,
            resolved.size(),
            resolved,
        )
    payloads = [_pickle(item, device) for item in scatter_object_input_list] if is_root else []  # type: ignore[union-attr]
    header = torch.tensor([max((p.numel() for p in payloads), default=0)], dtype=torch.int64, device=device)
    planned.broadcast(header, src=root, group=group)
    width = int(header.item()) + 8  # 8 leading bytes carry each payload's length
    framed = [_frame(p, width) for p in payloads] if is_root else None
    received = torch.empty(width, dtype=torch.uint8, device=device)
    rooted.scatter(received, framed, src=root, group=group)
    size = int(received[:8].view(torch.int64).item())
    scatter_object_output_list[0] = _unpickle(received[8 : 8 + size])


@user_facing
def send_object_list(
    object_list: list[Any],
    dst: int | None = None,
    group: Any = None,
    device: torch.device | None = None,
    group_dst: int | None = None,
    use_batch: bool = False,
) -> None:
    """Send the picklable objects of ``object_list`` to ``dst``: their sizes, then their bytes."""
    resolved = resolve_group("send_object_list", group)
    if resolved is None:
        return
    _check_object_list("send_object_list", object_list, resolved)
    target = torch.device(device) if device is not None else _device(resolved)
    payloads = [_pickle(item, target) for item in object_list]
    sizes = torch.tensor([p.numel() for p in payloads], dtype=torch.int64, device=target)
    p2p.send(sizes, dst, group=group, group_dst=group_dst)
    p2p.send(torch.cat(payloads), dst, group=group, group_dst=group_dst)


@user_facing
def recv_object_list(
    object_list: list[Any],
    src: int | None = None,
    group: Any = None,
    device: torch.device | None = None,
    group_src: int | None = None,
    use_batch: bool = False,
) -> int:
    """Fill ``object_list`` with the objects ``src`` sent; returns the sender's global rank."""
    resolved = resolve_group("recv_object_list", group)
    if resolved is None:
        return -1
    _check_object_list("recv_object_list", object_list, resolved)
    target = torch.device(device) if device is not None else _device(resolved)
    sizes = torch.empty(len(object_list), dtype=torch.int64, device=target)
    sender = p2p.recv(sizes, src, group=group, group_src=group_src)
    data = torch.empty(int(sizes.sum()), dtype=torch.uint8, device=target)
    p2p.recv(data, sender, group=group)
    _unpickle_into(object_list, data, sizes)
    return sender


# --- helpers ---------------------------------------------------------------------------------


def _device(group: ProcessGroup) -> torch.device:
    return group.primary_backend.object_device()


def _check_object_list(op: str, object_list: Any, group: ProcessGroup) -> None:
    if not isinstance(object_list, list) or not object_list:
        received = "an empty list" if isinstance(object_list, list) else type(object_list).__name__
        raise invalid_argument(op, "object_list", "a non-empty list", received, group.global_rank)


def _check_list(op: str, arg: str, values: Any, size: int, group: ProcessGroup) -> None:
    if not isinstance(values, list) or len(values) != size:
        received = f"a list of {len(values)}" if isinstance(values, list) else type(values).__name__
        raise invalid_argument(op, arg, f"a list of {size} (the group size)", received, group.global_rank)


def _all_sizes(payload: torch.Tensor, group: Any, resolved: ProcessGroup) -> list[int]:
    size = torch.tensor([payload.numel()], dtype=torch.int64, device=payload.device)
    sizes = size.new_empty(resolved.size())
    paired.all_gather_into_tensor(sizes, size, group=group)
    return sizes.tolist()


def _pickle(obj: Any, device: torch.device) -> torch.Tensor:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)


def _unpickle(data: torch.Tensor) -> Any:
    return pickle.loads(data.cpu().numpy().tobytes())


def _unpickle_into(object_list: list[Any], data: torch.Tensor, sizes: torch.Tensor) -> None:
    """Unpickle consecutive payloads of ``sizes`` bytes from ``data`` into ``object_list``."""
    offset = 0
    for index, size in enumerate(sizes.tolist()):
        object_list[index] = _unpickle(data[offset : offset + size])
        offset += size


def _pad(payload: torch.Tensor, size: int) -> torch.Tensor:
    padded = payload.new_zeros(size)
    padded[: payload.numel()] = payload
    return padded


def _frame(payload: torch.Tensor, width: int) -> torch.Tensor:
    framed = payload.new_zeros(width)
    framed[:8] = torch.tensor([payload.numel()], dtype=torch.int64).view(torch.uint8).to(payload.device)
    framed[8 : 8 + payload.numel()] = payload
    return framed
