"""Fast paths: what :meth:`Backend.plan` and :meth:`Backend.recorded_plan` return.

A fast path is ``run(async_op, *tensors)`` for one validated kind of call (an op with its scalar
arguments and dtypes fixed): it starts the op, returns its Work when ``async_op`` is true and
otherwise waits and returns None. The facade builds one per kind of call and then calls it for
every call of that kind (``commlayer.facade.calls.plans``). A recorded fast path also enters each
call in the group's flight recorder itself, with the steps ``flight_recorder.Recording`` lists.

Fast paths written in C (a backend's extension, the comms logger's timer) each have a Python
twin that is the reference they must behave exactly like; ``$COMMLAYER_C_FAST_PATHS=0`` selects
the Python ones. A backend hands its fast-path factory a :class:`FastPathContext` (extended with
its library's state), read once per plan, so the factory never sees the backend itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from commlayer.core import settings
from commlayer.core.work import WaitLimit, Work

__all__ = ["C_FAST_PATHS_ENV", "FastPath", "FastPathContext", "c_fast_paths_enabled"]

#: ``0`` keeps every fast path in Python: the reference that a C fast path (a ``recorded_plan``
#: built in C, the facade's lookups, the comms logger's timer) must behave exactly like.
C_FAST_PATHS_ENV = settings.C_FAST_PATHS.name

#: ``run(async_op, *tensors)``: the async op's Work, or None once a blocking op is done.
FastPath = Callable[..., Work | None]


def c_fast_paths_enabled() -> bool:
    """Whether new plans may use C fast paths (built ones): ``$COMMLAYER_C_FAST_PATHS`` is not ``0``."""
    return bool(settings.C_FAST_PATHS.value())


@dataclass(frozen=True)
class FastPathContext:
    """What every backend's fast paths need of one communicator; backends add their library's state.

    Args:
        size: the group's size.
        limit: the group's wait limit (its timeout and how a timeout ends the job).
        op_method: the backend's method of each op (``op_method(op)``), for the calls the fast
            paths hand back to it (CUDA tensors, uneven splits).
    """

    size: int
    limit: WaitLimit
    op_method: Callable[[str], Callable[..., Work]]
