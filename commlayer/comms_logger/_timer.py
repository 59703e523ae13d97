"""The comms logger's per-plan timer: a blocking op on CPU tensors timed by two clock reads and
entered as one pending entry, folded into the logger's records ``DRAIN_AT`` entries at a time.

The timer is C where the extension is built (``csrc/torch_launcher/timed.c``: no Python frame,
0.20 us per call on the project VM against 0.28 us for this module's Python one, which stays the
reference and the fallback; ``$COMMLAYER_C_LAUNCHER=0`` keeps it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from ..backend import c_launchers_enabled
from ..work import Work

try:
    from ..backends._torch_launcher import Timed as _CTimer
except ImportError:  # a checkout laid out without building: the Python timer
    _CTimer = None

__all__ = ["DRAIN_AT", "timed_plan"]

DRAIN_AT = 4096  # pending entries folded in at once: bounds memory, amortises the records' lock

Run = Callable[..., Work | None]


def timed_plan(
    run: Run,
    observed_run: Run,
    owner: Any,
    label: tuple[Any, ...],
    pending: list[Any],
    drain: Callable[[int], None],
    max_events: int,
    payload: int,
) -> Run:
    """``run`` timed: a blocking call runs between two clock reads and appends ``(label,
    tensors[payload].nbytes, began, ended)`` to ``pending``, calling ``drain(max_events)`` once
    ``DRAIN_AT`` are pending; an async call, or any call while ``owner._muted_thread`` is set,
    goes to ``observed_run`` instead."""
    if _CTimer is not None and c_launchers_enabled():
        return _CTimer(run, observed_run, owner, label, pending, drain, max_events, DRAIN_AT, payload)
    clock, drain_at = time.perf_counter, DRAIN_AT

    def timed(async_op: bool, *tensors: torch.Tensor) -> Work | None:
        if async_op or owner._muted_thread is not None:
            return observed_run(async_op, *tensors)
        began = clock()
        run(False, *tensors)
        pending.append((label, tensors[payload].nbytes, began, clock()))
        if len(pending) >= drain_at:
            drain(max_events)
        return None

    return timed
