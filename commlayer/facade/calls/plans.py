"""Plans (the hot path): the plan cache, the lookups that answer from it, and the runs plans hold.

The ops that run thousands of times a second (all_reduce, broadcast, all_gather_into_tensor,
reduce_scatter_tensor, all_to_all_single, send/recv) validate their arguments fully on the first
call of a kind, then store a :class:`Plan` under a key of everything that validation depended on:
the op, the ``group`` argument, the scalar arguments (reduce op, root, peer, tag) and each
tensor's dtype, device and layout. A later call with the same key only checks what the key
cannot hold (contiguity, element counts, split sizes) and calls the plan: one dict lookup instead
of resolving, re-validating and wrapping. Plans are built by :func:`.dispatch.new_plan` around
:func:`recorded_run`. Every plan is dropped (:func:`forget_plans`) when a group or the world is
created or destroyed and when the observer changes, so none outlives what it was checked against.

Each hot op asks its lookup first: the C one of the facade's fast paths
(``commlayer.facade.calls._fast_paths``: ``PlannedCollective``, ``PlannedPaired``, and
``PlannedP2P`` behind dist's point-to-point entries) where it is built, else the Python one
(:func:`python_planned`); NO_PLAN sends the op down its checked path. ``native`` is that
extension, or None in a tree whose extensions are not built.

A plan's ``run(async_op, *tensors)`` is a backend's own fast path (``recorded_plan``, or a
plain ``plan``) where it has one, else the facade's around the ordinary backend op, each
entering every call in the group's flight recorder; an AVG the backend runs as SUM divides its
output once the op completes.
"""

from __future__ import annotations

import atexit
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from commlayer.contract.backend import Backend
from commlayer.contract.fast_paths import FastPath
from commlayer.core.flight_recorder import Recording
from commlayer.core.work import Work
from commlayer.facade.calls.op_call import SUM, OpCall, emulates_avg
from commlayer.facade.calls.recording import recorded, recording
from commlayer.facade.calls.staging import copy_back_results, divide_results

try:  # the facade's fast paths: the C lookups of planned calls, dist's p2p entries
    from commlayer.facade.calls import _fast_paths as native
except ImportError:  # pragma: no cover - a tree whose extensions are not built
    native = None  # type: ignore[assignment]
else:  # the lookups read tensors through the C reader, where one fits this torch
    from commlayer.core.tensor_reader import tensor_meta_reader

    native.set_tensor_meta(tensor_meta_reader())

__all__ = [
    "NO_PLAN",
    "Plan",
    "forget_plans",
    "native",
    "planned_all_gather",
    "planned_all_reduce",
    "planned_all_to_all",
    "planned_broadcast",
    "planned_reduce_scatter",
    "plans",
    "python_planned",
    "recorded_run",
    "run_planned",
    "run_staged",
]


class Plan(NamedTuple):
    """A validated way to run one kind of call: ``run(async_op, *tensors)`` starts it.

    ``run`` returns the Work when ``async_op`` is true; otherwise it waits, as torch does, and
    returns None. ``size`` is the group's size, for the per-call element-count checks.
    """

    run: FastPath
    call: OpCall
    size: int


# Key -> Plan; see the module docstring for what keys hold and when plans are dropped.
plans: dict[tuple[Any, ...], Plan] = {}


NO_PLAN: Any = object()  # what a planned lookup returns when the call has no plan to run


def run_planned(head: tuple[Any, ...], tensor: Any, async_op: bool) -> Any:
    """Run the plan keyed ``(*head, tensor.dtype, tensor.device, tensor.layout)`` on ``tensor``, or
    return NO_PLAN (not a tensor, an unhashable argument, no plan yet, a strided tensor: the
    checked path then validates, plans, stages or refuses the call). The Python twin of the C
    lookups' ``run_planned`` (csrc/facade_fast_paths/one_tensor.c), for trees where it is not built."""
    try:
        plan = plans.get((*head, tensor.dtype, tensor.device, tensor.layout))
    except (AttributeError, TypeError):
        return NO_PLAN
    if plan is None or not tensor.is_contiguous():
        return NO_PLAN
    return plan.run(async_op, tensor)


def run_staged(
    plan: Plan, async_op: bool, copy_back: Sequence[tuple[torch.Tensor, torch.Tensor]], *tensors: torch.Tensor
) -> Work | None:
    """Run ``plan`` on contiguous stand-ins, copying staged outputs back into the caller's tensors."""
    work = plan.run(async_op, *tensors)
    if not copy_back:
        return work
    if work is None:  # a synchronous op has already completed
        copy_back_results(copy_back)
        return None
    return work.then(lambda: copy_back_results(copy_back))


def forget_plans() -> None:
    """Drop every plan (groups changed, or the observer did)."""
    plans.clear()


atexit.register(forget_plans)  # plans refer to backends: release them before interpreter teardown


# --- the lookups --------------------------------------------------------------------------------


