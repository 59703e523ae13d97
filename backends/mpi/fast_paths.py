"""The mpi backend's fast paths (``Backend.recorded_plan``) for ordered mode: the hot path.

The facade builds one fast path per kind of call and then calls ``run(async_op, *tensors)`` for
every call of that kind. Everything the kind fixes -- the MPI call, its datatype and reduction,
the mismatch check's key -- is looked up once here, so a call only wraps its tensors' memory,
enters the flight recorder (the steps ``Recording`` lists) and hands the same blocking call, the
mismatch check first, to the ordered executor, exactly as the op methods do (:mod:`.ordered`).
Against the facade's generic fast path around the op method this saves the per-call lookups, the
``functools.partial`` of the check, a ``CompletedWork`` and its wait: about 1 us of Python per op.

CUDA tensors (staged or CUDA-aware) and uneven all-to-all splits take the op method itself.
Where the C fast path can be built (:mod:`.native_fast_paths`), it serves the plain synchronous calls and
hands every other call to the Python fast path built here.
The backend hands the fast paths what they need as a :class:`~.fast_path_context.MpiFastPathContext`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from commlayer.backends.mpi.fast_path_context import MpiFastPathContext
from commlayer.backends.mpi.native_fast_paths import c_fast_path
from commlayer.backends.mpi.ordered import OrderedWork
from commlayer.contract.fast_paths import FastPath
from commlayer.core.flight_recorder import PLANNED_PAYLOAD, Recording, prefill
from commlayer.core.work import Work

__all__ = ["ordered_fast_path"]

_REMEMBERED_MESSAGES = 64  # per fast path (one kind of call): a bucketed model's buffers fit

# (the element count the ranks must agree on followed by the MPI call's arguments, the result)
Prepared = tuple[tuple[Any, ...], list[torch.Tensor]]


def ordered_fast_path(
    context: MpiFastPathContext, op: str, fixed: tuple[Any, ...], recording: Recording
) -> FastPath | None:
    """``run(async_op, *tensors)`` for ``op``, or None where the op method's fast path must do."""
    if op not in PLANNED_PAYLOAD:
        return None
    try:
        call, prepare, key = _PREPARERS[op](context, fixed, recording.dtype)
    except KeyError:  # a dtype or reduction MPI has no type for: the op method raises it per call
        return None
    # blocking(count, *arguments): the MPI call, after the mismatch check (when on) of ``count`` elements.
    check = context.check
    blocking = (lambda count, *arguments: call(*arguments)) if check is None else check.checked(op, key, call)
    start = _starter(context, op, fixed, blocking, prepare)
    if check is not None and check.shared is not None:
        start = _publishing_early(context, op, check, key, call, prepare, start)
    run = recording.fast_path(PLANNED_PAYLOAD[op], start, one_tensor=op in ("all_reduce", "broadcast"))
    native = c_fast_path(context, op, fixed, recording, key, run)
    if native is None:
        return run
    prefill(recording.ring)  # the C fast path rewrites entries in place: no list per call
    return native


def _messages(context: MpiFastPathContext, dtype: torch.dtype) -> Callable[[torch.Tensor], list[Any]]:
    """``message(tensor)``: ``[buffer, datatype]`` over the tensor's memory, remembered by address
    and size. Training loops and benchmarks pass the same few buffers again and again, and MPI's
    buffer view (which owns nothing) costs more to build than to look up; a view of the same
    address and size is the same message whichever tensor it came from."""
    wrap, datatype, remembered = context.mpi.buffer.fromaddress, context.datatypes[dtype], {}

    def message(tensor: torch.Tensor) -> list[Any]:
        where = (tensor.data_ptr(), tensor.nbytes)
        found = remembered.get(where)
        if found is None:
            if len(remembered) >= _REMEMBERED_MESSAGES:
                remembered.clear()
            found = remembered[where] = [wrap(*where), datatype]
        return found

    return message


def _starter(
    context: MpiFastPathContext,
    op: str,
    fixed: tuple[Any, ...],
    blocking: Callable[..., None],
    prepare: Callable[..., Prepared | None],
) -> FastPath:
    """``start(async_op, *tensors)`` (see Recording.fast_path): the op method's Work for CUDA
    tensors and uneven splits, an OrderedWork when async, else the blocking call in place."""
    method, executor, limit = context.op_method(op), context.executor, context.limit

    def start(async_op: bool, *tensors: torch.Tensor) -> Work | None:
        prepared = prepare(*tensors)
        if prepared is None:  # CUDA or uneven splits: the op method
            return method(*tensors, *fixed, async_op=async_op)
        if async_op:
            arguments, result = prepared
            return OrderedWork(executor.submit(blocking, arguments), op, limit, result, tensors)
        executor.run(blocking, prepared[0], op, limit)
        return None

    return start


