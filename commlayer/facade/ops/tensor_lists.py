"""The tensor-list collectives (all_gather, reduce_scatter, all_to_all) and barrier, with
torch.distributed's signatures; each one validates, then dispatches on every call.

The hot ops, which run through plans (all_reduce, broadcast, all_gather_into_tensor,
reduce_scatter_tensor, all_to_all_single), live in :mod:`.in_place` and
:mod:`.into_tensor`; the collectives with a root (reduce, gather, scatter) in
:mod:`.rooted`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
from commlayer.facade.calls.failures import wait_translated
from commlayer.facade.calls.ignored_arguments import note_ignored
from commlayer.facade.calls.op_call import OpCall, averaged, wire_op
from commlayer.facade.calls.staging import CopyBack, contiguous
from commlayer.facade.calls.timeouts import rerun_with_timeout

__all__ = ["all_gather", "all_to_all", "barrier", "gather_into_list", "reduce_scatter", "reduce_scatter_list"]

# How an op checks the sizes of its parts: (call, name of the list, parts, the one tensor, the
# op's reduce op or None), after their dtypes; raises before any data moves.
PartsCheck = Callable[[OpCall, str, Sequence[torch.Tensor], torch.Tensor, Any], None]


@user_facing
@complex_as_real("all_gather")
@shared_docs
def all_gather(
    tensor_list: list[torch.Tensor],
    tensor: torch.Tensor,
    group: Any = None,
    async_op: bool = False,
    *,
    timeout: timedelta | float | None = None,
) -> Work | None:
    """Gather every rank's ``tensor`` into ``tensor_list`` on every rank, in group rank order.

    Args:
        tensor_list (list[Tensor]): one output per rank of ``group``, each shaped like ``tensor``.
        tensor (Tensor): this rank's contribution.
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

        >>> outputs = [torch.zeros(1) for _ in range(dist.get_world_size())]
        >>> dist.all_gather(outputs, torch.tensor([float(dist.get_rank())]))
        >>> outputs  # 2 ranks
        [tensor([0.]), tensor([1.])]
    """
    if timeout is not None:
        return rerun_with_timeout(all_gather, locals())
    return gather_into_list("all_gather", tensor_list, tensor, group, async_op, _equal_parts)


@user_facing
@shared_docs
def reduce_scatter(
    output: torch.Tensor,
    input_list: list[torch.Tensor],
    op: Any = ReduceOp.SUM,
    group: Any = None,
    async_op: bool = False,
    *,
    timeout: timedelta | float | None = None,
) -> Work | None:
    """Reduce ``input_list`` across ``group`` and leave chunk ``i`` of the result on group rank ``i``.

    Args:
        output (Tensor): receives this rank's reduced chunk.
        input_list (list[Tensor]): one chunk per rank, each shaped like ``output``.
        op (ReduceOp, optional): the reduction (SUM by default).
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

        >>> output = torch.zeros(1)
        >>> dist.reduce_scatter(output, [torch.ones(1), torch.ones(1) * 2])  # 2 ranks, same inputs
        >>> output  # rank 1
        tensor([4.])
    """
    if timeout is not None:
        return rerun_with_timeout(reduce_scatter, locals())
    return reduce_scatter_list("reduce_scatter", output, input_list, op, group, async_op, _equal_parts)


def gather_into_list(
    op: str,
    tensor_list: list[torch.Tensor],
    tensor: torch.Tensor,
    group: Any,
    async_op: bool,
    parts: PartsCheck,
) -> Work | None:
    """all_gather and all_gather_v: every rank's ``tensor`` into ``tensor_list``, the parts' sizes
    checked by ``parts``."""
    call = begin(op, group, check.first_device(tensor))
    if call is None:
        return None
    check.check_tensor(call, "tensor", tensor)
    outputs = check.check_tensor_list(call, "tensor_list", tensor_list, call.group.size())
    for index, output in enumerate(outputs):
        check.check_dtype_match(call, f"tensor_list[{index}]", output, tensor)
    parts(call, "tensor_list", outputs, tensor, None)
    copy_back: CopyBack = []
    buffers = [contiguous(output, copy_back) for output in outputs]
    source = tensor.contiguous()
    return run_op(
        call,
        lambda b, hint: getattr(b, op)(buffers, source, **hint),
        async_op=async_op,
        payload=outputs,
        copy_back=copy_back,
        inputs=tensor,
    )


def reduce_scatter_list(
    op: str,
    output: torch.Tensor,
    input_list: list[torch.Tensor],
    reduce_op_arg: Any,
    group: Any,
    async_op: bool,
    parts: PartsCheck,
) -> Work | None:
    """reduce_scatter and reduce_scatter_v: ``input_list`` reduced, chunk ``i`` to group rank ``i``,
    the chunks' sizes checked by ``parts``."""
    call = begin(op, group, check.first_device(output))
    if call is None:
        return None
    check.check_tensor(call, "output", output)
    inputs = check.check_tensor_list(call, "input_list", input_list, call.group.size())
    for index, chunk in enumerate(inputs):
        check.check_dtype_match(call, f"input_list[{index}]", chunk, output)
    reduce_op = check.check_reduce_op(call, reduce_op_arg, output.dtype)
    parts(call, "input_list", inputs, output, reduce_op)
    copy_back: CopyBack = []
    buffer = contiguous(output, copy_back)
    sources = [chunk.contiguous() for chunk in inputs]
    wire = wire_op(call, reduce_op)
    return run_op(
        call,
        lambda b, mode: getattr(b, op)(buffer, sources, wire, **mode),
        async_op=async_op,
        payload=inputs,
        copy_back=copy_back,
        average=averaged(call, reduce_op, (buffer,)),
        reduce_op=reduce_op,
    )


