"""torch's coalesced collectives: many tensors, one message.

The tensors are packed into one flat buffer, the buffer takes a single collective, and the results
are unpacked into the caller's tensors when the work completes. World of 2, rank r::

    a, b = torch.full((2,), r), torch.full((3,), 10 * r)
    all_reduce_coalesced([a, b])          # a == [1, 1], b == [10, 10, 10]
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Any

import torch

from commlayer.core import profiling
from commlayer.core.boundary import user_facing
from commlayer.core.errors import InvalidTypeError, invalid_argument
from commlayer.core.types import ReduceOp
from commlayer.core.work import Work
from commlayer.facade.calls.complex_tensors import as_real, is_complex, real_for_reduction
from commlayer.facade.calls.op_call import device_type
from commlayer.facade.calls.timeouts import rerun_with_timeout
from commlayer.facade.groups.group import ProcessGroup, current_world, resolve_group
from commlayer.facade.ops import in_place as planned
from commlayer.facade.ops import into_tensor as paired

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
    packed = torch.cat([tensor.reshape(-1) for tensor in tensors])
    if profiling.active:
        with _profiled("all_reduce_coalesced", group, tensors):
            work = planned.all_reduce(packed, op=op, group=group, async_op=True)
    else:
        work = planned.all_reduce(packed, op=op, group=group, async_op=True)
    return _finish(work, lambda: _unpack(packed, tensors), async_op)


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
    resolved = resolve_group("all_gather_coalesced", group)
    if resolved is None:
        return None
    if not isinstance(output_tensor_lists, list) or len(output_tensor_lists) != resolved.size():
        raise invalid_argument(
            "all_gather_coalesced",
            "output_tensor_lists",
            f"a list of {resolved.size()} lists (the group size)",
            type(output_tensor_lists).__name__,
            resolved.global_rank,
        )
    packed = torch.cat([tensor.reshape(-1) for tensor in inputs])
    gathered = packed.new_empty(resolved.size() * packed.numel())
    if profiling.active:
        with _profiled("all_gather_coalesced", resolved, inputs):
            work = paired.all_gather_into_tensor(gathered, packed, group=group, async_op=True)
    else:
        work = paired.all_gather_into_tensor(gathered, packed, group=group, async_op=True)
    rows = gathered.view(resolved.size(), -1)
    unpack = lambda: [_unpack(row, outputs) for row, outputs in zip(rows, output_tensor_lists)]
    return _finish(work, unpack, async_op)


def _profiled(op: str, group: Any, tensors: list[torch.Tensor]) -> Any:
    """The call's profiler events, as torch shows a coalesced call (not its packed collective)."""
    resolved = resolve_group(op, group) if not isinstance(group, ProcessGroup) else group
    if resolved is None:
        return contextlib.nullcontext()
    backend = resolved.backend_for(device_type(tensors[0].device)) or resolved.primary_backend
    library = backend.name if backend.records_profiler_events else None
    return profiling.coalesced(op, resolved.group_name, tensors, library)


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


def _unpack(packed: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    offset = 0
    for tensor in tensors:
        tensor.copy_(packed[offset : offset + tensor.numel()].view_as(tensor))
        offset += tensor.numel()


def _finish(work: Work | None, unpack: Any, async_op: bool) -> Work | None:
    if work is None:
        return None
    chained = work.then(unpack)
    if async_op:
        return chained
    chained.wait()
    return None
