"""torch's coalesced collectives: many tensors, one message.

Each backend runs them as its contract says (``Backend.all_reduce_coalesced``): gloo through torch's
own coalesced ops, whose profiler events are then torch's; the others pack the tensors into one
buffer for a single collective and unpack the results when the work completes. World of 2, rank r::

    a, b = torch.full((2,), r), torch.full((3,), 10 * r)
    all_reduce_coalesced([a, b])          # a == [1, 1], b == [10, 10, 10]
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch

from commlayer.core.boundary import user_facing
from commlayer.core.errors import InvalidTypeError, invalid_argument
from commlayer.core.types import ReduceOp
from commlayer.core.work import Work
from commlayer.facade.calls import validate as check
from commlayer.facade.calls.complex_tensors import as_real, is_complex, real_for_reduction
from commlayer.facade.calls.dispatch import begin, run_op
from commlayer.facade.calls.op_call import OpCall, averaged, wire_op
from commlayer.facade.calls.staging import CopyBack, contiguous
from commlayer.facade.calls.timeouts import rerun_with_timeout
from commlayer.facade.groups.group import current_world

__all__ = ["all_gather_coalesced", "all_reduce_coalesced"]


@user_facing
def all_reduce_coalesced(
    tensors: list[torch.Tensor],
    op: Any = ReduceOp.SUM,
    group: Any = None,
    async_op: bool = False,
    *,
    timeout: timedelta | float | None = None,
) -> Work | None:
    """All-reduce every tensor of ``tensors`` (one dtype and device) in a single collective.

    Complex tensors go as their real views, as in torch (SUM and AVG only), so a list may mix
    complex tensors with real ones of their component dtype.
    """
    if timeout is not None:
        return rerun_with_timeout(all_reduce_coalesced, locals())
    if isinstance(tensors, (list, tuple)) and any(map(is_complex, tensors)):
        complex_tensor = next(tensor for tensor in tensors if is_complex(tensor))
        real_for_reduction("all_reduce_coalesced", complex_tensor, op)
        tensors = [as_real(tensor) for tensor in tensors]
    tensors = _check_tensors("all_reduce_coalesced", "tensors", tensors)
    call = begin("all_reduce_coalesced", group, tensors[0].device)
    if call is None:
        return None
    reduce_op = check.check_reduce_op(call, op, tensors[0].dtype)
    copy_back: CopyBack = []
    buffers = [contiguous(tensor, copy_back) for tensor in tensors]
    wire = wire_op(call, reduce_op)
    return run_op(
        call,
        lambda b, mode: b.all_reduce_coalesced(buffers, wire, **mode),
        async_op=async_op,
        payload=tensors,
        copy_back=copy_back,
        average=averaged(call, reduce_op, buffers),
        reduce_op=reduce_op,
    )


@user_facing
def all_gather_coalesced(
    output_tensor_lists: list[list[torch.Tensor]],
    input_tensor_list: list[torch.Tensor],
    group: Any = None,
    async_op: bool = False,
    *,
    timeout: timedelta | float | None = None,
) -> Work | None:
    """``output_tensor_lists[r][i]`` receives group rank r's ``input_tensor_list[i]``."""
    if timeout is not None:
        return rerun_with_timeout(all_gather_coalesced, locals())
    inputs = _check_tensors("all_gather_coalesced", "input_tensor_list", input_tensor_list)
    call = begin("all_gather_coalesced", group, inputs[0].device)
    if call is None:
        return None
    _check_output_lists(call, output_tensor_lists, inputs)
    copy_back: CopyBack = []
    outputs = [[contiguous(tensor, copy_back) for tensor in row] for row in output_tensor_lists]
    sources = [tensor.contiguous() for tensor in inputs]
    return run_op(
        call,
        lambda b, mode: b.all_gather_coalesced(outputs, sources, **mode),
        async_op=async_op,
        payload=[tensor for row in output_tensor_lists for tensor in row],
        copy_back=copy_back,
        inputs=inputs,
    )


def _check_output_lists(call: OpCall, outputs: Any, inputs: list[torch.Tensor]) -> None:
    """One list per group rank, each shaped like the inputs (torch lets a mismatch through)."""
    size = call.group.size()
    if not isinstance(outputs, list) or len(outputs) != size:
        raise invalid_argument(
            call.op,
            "output_tensor_lists",
            f"a list of {size} lists (the group size)",
            type(outputs).__name__,
            call.rank,
        )
    expected = [(tensor.numel(), tensor.dtype) for tensor in inputs]
    for rank, row in enumerate(outputs):
        tensors = isinstance(row, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in row)
        received = [(t.numel(), t.dtype) for t in row] if tensors else type(row).__name__
        if received != expected:
            raise invalid_argument(
                call.op,
                f"output_tensor_lists[{rank}]",
                f"tensors of (elements, dtype) {expected}, as the inputs",
                received,
                call.rank,
            )


def _check_tensors(op: str, arg: str, tensors: Any) -> list[torch.Tensor]:
    rank = current_world(op).rank
    if (
        not isinstance(tensors, (list, tuple))
        or not tensors
        or not all(isinstance(t, torch.Tensor) for t in tensors)
    ):
        raise invalid_argument(
            op, arg, "a non-empty list of tensors", type(tensors).__name__, rank, InvalidTypeError
        )
    first = tensors[0]
    for index, tensor in enumerate(tensors):
        if tensor.dtype != first.dtype or tensor.device != first.device:
            raise invalid_argument(
                op,
                f"{arg}[{index}]",
                f"dtype {first.dtype} on {first.device} (same as {arg}[0])",
                f"{tensor.dtype} on {tensor.device}",
                rank,
            )
    return list(tensors)