def _equal_parts(
    call: OpCall, name: str, parts: Sequence[torch.Tensor], tensor: torch.Tensor, reduce_op: Any
) -> None:
    """Every part as large as ``tensor`` (all_gather, reduce_scatter)."""
    other = "the input" if name == "tensor_list" else "the output"
    for index, part in enumerate(parts):
        check.check_numel(call, f"{name}[{index}]", part, tensor.numel(), f"same as {other}")


@user_facing
@complex_as_real("all_to_all")
@shared_docs
def all_to_all(
    output_tensor_list: list[torch.Tensor],
    input_tensor_list: list[torch.Tensor],
    group: Any = None,
    async_op: bool = False,
    *,
    timeout: timedelta | float | None = None,
) -> Work | None:
    """Each rank sends ``input_tensor_list[j]`` to rank ``j`` and receives rank ``j``'s into ``output_tensor_list[j]``.

    Args:
        output_tensor_list (list[Tensor]): one tensor per rank, filled with what that rank sent.
        input_tensor_list (list[Tensor]): one tensor per rank, sent to that rank.
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

        >>> outputs = [torch.zeros(1), torch.zeros(1)]
        >>> dist.all_to_all(outputs, [torch.tensor([float(dist.get_rank())])] * 2)  # 2 ranks
        >>> outputs
        [tensor([0.]), tensor([1.])]
    """
    if timeout is not None:
        return rerun_with_timeout(all_to_all, locals())
    call = begin("all_to_all", group, check.first_device(input_tensor_list))
    if call is None:
        return None
    size = call.group.size()
    inputs = check.check_tensor_list(call, "input_tensor_list", input_tensor_list, size)
    outputs = check.check_tensor_list(call, "output_tensor_list", output_tensor_list, size)
    for index, output in enumerate(outputs):
        check.check_dtype_match(call, f"output_tensor_list[{index}]", output, inputs[0])
    copy_back: CopyBack = []
    buffers = [contiguous(output, copy_back) for output in outputs]
    sources = [chunk.contiguous() for chunk in inputs]
    return run_op(
        call,
        lambda b, hint: b.all_to_all(buffers, sources, **hint),
        async_op=async_op,
        payload=inputs,
        copy_back=copy_back,
    )


@user_facing
@shared_docs
def barrier(
    group: Any = None,
    async_op: bool = False,
    device_ids: Sequence[int] | None = None,
    timeout: timedelta | float | None = None,
) -> Work | None:
    """Wait until every rank of ``group`` has reached this call.

    Args:
        {{group}}
        {{async_op}}
        device_ids (list[int], optional): accepted for torch compatibility; logged once, it has no
            effect here.
        timeout (timedelta or float, optional): how long this call may take; past it,
            CommTimeoutError names the op, group and rank (an async call's Work carries the
            deadline). None: the group's timeout.

    Returns:
        {{work}}

    Raises:
        {{argument errors}}
        CommTimeoutError: the op did not complete within the group's timeout.
        {{peer failure}}

    Example::

        >>> dist.barrier()  # every rank continues only once all have arrived
    """
    if timeout is not None:
        return rerun_with_timeout(barrier, locals())
    call = begin("barrier", group)
    if call is None:
        return None
    if device_ids is not None:
        note_ignored("barrier", "device_ids", device_ids)
    work = run_op(call, lambda b, hint: b.barrier(**hint), async_op=True)
    if async_op:
        return work
    wait_translated(work, "barrier", group)
    return None
