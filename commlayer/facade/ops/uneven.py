"""Uneven collectives: every rank contributes (or receives) a part of its own size.

torch.distributed has no such op: ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` need
equal parts. Here every rank passes the whole list of parts, so each rank knows every size; the
sizes are agreed across the group before any data moves (one small MAX reduction of a digest), so
ranks that disagree all raise :class:`~commlayer.core.errors.CollectiveMismatchError` instead of
receiving garbage. World of 2::

    out = [torch.empty(1), torch.empty(3)]
    dist.all_gather_v(out, torch.full((1 + 2 * rank,), float(rank)))  # rank 0: 1 element, rank 1: 3
    # out == [tensor([0.]), tensor([1., 1., 1.])] on both ranks

Backends run them natively where their library can (mpi: ``MPI_Allgatherv``,
``MPI_Reduce_scatter``) and through padded even collectives otherwise
(:class:`~commlayer.contract.fallbacks.GenericCollectives`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch

from commlayer.core.boundary import user_facing
from commlayer.core.errors import CollectiveMismatchError, invalid_argument
from commlayer.core.types import ReduceOp
from commlayer.core.work import Work
from commlayer.facade.calls import validate as check
from commlayer.facade.calls.dispatch import begin
from commlayer.facade.calls.docstrings import shared_docs
from commlayer.facade.calls.op_call import OpCall
from commlayer.facade.calls.timeouts import rerun_with_timeout
from commlayer.facade.ops.tensor_lists import gather_into_list, reduce_scatter_list

__all__ = ["all_gather_into_tensor_v", "all_gather_v", "reduce_scatter_v"]

_MAX = ReduceOp.MAX
CopyBack = list[tuple[torch.Tensor, torch.Tensor]]
_DIGEST_BITS = 62


@user_facing
@shared_docs
def all_gather_v(
    tensor_list: list[torch.Tensor],
    tensor: torch.Tensor,
    group: Any = None,
    async_op: bool = False,
    *,
    timeout: timedelta | float | None = None,
) -> Work | None:
    """Gather every rank's ``tensor``, of any size, into ``tensor_list`` on every rank.

    Args:
        tensor_list (list[Tensor]): one output per rank of ``group``, in group rank order; entry
            ``i`` holds as many elements as group rank ``i`` contributes. Every rank passes the same
            sizes.
        tensor (Tensor): this rank's contribution, with as many elements as its own entry.
        {{group}}
        {{async_op}}
        {{timeout}}

    Returns:
        {{work}}

    Raises:
        InvalidArgumentError: an argument was rejected before any communication.
        CollectiveMismatchError: on every rank, when the ranks passed different sizes.
        {{timeout errors}}

    Example::

        >>> out = [torch.empty(r + 1) for r in range(dist.get_world_size())]
        >>> dist.all_gather_v(out, torch.full((dist.get_rank() + 1,), float(dist.get_rank())))
        >>> out  # 2 ranks
        [tensor([0.]), tensor([1., 1.])]
    """
    if timeout is not None:
        return rerun_with_timeout(all_gather_v, locals())
    return gather_into_list("all_gather_v", tensor_list, tensor, group, async_op, _agreed_parts)


@user_facing
def all_gather_into_tensor_v(
    output_tensor: torch.Tensor,
    input_tensor: torch.Tensor,
    sizes: Sequence[int],
    group: Any = None,
    async_op: bool = False,
    *,
    timeout: timedelta | float | None = None,
) -> Work | None:
    """``all_gather_into_tensor`` with parts of different sizes: rank ``i``'s part of
    ``sizes[i]`` elements lands at offset ``sum(sizes[:i])`` of the flat ``output_tensor``.

    ``dist.all_gather_into_tensor(out, t, sizes=sizes)`` calls this; the arguments are as there,
    and ``sizes`` lists every rank's element count, the same on every rank.

    Example::

        >>> out = torch.empty(3)  # 2 ranks, sizes [1, 2]
        >>> dist.all_gather_into_tensor(out, torch.full((1 + dist.get_rank(),), 7.0), sizes=[1, 2])
        >>> out
        tensor([7., 7., 7.])
    """
    if timeout is not None:
        return rerun_with_timeout(all_gather_into_tensor_v, locals())
    call = begin("all_gather_v", group, check.first_device(input_tensor))
    if call is None:
        return None
    check.check_tensor(call, "output_tensor", output_tensor)
    counts = _check_sizes(call, sizes)
    check.check_numel(call, "output_tensor", output_tensor, sum(counts), "the sum of sizes")
    staged = output_tensor if output_tensor.is_contiguous() else output_tensor.contiguous()
    work = all_gather_v(list(staged.view(-1).split(counts)), input_tensor, group, async_op=True)
    assert work is not None  # this rank is a member: begin said so
    if staged is not output_tensor:
        work = work.then(lambda: output_tensor.copy_(staged), result=[output_tensor])
    if async_op:
        return work
    work.wait()
    return None


@user_facing
@shared_docs
def reduce_scatter_v(
    output: torch.Tensor,
    input_list: list[torch.Tensor],
    op: Any = ReduceOp.SUM,
    group: Any = None,
    async_op: bool = False,
    *,
    timeout: timedelta | float | None = None,
) -> Work | None:
    """Reduce ``input_list`` across ``group``; group rank ``i`` receives chunk ``i``, of its own size.

    Args:
        output (Tensor): receives this rank's reduced chunk.
        input_list (list[Tensor]): one chunk per rank; chunk ``i`` holds as many elements as group
            rank ``i``'s output. Every rank passes the same sizes.
        op (ReduceOp, optional): the reduction (SUM by default).
        {{group}}
        {{async_op}}
        {{timeout}}

    Returns:
        {{work}}

    Raises:
        InvalidArgumentError: an argument was rejected before any communication.
        CollectiveMismatchError: on every rank, when the ranks passed different sizes.
        {{timeout errors}}

    Example::

        >>> out = torch.empty(dist.get_rank() + 1)
        >>> dist.reduce_scatter_v(out, [torch.ones(1), torch.ones(2)])  # 2 ranks
        >>> out  # rank 1
        tensor([2., 2.])
    """
    if timeout is not None:
        return rerun_with_timeout(reduce_scatter_v, locals())
    return reduce_scatter_list("reduce_scatter_v", output, input_list, op, group, async_op, _agreed_parts)


def size_digest(op: str, sizes: Sequence[int], dtype: torch.dtype, reduce_op: Any = None) -> int:
    """A 62-bit digest of what the ranks must agree on; equal lists give equal digests everywhere."""
    text = f"{op}|{dtype}|{reduce_op}|{','.join(map(str, sizes))}"
    value = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
    return value >> (64 - _DIGEST_BITS)


def _check_sizes(call: OpCall, sizes: Any) -> list[int]:
    expected = f"a sequence of {call.group.size()} non-negative ints (one per rank)"
    if not isinstance(sizes, (list, tuple)) or len(sizes) != call.group.size():
        raise invalid_argument(call.op, "sizes", expected, sizes, call.rank)
    if not all(isinstance(size, int) and size >= 0 for size in sizes):
        raise invalid_argument(call.op, "sizes", expected, sizes, call.rank)
    return list(sizes)


def _agreed_parts(
    call: OpCall, name: str, parts: Sequence[torch.Tensor], tensor: torch.Tensor, reduce_op: Any
) -> None:
    """This rank's part as large as ``tensor``, and every rank passing the same sizes (the _v ops)."""
    own = call.group.rank()
    if name == "tensor_list":
        check.check_numel(call, "tensor", tensor, parts[own].numel(), "tensor_list[{}]'s", own)
    else:
        check.check_numel(call, f"{name}[{own}]", parts[own], tensor.numel(), "same as the output")
    _agree_on_sizes(call, [part.numel() for part in parts], tensor.dtype, tensor.device, reduce_op)


def _agree_on_sizes(
    call: OpCall, sizes: list[int], dtype: torch.dtype, device: torch.device, reduce_op: Any = None
) -> None:
    """Raise CollectiveMismatchError on every rank unless every rank passed the same sizes."""
    if call.group.size() == 1:
        return
    digest = size_digest(call.op, sizes, dtype, reduce_op)
    agreed = torch.tensor([digest, -digest], dtype=torch.int64, device=device)
    call.backend.all_reduce(agreed, _MAX, async_op=False).wait()
    highest, lowest = int(agreed[0]), -int(agreed[1])
    if highest != lowest:
        raise CollectiveMismatchError(
            f"{call.op}: the ranks of group '{call.group.name}' passed different sizes; this rank "
            f"passed {sizes} (rank {call.rank})",
            {call.rank: f"{call.op}({str(dtype).replace('torch.', '')}, sizes={sizes})"},
        )
