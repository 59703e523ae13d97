"""The ccl backend's fused launchers (``Backend.recorded_plan``): the hot path.

The facade builds one launcher per kind of call and then calls ``run(async_op, *tensors)`` for
every call of that kind. What the kind fixes -- oneCCL's datatype and reduction, the op's root
or reduce op, the mismatch check -- is looked up once here, so a call enters the flight recorder
(the steps ``Recording`` lists), checks its signature when the check is on, posts the oneCCL op
on the tensors' memory and waits unless async: what the op methods do, less their per-call
lookups, frames and the facade's generic launcher around them.

An all-to-all with uneven splits takes the op method (its splits come with each call). The
backend hands the launchers what they need as a :class:`LaunchContext`, read once per plan.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from commlayer.flight_recorder import (
    COMPLETED,
    COMPLETED_NS,
    PLANNED_PAYLOAD,
    STARTED,
    STATE,
    WORK,
    Recording,
)
from commlayer.work import WaitLimit, Work

from ._native import CclWork, NativeTypes

if TYPE_CHECKING:
    from .._signer import Signer
    from ._bootstrap import Connection

# post(*arguments) -> (oneCCL's event, the Work's result): the op, checked first when the check is
# on; None where this call must take the op method (an all-to-all's uneven splits).
Post = Callable[..., tuple[Any, tuple[torch.Tensor, ...]] | None]

__all__ = ["LaunchContext", "fused_launcher"]

_monotonic_ns = time.monotonic_ns
_weak = weakref.ref


@dataclass(frozen=True)
class LaunchContext:
    """One communicator's state as its launchers use it.

    Args:
        types: oneCCL's datatypes and reductions.
        signer: the signature check, None when it is off.
        live: the communicator's connection, raising CommError once it is shut down or expired.
        limit: the group's wait limit.
        expire: marks the communicator unusable after an op timed out (the Work calls it).
        size: the group's size.
        op_method: the backend's method of each op (``op_method(op)``), for the calls the
            launchers hand back to it (an all-to-all's uneven splits).
    """

    types: NativeTypes
    signer: Signer | None
    live: Callable[[], Connection]
    limit: WaitLimit
    expire: Callable[[str], None]
    size: int
    op_method: Callable[[str], Callable[..., Work]]


def fused_launcher(
    context: LaunchContext, op: str, fixed: tuple[Any, ...], recording: Recording
) -> Callable[..., Work | None] | None:
    """``run(async_op, *tensors)`` for ``op``, or None where the op method's launcher must do."""
    poster = _POSTERS.get(op)
    if poster is None or recording.dtype not in context.types.datatypes:
        return None
    post = poster(context, fixed, recording.dtype)
    return None if post is None else _launcher(context, op, fixed, recording, post)


def _launcher(
    context: LaunchContext, op: str, fixed: tuple[Any, ...], recording: Recording, post: Post
) -> Callable[..., Work | None]:
    next_seq, ring, capacity, name, dtype, root, fail = recording
    payload, method = PLANNED_PAYLOAD[op], context.op_method(op)
    limit, expire = context.limit, context.expire

    def run(async_op: bool, *arguments: Any) -> Work | None:
        seq = next_seq()
        entry = [seq, name, arguments[payload].shape, dtype, root, STARTED, _monotonic_ns(), 0, None]
        ring[seq % capacity] = entry
        try:
            posted = post(*arguments)
            if posted is None:
                work = method(*arguments, *fixed, async_op=async_op)
            else:
                work = CclWork(posted[0], op, limit, expire, posted[1], arguments)
            if async_op:
                entry[WORK] = _weak(work)
                return work
            work.wait()
        except Exception as error:  # noqa: BLE001 - fail() re-raises it, translated
            fail(error)
        entry[STATE] = COMPLETED
        entry[COMPLETED_NS] = _monotonic_ns()
        return None

    return run


def _verify(context: LaunchContext) -> Callable[..., None] | None:
    """The mismatch check's ``verify(op, dtype, count, root, reduce_op)``, None when it is off."""
    signer = context.signer
    return None if signer is None else signer.verify


# --- what each op posts --------------------------------------------------------------------


def _all_reduce(context: LaunchContext, fixed: tuple[Any, ...], dtype: torch.dtype) -> Post | None:
    (reduce_op,) = fixed
    reduction = context.types.reductions.get(reduce_op)
    if reduction is None:  # AVG: the facade runs it as SUM before it plans
        return None
    datatype, verify, live = context.types.datatypes[dtype], _verify(context), context.live

    def post(tensor: torch.Tensor) -> tuple[Any, tuple[torch.Tensor, ...]]:
        count, pointer = tensor.numel(), tensor.data_ptr()
        if verify is not None:
            verify("all_reduce", dtype, count, -1, reduce_op)
        return live().communicator.allreduce(pointer, pointer, count, datatype, reduction), (tensor,)

    return post


def _broadcast(context: LaunchContext, fixed: tuple[Any, ...], dtype: torch.dtype) -> Post | None:
    (root,) = fixed
    datatype, verify, live = context.types.datatypes[dtype], _verify(context), context.live

    def post(tensor: torch.Tensor) -> tuple[Any, tuple[torch.Tensor, ...]]:
        count = tensor.numel()
        if verify is not None:
            verify("broadcast", dtype, count, root)
        return live().communicator.broadcast(tensor.data_ptr(), count, datatype, root), (tensor,)

    return post


def _all_gather_into_tensor(
    context: LaunchContext, fixed: tuple[Any, ...], dtype: torch.dtype
) -> Post | None:
    datatype, verify, live = context.types.datatypes[dtype], _verify(context), context.live

    def post(output: torch.Tensor, tensor: torch.Tensor) -> tuple[Any, tuple[torch.Tensor, ...]]:
        count = tensor.numel()
        if verify is not None:
            verify("all_gather_into_tensor", dtype, count)
        event = live().communicator.allgather(tensor.data_ptr(), output.data_ptr(), count, datatype)
        return event, (output,)

    return post


def _reduce_scatter_tensor(context: LaunchContext, fixed: tuple[Any, ...], dtype: torch.dtype) -> Post | None:
    (reduce_op,) = fixed
    reduction = context.types.reductions.get(reduce_op)
    if reduction is None:
        return None
    datatype, verify, live = context.types.datatypes[dtype], _verify(context), context.live

    def post(output: torch.Tensor, tensor: torch.Tensor) -> tuple[Any, tuple[torch.Tensor, ...]]:
        count = output.numel()
        if verify is not None:
            verify("reduce_scatter_tensor", dtype, count, -1, reduce_op)
        source, target = tensor.data_ptr(), output.data_ptr()
        return live().communicator.reduce_scatter(source, target, count, datatype, reduction), (output,)

    return post


def _all_to_all_single(context: LaunchContext, fixed: tuple[Any, ...], dtype: torch.dtype) -> Post | None:
    datatype, signer, live = context.types.datatypes[dtype], context.signer, context.live
    size = context.size

    def post(
        output: torch.Tensor, tensor: torch.Tensor, *splits: Any
    ) -> tuple[Any, tuple[torch.Tensor, ...]] | None:
        if any(splits):  # uneven splits, given with each call: the op method's counts
            return None
        if signer is not None:
            signer.verify_all_to_all_single("all_to_all_single", output, tensor, None, None)
        count = tensor.numel() // size
        return live().communicator.alltoall(tensor.data_ptr(), output.data_ptr(), count, datatype), (output,)

    return post


_POSTERS: dict[str, Callable[[LaunchContext, tuple[Any, ...], torch.dtype], Post | None]] = {
    "all_reduce": _all_reduce,
    "broadcast": _broadcast,
    "all_gather_into_tensor": _all_gather_into_tensor,
    "reduce_scatter_tensor": _reduce_scatter_tensor,
    "all_to_all_single": _all_to_all_single,
}