def _publishing_early(
    context: MpiFastPathContext,
    op: str,
    check: Any,
    key: int,
    call: Callable[..., Any],
    prepare: Callable[..., Prepared | None],
    otherwise: FastPath,
) -> FastPath:
    """``start`` whose synchronous in-place calls publish their signature before the executor and
    gather the peers' right before the MPI call (see SharedSignatures.publish): the check waits
    for the slowest rank, and this way that wait overlaps each rank's own Python. Asynchronous
    calls, and calls behind queued ones, check on the worker (``otherwise``)."""
    executor, limit = context.executor, context.limit
    publish, gathered = check.shared.publish, check.gathered(op, key, call)
    queue = executor.pending  # read once: empty means the call runs in place

    def start(async_op: bool, *tensors: torch.Tensor) -> Work | None:
        prepared = None if async_op or queue else prepare(*tensors)
        if prepared is None:
            return otherwise(async_op, *tensors)
        arguments = prepared[0]
        sequence = publish(key, arguments[0])
        executor.run(gathered, (sequence, *arguments), op, limit)
        return None

    return start


# --- what each op passes to MPI --------------------------------------------------------------


def _key(
    context: MpiFastPathContext, op: str, dtype: torch.dtype, root: int = -1, reduce_op: Any = None
) -> int:
    """The mismatch check's key of ``op`` (0 when the check is off); the key reads only the dtype."""
    check = context.check
    return 0 if check is None else check.key(op, torch.empty(0, dtype=dtype), root, reduce_op)


def _all_reduce(context: MpiFastPathContext, fixed: tuple[Any, ...], dtype: torch.dtype) -> tuple[Any, ...]:
    (reduce_op,) = fixed
    message, in_place = _messages(context, dtype), context.mpi.IN_PLACE
    reduction = context.reductions[reduce_op][dtype]

    def prepare(tensor: torch.Tensor) -> Prepared | None:
        if tensor.is_cuda:
            return None
        return (tensor.numel(), in_place, message(tensor), reduction), [tensor]

    return context.comm.Allreduce, prepare, _key(context, "all_reduce", dtype, reduce_op=reduce_op)


def _broadcast(context: MpiFastPathContext, fixed: tuple[Any, ...], dtype: torch.dtype) -> tuple[Any, ...]:
    (root,) = fixed
    message = _messages(context, dtype)

    def prepare(tensor: torch.Tensor) -> Prepared | None:
        if tensor.is_cuda:
            return None
        return (tensor.numel(), message(tensor), root), [tensor]

    return context.comm.Bcast, prepare, _key(context, "broadcast", dtype, root)


def _pair(
    call: Callable[..., Any], context: MpiFastPathContext, dtype: torch.dtype, *extra: Any
) -> Callable[[torch.Tensor, torch.Tensor], Prepared | None]:
    """``prepare(output, input)`` of an op that passes (input, output, *extra) to MPI."""
    message = _messages(context, dtype)

    def prepare(output: torch.Tensor, tensor: torch.Tensor, *splits: Any) -> Prepared | None:
        if tensor.is_cuda or any(split is not None for split in splits):
            return None
        return (call(tensor, output), message(tensor), message(output), *extra), [output]

    return prepare


def _all_gather(context: MpiFastPathContext, fixed: tuple[Any, ...], dtype: torch.dtype) -> tuple[Any, ...]:
    prepare = _pair(lambda tensor, output: tensor.numel(), context, dtype)
    return context.comm.Allgather, prepare, _key(context, "all_gather_into_tensor", dtype)


def _reduce_scatter(
    context: MpiFastPathContext, fixed: tuple[Any, ...], dtype: torch.dtype
) -> tuple[Any, ...]:
    (reduce_op,) = fixed
    reduction = context.reductions[reduce_op][dtype]
    prepare = _pair(lambda tensor, output: output.numel(), context, dtype, reduction)
    key = _key(context, "reduce_scatter_tensor", dtype, reduce_op=reduce_op)
    return context.comm.Reduce_scatter_block, prepare, key


def _all_to_all(context: MpiFastPathContext, fixed: tuple[Any, ...], dtype: torch.dtype) -> tuple[Any, ...]:
    prepare = _pair(lambda tensor, output: tensor.numel(), context, dtype)
    return context.comm.Alltoall, prepare, _key(context, "all_to_all_single", dtype)


_PREPARERS: dict[str, Callable[[MpiFastPathContext, tuple[Any, ...], torch.dtype], tuple[Any, ...]]] = {
    "all_reduce": _all_reduce,
    "broadcast": _broadcast,
    "all_gather_into_tensor": _all_gather,
    "reduce_scatter_tensor": _reduce_scatter,
    "all_to_all_single": _all_to_all,
}
