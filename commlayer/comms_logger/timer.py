"""The comms logger's per-plan timer: a blocking op on CPU tensors timed by two clock reads and
entered as one pending entry, folded into the logger's records ``DRAIN_AT`` entries at a time.

The timer is C where the extension is built (``csrc/logger_fast_paths/timed.c``): no Python frame,
and its entries are records in a C ring (``TimedLog``) that the logger folds into one aggregate
per (op, size) and turns into trace events only when a trace is asked for. This module's Python
timer, which appends a tuple per call to the records' ``pending`` list, stays the reference and
the fallback (``$COMMLAYER_C_FAST_PATHS=0`` keeps it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import torch

from commlayer.contract.fast_paths import FastPath, c_fast_paths_enabled
from commlayer.core.work import Work

try:
    from commlayer.comms_logger import _fast_paths as native
except ImportError:  # a checkout laid out without building: the Python timer
    native = None
else:  # the timer reads tensors through the C reader, where one fits this torch
    from commlayer.core.tensor_reader import tensor_meta_reader

    native.set_tensor_meta(tensor_meta_reader())

__all__ = ["DRAIN_AT", "Records", "timed_plan"]

DRAIN_AT = 4096  # pending entries folded in at once: bounds memory, amortises the records' lock

Run = FastPath


class Records(Protocol):
    """What the timers write to (the logger's records)."""

    pending: list[Any]

    def drain(self, max_events: int) -> None: ...

    def c_log(self, capacity: int, make: Callable[[int], Any]) -> Any: ...


def timed_plan(
    run: Run,
    observed_run: Run,
    owner: Any,
    label: tuple[Any, ...],
    records: Records,
    max_events: int,
    payload: int,
) -> Run:
    """``run`` timed: a blocking call runs between two clock reads and is entered as ``(label,
    tensors[payload].nbytes, began, ended)`` (the C timer: in ``records.c_log``; the Python one:
    appended to ``records.pending``), ``records.drain(max_events)`` folding them in once
    ``DRAIN_AT`` are waiting; an async call, or any call while ``owner._muted_thread`` is set,
    goes to ``observed_run`` instead."""
    if native is not None and c_fast_paths_enabled():
        log = records.c_log(max(max_events, DRAIN_AT), native.TimedLog)
        return native.Timed(
            run, observed_run, owner, label, log, records.drain, max_events, DRAIN_AT, payload
        )
    clock, drain_at, pending, drain = time.perf_counter, DRAIN_AT, records.pending, records.drain

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
