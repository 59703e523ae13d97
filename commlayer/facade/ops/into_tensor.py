"""The hot output/input collectives (all_gather_into_tensor, reduce_scatter_tensor,
all_to_all_single): validated once per kind of call, then run through a plan.

Each op first asks its C lookup (:mod:`commlayer.facade.calls.plans`), then looks its plan up under a key
spelt out inline (what its validation depended on, see :mod:`commlayer.facade.calls.plans`) and runs it after the
few per-call checks the key cannot hold (element counts, split sizes, contiguity); a miss goes
to the op's ``_checked_`` twin, which validates in full and builds the plan.
"""

from __future__ import annotations

from collections.abc import Sequence
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
from commlayer.facade.calls.plans import (
    NO_PLAN,
    planned_all_gather,
    planned_all_to_all,
    planned_reduce_scatter,
    plans,
    run_staged,
)
from commlayer.facade.calls.staging import CopyBack, contiguous
from commlayer.facade.calls.timeouts import rerun_with_timeout
from commlayer.facade.ops.uneven import all_gather_into_tensor_v

__all__ = ["all_gather_into_tensor", "all_to_all_single", "reduce_scatter_tensor"]


@shared_docs
def all_gather_into_tensor(
    output_tensor: torch.Tensor,
    input_tensor: torch.Tensor,
    group: Any = None,
    async_op: bool = False,
    sizes: Sequence[int] | None = None,
    *,
    timeout: timedelta | float | None = None,
) -> Work | None:
    """Gather every rank's ``input_tensor`` into one ``output_tensor``, rank-major.

    Args:
        output_tensor (Tensor): ``world_size`` times the elements of the input: concatenated (``(n *
            k,)``) or stacked (``(n, k)``).
        input_tensor (Tensor): this rank's contribution.
        {{group}}
        {{async_op}}
        {{timeout}}
        sizes (list[int], optional): a commlayer extension: every rank's element count, when
            they differ (the same list on every rank); the output is their flat concatenation.
            See :func:`~commlayer.facade.ops.uneven.all_gather_into_tensor_v`.

    Returns:
        {{work}}

    Raises:
        {{argument errors}}
        {{timeout errors}}
        {{peer failure}}

    Example::

        >>> output = torch.zeros(2 * dist.get_world_size())
        >>> dist.all_gather_into_tensor(output, torch.full((2,), float(dist.get_rank())))
        >>> output  # 2 ranks
        tensor([0., 0., 1., 1.])
    """
    try:
        if timeout is not None:
            return rerun_with_timeout(all_gather_into_tensor, locals())
        if sizes is not None:
            return all_gather_into_tensor_v(output_tensor, input_tensor, sizes, group, async_op)
        work = planned_all_gather(output_tensor, input_tensor, group, async_op, None, None)
        if work is NO_PLAN:
            work = _looked_up_all_gather_into_tensor(output_tensor, input_tensor, group, async_op)
        return work
    except CommError as error:
        hide_internal_frames(error)
        raise


def _looked_up_all_gather_into_tensor(
    output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any, async_op: bool
) -> Work | None:
    """The Python lookup of the call's plan, for what the C one does not answer."""
    try:
        plan = plans.get(
            (
                "all_gather_into_tensor",
                group,
                output_tensor.dtype,
                output_tensor.device,
                output_tensor.layout,
                input_tensor.dtype,
                input_tensor.device,
                input_tensor.layout,
            )
        )
    except (AttributeError, TypeError):
        plan = None
    if (
        plan is not None
        and output_tensor.numel() == plan.size * input_tensor.numel()
        and output_tensor.is_contiguous()
        and input_tensor.is_contiguous()
    ):
        return plan.run(async_op, output_tensor, input_tensor)
    return _checked_all_gather_into_tensor(output_tensor, input_tensor, group, async_op)


