"""The lookups of the planned collectives: find a call's plan and run it, or answer NO_PLAN.

Each hot op asks its lookup first: the C one of ``commlayer.backends._torch_fast_paths``
(``PlannedCollective``, ``PlannedPaired``) where it is built, else the Python one
(:func:`python_planned`); NO_PLAN sends the op down its checked path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from commlayer.facade.calls.plans import NO_PLAN, native, plans, run_planned

__all__ = [
    "planned_all_gather",
    "planned_all_reduce",
    "planned_all_to_all",
    "planned_broadcast",
    "planned_reduce_scatter",
    "python_planned",
]


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
    of ``commlayer.backends._torch_fast_paths`` where built (~0.3 us less per call), else Python's."""
    if native is None or not hasattr(native, "PlannedCollective"):  # an extension built before it
        return python_planned(kind, int_scalar)
    return native.PlannedCollective(plans, kind, int_scalar, NO_PLAN)


planned_all_reduce = planned_lookup("all_reduce", False)
planned_broadcast = planned_lookup("broadcast", True)


def paired_lookup(kind: str, relation: int) -> Callable[..., Any]:
    """``planned(output, input, group, async_op, scalar, extra)``: a two-tensor collective run
    through its plan by the C lookup (``PlannedPaired``), else NO_PLAN, and always NO_PLAN where it
    is not built; the op's Python lookup below it serves what it does not answer."""
    if native is None or not hasattr(native, "PlannedPaired"):  # an extension built before it
        return lambda *arguments: NO_PLAN
    return native.PlannedPaired(plans, kind, relation, NO_PLAN)


planned_all_gather = paired_lookup("all_gather_into_tensor", 0)  # output = size x input
planned_reduce_scatter = paired_lookup("reduce_scatter_tensor", 1)  # input = size x output
planned_all_to_all = paired_lookup("all_to_all_single", 2)  # even splits of dim 0
