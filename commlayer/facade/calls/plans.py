"""The plan cache (the hot path): :class:`Plan`, the ``plans`` dict, its lookup and its reset.

The ops that run thousands of times a second (all_reduce, broadcast, all_gather_into_tensor,
reduce_scatter_tensor, all_to_all_single, send/recv) validate their arguments fully on the first
call of a kind, then store a :class:`Plan` under a key of everything that validation depended on:
the op, the ``group`` argument, the scalar arguments (reduce op, root, peer, tag) and each
tensor's dtype, device and layout. A later call with the same key only checks what the key
cannot hold (contiguity, element counts, split sizes) and calls the plan: one dict lookup instead
of resolving, re-validating and wrapping. Plans are built by :func:`.dispatch.new_plan`. Every
plan is dropped (:func:`forget_plans`) when a group or the world is created or destroyed and when
the observer changes, so none outlives what it was checked against.

``native`` is the C extension whose lookups (PlannedP2P, PlannedCollective, PlannedPaired) read
this cache directly, or None in a tree whose extensions are not built.
"""

from __future__ import annotations

import atexit
from collections.abc import Callable
from typing import Any, NamedTuple

from commlayer.core.work import Work
from commlayer.facade.calls.op_call import OpCall

try:  # the C lookups of planned calls (PlannedP2P, PlannedCollective, PlannedPaired)
    from commlayer.backends import _torch_fast_paths as native
except ImportError:  # pragma: no cover - a tree whose extensions are not built
    native = None  # type: ignore[assignment]
else:  # every backend's lookups read tensors through the C reader, where one fits this torch
    from commlayer.core.tensor_reader import tensor_meta_reader

    native.set_tensor_meta(tensor_meta_reader())

__all__ = ["NO_PLAN", "Plan", "forget_plans", "native", "plans", "run_planned"]


class Plan(NamedTuple):
    """A validated way to run one kind of call: ``run(async_op, *tensors)`` starts it.

    ``run`` returns the Work when ``async_op`` is true; otherwise it waits, as torch does, and
    returns None. ``size`` is the group's size, for the per-call element-count checks.
    """

    run: Callable[..., Work | None]
    call: OpCall
    size: int


# Key -> Plan; see the module docstring for what keys hold and when plans are dropped.
plans: dict[tuple[Any, ...], Plan] = {}


NO_PLAN: Any = object()  # what a planned lookup returns when the call has no plan to run


def run_planned(head: tuple[Any, ...], tensor: Any, async_op: bool) -> Any:
    """Run the plan keyed ``(*head, tensor.dtype, tensor.device, tensor.layout)`` on ``tensor``, or
    return NO_PLAN (not a tensor, an unhashable argument, no plan yet, a strided tensor: the
    checked path then validates, plans, stages or refuses the call). The Python twin of the C
    lookups' ``run_planned`` (csrc/torch_fast_paths/in_place.c), for trees where it is not built."""
    try:
        plan = plans.get((*head, tensor.dtype, tensor.device, tensor.layout))
    except (AttributeError, TypeError):
        return NO_PLAN
    if plan is None or not tensor.is_contiguous():
        return NO_PLAN
    return plan.run(async_op, tensor)


def forget_plans() -> None:
    """Drop every plan (groups changed, or the observer did)."""
    plans.clear()


atexit.register(forget_plans)  # plans refer to backends: release them before interpreter teardown
