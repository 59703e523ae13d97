"""An all-to-all that autograd can differentiate: scatter one dim, gather another, and back.

``exchange(group, (q, k, v), scatter_dim=2, gather_dim=1)`` cuts each tensor into ``P`` equal
chunks along ``scatter_dim`` (``P`` the group size), sends chunk ``p`` to group rank ``p`` and
concatenates what arrives along ``gather_dim``, in group-rank order. Its gradient is the same
exchange with the two dims swapped, so backward is one more all-to-all.

Tensors of one shape travel in a single ``all_to_all_single`` (q, k and v of multi-head
attention: one collective instead of three); other shapes travel one by one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from commlayer import dist
from commlayer.dist import ProcessGroup

__all__ = ["exchange"]


def exchange(
    group: ProcessGroup, tensors: Sequence[torch.Tensor], scatter_dim: int, gather_dim: int
) -> tuple[torch.Tensor, ...]:
    """All-to-all ``tensors`` over ``group`` (differentiable); see the module docstring.

    Every size along ``scatter_dim`` must be divisible by the group size (callers check it
    before calling, with their own argument names).
    """
    if group.size() == 1:
        return tuple(tensors)
    return _AllToAll.apply(group, scatter_dim, gather_dim, *tensors)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, group: ProcessGroup, scatter_dim: int, gather_dim: int, *tensors: torch.Tensor):
        ctx.group, ctx.scatter_dim, ctx.gather_dim = group, scatter_dim, gather_dim
        return _exchange_all(group, tensors, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor):
        swapped = _exchange_all(ctx.group, grads, ctx.gather_dim, ctx.scatter_dim)
        return (None, None, None, *swapped)


def _exchange_all(
    group: ProcessGroup, tensors: Sequence[torch.Tensor], scatter_dim: int, gather_dim: int
) -> tuple[torch.Tensor, ...]:
    shapes = {(t.shape, t.dtype) for t in tensors}
    if len(shapes) == 1:
        return _exchange_same_shape(group, tensors, scatter_dim, gather_dim)
    return tuple(_exchange_same_shape(group, [t], scatter_dim, gather_dim)[0] for t in tensors)


def _exchange_same_shape(
    group: ProcessGroup, tensors: Sequence[torch.Tensor], scatter_dim: int, gather_dim: int
) -> tuple[torch.Tensor, ...]:
    size = group.size()
    ndim = tensors[0].dim()
    scatter_dim, gather_dim = scatter_dim % ndim, gather_dim % ndim
    # (P, n, ...): chunk p of every tensor lies contiguous at send[p], ready for an even split.
    chunks = [t.unflatten(scatter_dim, (size, -1)).movedim(scatter_dim, 0) for t in tensors]
    if len(chunks) == 1 and chunks[0].is_contiguous():  # already in send order: no copy
        send = chunks[0].unsqueeze(1)
    else:
        send = torch.stack(chunks, dim=1)
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    # received[p] came from group rank p: it is chunk p of the gathered dim.
    return tuple(
        received[:, index].movedim(0, gather_dim).flatten(gather_dim, gather_dim + 1)
        for index in range(len(tensors))
    )
