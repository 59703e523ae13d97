"""The ccl backend's fast paths (``Backend.recorded_plan``): the hot path.

The facade builds one fast path per kind of call and then calls ``run(async_op, *tensors)`` for
every call of that kind. What the kind fixes -- oneCCL's datatype and reduction, the op's root
or reduce op, the mismatch check -- is looked up once here, so a call enters the flight recorder
(the steps ``Recording`` lists), checks its signature when the check is on, posts the oneCCL op
on the tensors' memory and waits unless async: what the op methods do, less their per-call
lookups, frames and the facade's generic fast path around them.

An all-to-all with uneven splits takes the op method (its splits come with each call). The
backend hands the fast paths what they need as a :class:`CclFastPathContext`, read once per plan.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from commlayer.backends.ccl.native import CclWork, NativeTypes
from commlayer.contract.fast_paths import FastPath, FastPathContext
from commlayer.core.flight_recorder import PLANNED_PAYLOAD, Recording
from commlayer.core.work import Work

if TYPE_CHECKING:
    from commlayer.backends.ccl.bootstrap import Connection
    from commlayer.contract.mismatch import MismatchCheck

# start(async_op, *arguments) -> the call's Work: the op posted (checked first when the check is
# on), or the op method's Work where the call must take it (an all-to-all's uneven splits).
Start = Callable[..., Work]

__all__ = ["CclFastPathContext", "fast_path"]


@dataclass(frozen=True, kw_only=True)
class CclFastPathContext(FastPathContext):
    """One communicator's state as its fast paths use it (with FastPathContext's size, limit and
    op_method).

    Args:
        types: oneCCL's datatypes and reductions.
        signer: the signature check, None when it is off.
        live: the communicator's connection, raising CommError once it is shut down or expired.
        expire: marks the communicator unusable after an op timed out (the Work calls it).
    """

    types: NativeTypes
    signer: MismatchCheck | None
    live: Callable[[], Connection]
    expire: Callable[[str], None]


def fast_path(
    context: CclFastPathContext, op: str, fixed: tuple[Any, ...], recording: Recording
) -> FastPath | None:
    """``run(async_op, *tensors)`` for ``op``, or None where the op method's fast path must do."""
    starter = _STARTERS.get(op)
    if starter is None or recording.dtype not in context.types.datatypes:
        return None
    start = starter(context, fixed, recording.dtype)
    one_tensor = op in _ONE_TENSOR
    return None if start is None else recording.fast_path(PLANNED_PAYLOAD[op], start, one_tensor)


def _verify(context: CclFastPathContext) -> Callable[..., None] | None:
    """The mismatch check's ``verify(op, dtype, count, root, reduce_op)``, None when it is off."""
    signer = context.signer
    return None if signer is None else signer.verify


# --- what each op posts --------------------------------------------------------------------


def _all_reduce(context: CclFastPathContext, fixed: tuple[Any, ...], dtype: torch.dtype) -> Start | None:
    (reduce_op,) = fixed
    reduction = context.types.reductions.get(reduce_op)
    if reduction is None:  # AVG: the facade runs it as SUM before it plans
        return None
    datatype, verify, live = context.types.datatypes[dtype], _verify(context), context.live
    limit, expire = context.limit, context.expire

    def start(async_op: bool, tensor: torch.Tensor) -> Work:
        count, pointer = tensor.numel(), tensor.data_ptr()
        if verify is not None:
            verify("all_reduce", dtype, count, -1, reduce_op)
        event = live().communicator.allreduce(pointer, pointer, count, datatype, reduction)
        return CclWork(event, "all_reduce", limit, expire, (tensor,), (tensor,))

    return start


def _broadcast(context: CclFastPathContext, fixed: tuple[Any, ...], dtype: torch.dtype) -> Start | None:
    (root,) = fixed
    datatype, verify, live = context.types.datatypes[dtype], _verify(context), context.live
    limit, expire = context.limit, context.expire

    def start(async_op: bool, tensor: torch.Tensor) -> Work:
        count = tensor.numel()
        if verify is not None:
            verify("broadcast", dtype, count, root)
        event = live().communicator.broadcast(tensor.data_ptr(), count, datatype, root)
        return CclWork(event, "broadcast", limit, expire, (tensor,), (tensor,))

    return start


def _all_gather_into_tensor(
    context: CclFastPathContext, fixed: tuple[Any, ...], dtype: torch.dtype
) -> Start | None:
    datatype, verify, live = context.types.datatypes[dtype], _verify(context), context.live
    limit, expire = context.limit, context.expire

    def start(async_op: bool, output: torch.Tensor, tensor: torch.Tensor) -> Work:
        count = tensor.numel()
        if verify is not None:
            verify("all_gather_into_tensor", dtype, count)
        event = live().communicator.allgather(tensor.data_ptr(), output.data_ptr(), count, datatype)
        return CclWork(event, "all_gather_into_tensor", limit, expire, (output,), (output, tensor))

    return start


def _reduce_scatter_tensor(
    context: CclFastPathContext, fixed: tuple[Any, ...], dtype: torch.dtype
) -> Start | None:
    (reduce_op,) = fixed
    reduction = context.types.reductions.get(reduce_op)
    if reduction is None:
        return None
    datatype, verify, live = context.types.datatypes[dtype], _verify(context), context.live
    limit, expire = context.limit, context.expire

    def start(async_op: bool, output: torch.Tensor, tensor: torch.Tensor) -> Work:
        count = output.numel()
        if verify is not None:
            verify("reduce_scatter_tensor", dtype, count, -1, reduce_op)
        source, target = tensor.data_ptr(), output.data_ptr()
        event = live().communicator.reduce_scatter(source, target, count, datatype, reduction)
        return CclWork(event, "reduce_scatter_tensor", limit, expire, (output,), (output, tensor))

    return start


def _all_to_all_single(
    context: CclFastPathContext, fixed: tuple[Any, ...], dtype: torch.dtype
) -> Start | None:
    datatype, signer, live = context.types.datatypes[dtype], context.signer, context.live
    size, limit, expire = context.size, context.limit, context.expire
    method = context.op_method("all_to_all_single")

    def start(async_op: bool, output: torch.Tensor, tensor: torch.Tensor, *splits: Any) -> Work:
        if any(splits):  # uneven splits, given with each call: the op method's counts
            return method(output, tensor, *splits, *fixed, async_op=async_op)
        if signer is not None:
            signer.verify_all_to_all_single("all_to_all_single", output, tensor, None, None)
        count = tensor.numel() // size
        event = live().communicator.alltoall(tensor.data_ptr(), output.data_ptr(), count, datatype)
        return CclWork(event, "all_to_all_single", limit, expire, (output,), (output, tensor, *splits))

    return start


_ONE_TENSOR = frozenset({"all_reduce", "broadcast"})
_STARTERS: dict[str, Callable[[CclFastPathContext, tuple[Any, ...], torch.dtype], Start | None]] = {
    "all_reduce": _all_reduce,
    "broadcast": _broadcast,
    "all_gather_into_tensor": _all_gather_into_tensor,
    "reduce_scatter_tensor": _reduce_scatter_tensor,
    "all_to_all_single": _all_to_all_single,
}
