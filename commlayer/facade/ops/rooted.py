"""The collectives with a root (reduce, gather, scatter), with torch.distributed's signatures;
each one validates, then dispatches on every call.

``src``/``dst`` are global ranks, as in torch. Example, world of 4, ``g = new_group([1, 3])``:
``gather(t, gather_list, dst=3, group=g)`` collects on global rank 3 (group rank 1).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch

from commlayer.core.boundary import user_facing
from commlayer.core.types import ReduceOp
from commlayer.core.work import Work
from commlayer.facade.calls import validate as check
from commlayer.facade.calls.complex_tensors import complex_as_real
from commlayer.facade.calls.dispatch import begin, run_op
from commlayer.facade.calls.docstrings import shared_docs
from commlayer.facade.calls.op_call import averaged, wire_op
from commlayer.facade.calls.staging import CopyBack, contiguous
from commlayer.facade.calls.timeouts import rerun_with_timeout

__all__ = ["gather", "reduce", "scatter"]


@user_facing
@shared_docs
def reduce(
    tensor: torch.Tensor,
    dst: int | None = None,
    op: Any = ReduceOp.SUM,
    group: Any = None,
    async_op: bool = False,
    group_dst: int | None = None,
    *,
    timeout: timedelta | float | None = None,
) -> Work | None:
    """Reduce ``tensor`` across ``group`` into the tensor of rank ``dst``.

    Args:
        tensor (Tensor): input on every rank; the result on ``dst`` (other ranks' contents are
            unspecified).
        dst (int): global rank that receives the result (default 0).
        op (ReduceOp, optional): the reduction (SUM by default).
        {{group}}
        {{async_op}}
        {{timeout}}
        group_dst (int, optional): ``dst`` given as a rank of ``group`` instead (not both).

    Returns:
        {{work}}

    Raises:
        {{argument errors}}
        {{timeout errors}}
        {{peer failure}}

    Example::

        >>> tensor = torch.ones(2) * (dist.get_rank() + 1)
        >>> dist.reduce(tensor, dst=0)
        >>> tensor  # on rank 0 of 2
        tensor([3., 3.])
    """
    if timeout is not None:
        return rerun_with_timeout(reduce, locals())
    call = begin("reduce", group, check.first_device(tensor))
    if call is None:
        return None
    check.check_tensor(call, "tensor", tensor)
    root = check.check_root(call, "dst", dst, group_dst)
    reduce_op = check.check_reduce_op(call, op, tensor.dtype)
    copy_back: CopyBack = []
    buffer = contiguous(tensor, copy_back)
    wire = wire_op(call, reduce_op)
    return run_op(
        call,
        lambda b, mode: b.reduce(buffer, root, wire, **mode),
        async_op=async_op,
        payload=tensor,
        copy_back=copy_back,
        root=root,
        average=averaged(call, reduce_op, (buffer,)) if call.group.rank() == root else (),
        reduce_op=reduce_op,
    )


@user_facing
@shared_docs
def gather(
    tensor: torch.Tensor,
    gather_list: list[torch.Tensor] | None = None,
    dst: int | None = None,
    group: Any = None,
    async_op: bool = False,
    group_dst: int | None = None,
    *,
    timeout: timedelta | float | None = None,
) -> Work | None:
    """Collect every rank's ``tensor`` into ``gather_list`` on rank ``dst``.

    Args:
        tensor (Tensor): this rank's contribution.
        gather_list (list[Tensor], optional): one output per rank on ``dst``; None on the other
            ranks.
        dst (int): global rank that collects (default 0).
        {{group}}
        {{async_op}}
        {{timeout}}
        group_dst (int, optional): ``dst`` given as a rank of ``group`` instead (not both).

    Returns:
        {{work}}

    Raises:
        {{argument errors}}
        {{timeout errors}}
        {{peer failure}}

    Example::

        >>> slots = [torch.zeros(1) for _ in range(2)] if dist.get_rank() == 0 else None
        >>> dist.gather(torch.tensor([float(dist.get_rank())]), slots, dst=0)
        >>> slots  # rank 0
        [tensor([0.]), tensor([1.])]
    """
    if timeout is not None:
        return rerun_with_timeout(gather, locals())
    call = begin("gather", group, check.first_device(tensor))
    if call is None:
        return None
    check.check_tensor(call, "tensor", tensor)
    root = check.check_root(call, "dst", dst, group_dst)
    outputs = check.check_root_list(call, "gather_list", gather_list, root, tensor)
    copy_back: CopyBack = []
    buffers = None if outputs is None else [contiguous(output, copy_back) for output in outputs]
    source = tensor.contiguous()
    return run_op(
        call,
        lambda b, hint: b.gather(source, buffers, root, **hint),
        async_op=async_op,
        payload=tensor,
        copy_back=copy_back,
        root=root,
    )


@user_facing
@complex_as_real("scatter")
@shared_docs
def scatter(
    tensor: torch.Tensor,
    scatter_list: list[torch.Tensor] | None = None,
    src: int | None = None,
    group: Any = None,
    async_op: bool = False,
    group_src: int | None = None,
    *,
    timeout: timedelta | float | None = None,
) -> Work | None:
    """Send ``scatter_list[i]`` from rank ``src`` to group rank ``i``, into its ``tensor``.

    Args:
        tensor (Tensor): receives this rank's piece.
        scatter_list (list[Tensor], optional): one piece per rank on ``src``; None on the other
            ranks.
        src (int): global rank that sends (default 0).
        {{group}}
        {{async_op}}
        {{timeout}}
        group_src (int, optional): ``src`` given as a rank of ``group`` instead (not both).

    Returns:
        {{work}}

    Raises:
        {{argument errors}}
        {{timeout errors}}
        {{peer failure}}

    Example::

        >>> pieces = [torch.zeros(1), torch.ones(1)] if dist.get_rank() == 0 else None
        >>> received = torch.empty(1)
        >>> dist.scatter(received, pieces, src=0)
        >>> received  # rank 1
        tensor([1.])
    """
    if timeout is not None:
        return rerun_with_timeout(scatter, locals())
    call = begin("scatter", group, check.first_device(tensor))
    if call is None:
        return None
    check.check_tensor(call, "tensor", tensor)
    root = check.check_root(call, "src", src, group_src)
    inputs = check.check_root_list(call, "scatter_list", scatter_list, root, tensor)
    copy_back: CopyBack = []
    buffer = contiguous(tensor, copy_back)
    sources = None if inputs is None else [chunk.contiguous() for chunk in inputs]
    return run_op(
        call,
        lambda b, hint: b.scatter(buffer, sources, root, **hint),
        async_op=async_op,
        payload=tensor,
        copy_back=copy_back,
        root=root,
        inputs=() if inputs is None else inputs,
    )
