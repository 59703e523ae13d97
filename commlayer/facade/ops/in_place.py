"""The hot in-place collectives (all_reduce, broadcast): validated once per kind of call, then
run through a plan.

Each op first asks its lookup (:mod:`commlayer.facade.calls.plans`) for a plan under its key (what its
validation depended on, see :mod:`commlayer.facade.calls.plans`) and runs it; a miss goes to the op's
``_checked_`` twin, which validates in full and builds the plan. ``src`` is a global rank, as
in torch. The output/input collectives live in :mod:`.into_tensor`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch

from commlayer.core.boundary import hide_internal_frames
from commlayer.core.errors import CommError
from commlayer.core.types import ReduceOp
from commlayer.core.work import Work
from commlayer.facade.calls import validate as check
from commlayer.facade.calls.complex_tensors import complex_as_real
from commlayer.facade.calls.dispatch import begin, remember
from commlayer.facade.calls.docstrings import shared_docs
from commlayer.facade.calls.plans import NO_PLAN, planned_all_reduce, planned_broadcast, run_staged
from commlayer.facade.calls.staging import CopyBack, contiguous
from commlayer.facade.calls.timeouts import rerun_with_timeout

__all__ = ["all_reduce", "broadcast"]


@shared_docs
def all_reduce(
    tensor: torch.Tensor,
    op: Any = ReduceOp.SUM,
    group: Any = None,
    async_op: bool = False,
    *,
    timeout: timedelta | float | None = None,
) -> Work | None:
    """Reduce ``tensor`` across every rank of ``group``, in place, so each rank holds the result.

    Args:
        tensor (Tensor): input and output of the collective, the same shape on every rank.
        op (ReduceOp, optional): how to combine: SUM (default), AVG, PRODUCT, MIN, MAX, BAND, BOR,
            BXOR; torch.distributed.ReduceOp values are accepted too.
        {{group}}
        {{async_op}}
        {{timeout}}

    Returns:
        {{work}}

    Raises:
        {{argument errors}}
        {{timeout errors}}
        {{peer failure}}

    Example::

        >>> tensor = torch.ones(2) * (dist.get_rank() + 1)  # 2 ranks: [1, 1] and [2, 2]
        >>> dist.all_reduce(tensor)
        >>> tensor
        tensor([3., 3.])
    """
    try:
        if timeout is not None:
            return rerun_with_timeout(all_reduce, locals())
        work = planned_all_reduce(tensor, op, group, async_op, None)
        if work is not NO_PLAN:
            return work
        return _checked_all_reduce(tensor, op, group, async_op)
    except CommError as error:
        hide_internal_frames(error)
        raise


@complex_as_real("all_reduce", reduction=True)
def _checked_all_reduce(tensor: torch.Tensor, op: Any, group: Any, async_op: bool) -> Work | None:
    call = begin("all_reduce", group, check.first_device(tensor))
    if call is None:
        return None
    check.check_tensor(call, "tensor", tensor)
    reduce_op = check.check_reduce_op(call, op, tensor.dtype)
    key = ("all_reduce", group, op, tensor.dtype, tensor.device, tensor.layout)
    # Only commlayer's ReduceOp: torch's values equal small ints, which must still be refused.
    plan = remember(key, isinstance(op, ReduceOp), call, "all_reduce", reduce_op, dtype=tensor.dtype)
    copy_back: CopyBack = []
    return run_staged(plan, async_op, copy_back, contiguous(tensor, copy_back))


@shared_docs
def broadcast(
    tensor: torch.Tensor,
    src: int | None = None,
    group: Any = None,
    async_op: bool = False,
    group_src: int | None = None,
    *,
    timeout: timedelta | float | None = None,
) -> Work | None:
    """Copy rank ``src``'s ``tensor`` into ``tensor`` on every other rank of ``group``.

    Args:
        tensor (Tensor): the data on ``src``; overwritten on every other rank.
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

        >>> tensor = torch.arange(2.0) if dist.get_rank() == 0 else torch.zeros(2)
        >>> dist.broadcast(tensor, src=0)
        >>> tensor
        tensor([0., 1.])
    """
    try:
        if timeout is not None:
            return rerun_with_timeout(broadcast, locals())
        work = planned_broadcast(tensor, src, group, async_op, group_src)
        if work is not NO_PLAN:
            return work
        return _checked_broadcast(tensor, src, group, async_op, group_src)
    except CommError as error:
        hide_internal_frames(error)
        raise


@complex_as_real("broadcast")
def _checked_broadcast(
    tensor: torch.Tensor, src: int | None, group: Any, async_op: bool, group_src: int | None
) -> Work | None:
    call = begin("broadcast", group, check.first_device(tensor))
    if call is None:
        return None
    check.check_tensor(call, "tensor", tensor)
    root = check.check_root(call, "src", src, group_src)
    key = ("broadcast", group, src, tensor.dtype, tensor.device, tensor.layout)
    plan = remember(key, group_src is None, call, "broadcast", root, dtype=tensor.dtype)
    copy_back: CopyBack = []
    return run_staged(plan, async_op, copy_back, contiguous(tensor, copy_back))