def python_planned(kind: str, int_scalar: bool) -> Callable[..., Any]:
    """The planned call of ``kind`` in Python, where the C one is not built (see planned_lookup)."""

    def planned(tensor: Any, scalar: Any, group: Any, async_op: Any, extra: Any) -> Any:
        # An int src only: True and 1.0 equal 1 as keys, and they must still be refused.
        if (int_scalar and scalar.__class__ is not int) or extra is not None:
            return NO_PLAN
        return run_planned((kind, group, scalar), tensor, async_op)

    return planned


def planned_lookup(kind: str, int_scalar: bool) -> Callable[..., Any]:
    """``planned(tensor, scalar, group, async_op, extra)``: a one-tensor collective run through its
    plan (key ``(kind, group, scalar, dtype, device, layout)``), else NO_PLAN (no plan yet, a
    non-None ``extra``, a strided tensor, or an argument the key cannot vouch for): the C lookup
    where built (~0.3 us less per call), else Python's."""
    if native is None:
        return python_planned(kind, int_scalar)
    return native.PlannedCollective(plans, kind, int_scalar, NO_PLAN)


def paired_lookup(kind: str, relation: int) -> Callable[..., Any]:
    """``planned(output, input, group, async_op, scalar, extra)``: a two-tensor collective run
    through its plan by the C lookup (``PlannedPaired``), else NO_PLAN, and always NO_PLAN where it
    is not built; the op's Python lookup below it serves what it does not answer."""
    if native is None:
        return lambda *arguments: NO_PLAN
    return native.PlannedPaired(plans, kind, relation, NO_PLAN)


planned_all_reduce = planned_lookup("all_reduce", False)
planned_broadcast = planned_lookup("broadcast", True)
planned_all_gather = paired_lookup("all_gather_into_tensor", 0)  # output = size x input
planned_reduce_scatter = paired_lookup("reduce_scatter_tensor", 1)  # input = size x output
planned_all_to_all = paired_lookup("all_to_all_single", 2)  # even splits of dim 0


# --- the runs plans hold ------------------------------------------------------------------------

# Plan ops that reduce, so AVG may need the facade's division of their first tensor (the output).
_REDUCING_PLANS = frozenset({"all_reduce", "reduce_scatter_tensor"})


def recorded_run(
    call: OpCall, op: str, fixed: tuple[Any, ...], payload: int, flat: bool, dtype: torch.dtype | None
) -> FastPath:
    """A plan's run, entering each call in the group's flight recorder: the backend's own fast
    path (``recorded_plan``), else the facade's (:func:`fused_run`), each recording inline; the
    recording wrapper only around a backend ``plan`` and in debug mode."""
    backend = call.backend
    if op in _REDUCING_PLANS and emulates_avg(call, fixed[0]):
        run = op_run(backend, op, (SUM, *fixed[1:]), flat, divisor=call.group.size())
        return recorded(call, op, fixed, payload, run)
    record = recording(call, op, fixed, dtype) if dtype is not None else None
    if record is not None:
        run = backend.recorded_plan(op, fixed, record)
        if run is not None:
            return run
    own = backend.plan(op, *fixed)
    if own is not None or record is None:
        return recorded(call, op, fixed, payload, own or op_run(backend, op, fixed, flat))
    return fused_run(backend, op, fixed, payload, flat, record)


def op_run(backend: Backend, op: str, fixed: tuple[Any, ...], flat: bool, divisor: int = 0) -> FastPath:
    """``run(async_op, *tensors)`` around a backend op that has no fast path of its own.

    ``divisor`` > 0 divides the first tensor (the output) by it once the op completes: an AVG
    the backend runs as SUM.
    """
    method = getattr(backend, op)

    def run(async_op: bool, *tensors: torch.Tensor) -> Work | None:
        if flat:
            tensors = tuple(_flat(tensor) for tensor in tensors)
        work = method(*tensors, *fixed, async_op=async_op)
        if divisor:
            outputs = tensors[:1]
            work = work.then(lambda: divide_results(outputs, divisor))
        if async_op:
            return work
        work.wait()
        return None

    return run


def fused_run(
    backend: Backend, op: str, fixed: tuple[Any, ...], payload: int, flat: bool, record: Recording
) -> FastPath:
    """``run(async_op, *tensors)`` around a backend op, entering each call in the flight recorder
    inline (``Recording``'s fast paths): what mpi, oneCCL and plugin backends' plans run."""
    method = getattr(backend, op)
    if not flat:
        return record.method_fast_path(payload, method, fixed)

    def start(async_op: bool, *tensors: torch.Tensor) -> Work:
        return method(*(_flat(tensor) for tensor in tensors), *fixed, async_op=async_op)

    return record.fast_path(payload, start)


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    # A view costs about a microsecond: skip it when already 1-D.
    return tensor if tensor.dim() == 1 else tensor.view(-1)