@complex_as_real("all_gather_into_tensor")
def _checked_all_gather_into_tensor(
    output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any, async_op: bool
) -> Work | None:
    call = begin("all_gather_into_tensor", group, check.first_device(input_tensor))
    if call is None:
        return None
    check.check_tensor(call, "input_tensor", input_tensor)
    check.check_output_like(call, "output_tensor", output_tensor, input_tensor)
    size = call.group.size()
    expected = size * input_tensor.numel()
    check.check_numel(call, "output_tensor", output_tensor, expected, "world size {} x input", size)
    key = _paired_key("all_gather_into_tensor", group, output_tensor, input_tensor)
    # Backends see flat buffers: stacked (n, *shape) and concatenated outputs are the same bytes.
    plan = remember(key, True, call, "all_gather_into_tensor", flat=True, dtype=input_tensor.dtype)
    copy_back: CopyBack = []
    output = contiguous(output_tensor, copy_back)
    return run_staged(plan, async_op, copy_back, output, input_tensor.contiguous())


@shared_docs
def reduce_scatter_tensor(
    output: torch.Tensor,
    input: torch.Tensor,
    op: Any = ReduceOp.SUM,
    group: Any = None,
    async_op: bool = False,
    *,
    timeout: timedelta | float | None = None,
) -> Work | None:
    """Reduce ``input`` across ``group`` and leave chunk ``i`` (of ``output``'s size) on group rank ``i``.

    Args:
        output (Tensor): receives this rank's reduced chunk.
        input (Tensor): ``world_size`` times the elements of ``output``, rank-major.
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
        >>> dist.reduce_scatter_tensor(output, torch.tensor([1.0, 2.0]))  # 2 ranks
        >>> output  # rank 1
        tensor([4.])
    """
    try:
        if timeout is not None:
            return rerun_with_timeout(reduce_scatter_tensor, locals())
        work = planned_reduce_scatter(output, input, group, async_op, op, None)
        if work is NO_PLAN:
            work = _looked_up_reduce_scatter_tensor(output, input, op, group, async_op)
        return work
    except CommError as error:
        hide_internal_frames(error)
        raise


def _looked_up_reduce_scatter_tensor(
    output: torch.Tensor, input: torch.Tensor, op: Any, group: Any, async_op: bool
) -> Work | None:
    """The Python lookup of the call's plan, for what the C one does not answer."""
    try:
        plan = plans.get(
            (
                "reduce_scatter_tensor",
                group,
                op,
                output.dtype,
                output.device,
                output.layout,
                input.dtype,
                input.device,
                input.layout,
            )
        )
    except (AttributeError, TypeError):
        plan = None
    if (
        plan is not None
        and input.numel() == plan.size * output.numel()
        and output.is_contiguous()
        and input.is_contiguous()
    ):
        return plan.run(async_op, output, input)
    return _checked_reduce_scatter_tensor(output, input, op, group, async_op)


def _checked_reduce_scatter_tensor(
    output: torch.Tensor, input: torch.Tensor, op: Any, group: Any, async_op: bool
) -> Work | None:
    call = begin("reduce_scatter_tensor", group, check.first_device(input))
    if call is None:
        return None
    check.check_tensor(call, "input", input)
    check.check_output_like(call, "output", output, input)
    size = call.group.size()
    check.check_numel(call, "input", input, size * output.numel(), "world size {} x output", size)
    reduce_op = check.check_reduce_op(call, op, input.dtype)
    key = _paired_key("reduce_scatter_tensor", group, output, input, op)
    # Only commlayer's ReduceOp: torch's values equal small ints, which must still be refused.
    cacheable = isinstance(op, ReduceOp)
    plan = remember(
        key, cacheable, call, "reduce_scatter_tensor", reduce_op, payload=1, flat=True, dtype=input.dtype
    )
    copy_back: CopyBack = []
    buffer = contiguous(output, copy_back)
    return run_staged(plan, async_op, copy_back, buffer, input.contiguous())


