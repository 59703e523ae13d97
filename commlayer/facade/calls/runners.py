"""Plan launchers: the ``run(async_op, *tensors)`` callables a :class:`.plans.Plan` holds.

A backend's own recorded launcher (``recorded_plan``) or fused launcher (``plan``) where it has
one, else the facade's around the ordinary backend op, each entering every call in the group's
flight recorder; an AVG the backend runs as SUM divides its output once the op completes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from commlayer.contract.backend import Backend
from commlayer.core.flight_recorder import Recording
from commlayer.core.work import Work
from commlayer.facade.calls.op_call import SUM, OpCall, emulates_avg
from commlayer.facade.calls.recording import recorded, recording
from commlayer.facade.calls.staging import divide_results

__all__ = ["fused_launcher", "launcher", "recorded_launcher"]

# Plan ops that reduce, so AVG may need the facade's division of their first tensor (the output).
_REDUCING_PLANS = frozenset({"all_reduce", "reduce_scatter_tensor"})


def recorded_launcher(
    call: OpCall, op: str, fixed: tuple[Any, ...], payload: int, flat: bool, dtype: torch.dtype | None
) -> Callable[..., Work | None]:
    """A launcher that enters each call in the group's flight recorder: the backend's own
    (``recorded_plan``), else the facade's (:func:`fused_launcher`), each recording inline;
    the recording wrapper only around a backend ``plan`` and in debug mode."""
    backend = call.backend
    if op in _REDUCING_PLANS and emulates_avg(call, fixed[0]):
        run = launcher(backend, op, (SUM, *fixed[1:]), flat, divisor=call.group.size())
        return recorded(call, op, fixed, payload, run)
    record = recording(call, op, fixed, dtype) if dtype is not None else None
    if record is not None:
        run = backend.recorded_plan(op, fixed, record)
        if run is not None:
            return run
    own = backend.plan(op, *fixed)
    if own is not None or record is None:
        return recorded(call, op, fixed, payload, own or launcher(backend, op, fixed, flat))
    return fused_launcher(backend, op, fixed, payload, flat, record)


def launcher(
    backend: Backend, op: str, fixed: tuple[Any, ...], flat: bool, divisor: int = 0
) -> Callable[..., Work | None]:
    """``run(async_op, *tensors)`` around a backend op that has no fused launcher.

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


def fused_launcher(
    backend: Backend, op: str, fixed: tuple[Any, ...], payload: int, flat: bool, record: Recording
) -> Callable[..., Work | None]:
    """``run(async_op, *tensors)`` around a backend op, entering each call in the flight recorder
    inline (``Recording``'s launchers): what mpi, oneCCL and plugin backends' plans run."""
    method = getattr(backend, op)
    if not flat:
        return record.op_launcher(payload, method, fixed)

    def start(async_op: bool, *tensors: torch.Tensor) -> Work:
        return method(*(_flat(tensor) for tensor in tensors), *fixed, async_op=async_op)

    return record.launcher(payload, start)


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    # A view costs about a microsecond: skip it when already 1-D.
    return tensor if tensor.dim() == 1 else tensor.view(-1)