@shared_docs
def all_to_all_single(
    output: torch.Tensor,
    input: torch.Tensor,
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
    group: Any = None,
    async_op: bool = False,
    *,
    timeout: timedelta | float | None = None,
) -> Work | None:
    """Each rank sends slice ``j`` of ``input`` to rank ``j`` and receives slice ``i`` of everyone's into ``output``.

    Args:
        output (Tensor): receives the slices, in rank order, along dim 0.
        input (Tensor): the slices to send, along dim 0.
        output_split_sizes (list[int], optional): rows received from each rank; None splits evenly.
        input_split_sizes (list[int], optional): rows sent to each rank; None splits evenly.
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

        >>> output = torch.zeros(2)
        >>> dist.all_to_all_single(output, torch.tensor([10.0, 11.0]) + 10 * dist.get_rank())  # 2 ranks
        >>> output  # rank 0
        tensor([10., 20.])
    """
    try:
        if timeout is not None:
            return rerun_with_timeout(all_to_all_single, locals())
        work = planned_all_to_all(output, input, group, async_op, output_split_sizes, input_split_sizes)
        if work is NO_PLAN:
            work = _looked_up_all_to_all_single(
                output, input, output_split_sizes, input_split_sizes, group, async_op
            )
        return work
    except CommError as error:
        hide_internal_frames(error)
        raise


def _looked_up_all_to_all_single(
    output: torch.Tensor,
    input: torch.Tensor,
    output_split_sizes: Sequence[int] | None,
    input_split_sizes: Sequence[int] | None,
    group: Any,
    async_op: bool,
) -> Work | None:
    """The Python lookup of the call's plan, for what the C one does not answer."""
    try:
        plan = plans.get(
            (
                "all_to_all_single",
                group,
                output.dtype,
                output.device,
                output.layout,
                input.dtype,
                input.device,
                input.layout,
            )
        )
    except (AttributeError, TypeError):
        plan = None
    if plan is not None and output.is_contiguous() and input.is_contiguous():
        size = plan.size
        # Even splits, inline (check_splits' first branch, two calls less); 0-d tensors go on below.
        if (
            output_split_sizes is None
            and input_split_sizes is None
            and output.dim()
            and input.dim()
            and not (output.shape[0] % size or input.shape[0] % size)
        ):
            return plan.run(async_op, output, input, None, None)
        out_splits = check.check_splits(plan.call, "output_split_sizes", output_split_sizes, output, size)
        in_splits = check.check_splits(plan.call, "input_split_sizes", input_split_sizes, input, size)
        return plan.run(async_op, output, input, out_splits, in_splits)
    return _checked_all_to_all_single(output, input, output_split_sizes, input_split_sizes, group, async_op)


@complex_as_real("all_to_all_single")
def _checked_all_to_all_single(
    output: torch.Tensor,
    input: torch.Tensor,
    output_split_sizes: Sequence[int] | None,
    input_split_sizes: Sequence[int] | None,
    group: Any,
    async_op: bool,
) -> Work | None:
    call = begin("all_to_all_single", group, check.first_device(input))
    if call is None:
        return None
    check.check_tensor(call, "input", input)
    check.check_tensor(call, "output", output)
    check.check_dtype_match(call, "output", output, input)
    size = call.group.size()
    out_splits = check.check_splits(call, "output_split_sizes", output_split_sizes, output, size)
    in_splits = check.check_splits(call, "input_split_sizes", input_split_sizes, input, size)
    key = _paired_key("all_to_all_single", group, output, input)
    plan = remember(key, True, call, "all_to_all_single", payload=1, dtype=input.dtype)
    copy_back: CopyBack = []
    buffer = contiguous(output, copy_back)
    return run_staged(plan, async_op, copy_back, buffer, input.contiguous(), out_splits, in_splits)


def _paired_key(op: str, group: Any, output: torch.Tensor, tensor: torch.Tensor, *scalars: Any) -> tuple:
    """The plan key of a two-tensor op: what its validation depended on (each op's fast path
    spells the same tuple out, saving this frame; tests/facade/test_plans.py checks that they agree)."""
    return (
        op,
        group,
        *scalars,
        output.dtype,
        output.device,
        output.layout,
        tensor.dtype,
        tensor.device,
        tensor.layout,
    )
