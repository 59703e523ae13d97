"""How the facade enters each call in its group's flight recorder.

Every group's :class:`~commlayer.core.flight_recorder.FlightRecorder` is filled here: planned ops get a
fast path wrapped by :func:`recorded` (or a fused :func:`recording` for the C fast paths), and in
debug mode each ring verifies its collectives across ranks first (:mod:`.debug_check`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from torch import dtype as torch_dtype

from commlayer.core.flight_recorder import FlightRecorder, Recording, capacity_from_env
from commlayer.facade.calls.debug_check import FingerprintCheck, debug_mode
from commlayer.facade.calls.failures import raise_translated

__all__ = ["new_recorder", "recorded", "recording"]

_monotonic_ns = time.monotonic_ns
# Plans whose fixed arguments start with a root (group rank), for the recorder's entry.
_ROOTED_PLANS = frozenset({"broadcast"})
# Plans run on exactly one tensor get a wrapper without *args packing (about 0.1 us less).
_ONE_TENSOR_PLANS = frozenset({"all_reduce", "broadcast", "send", "recv"})


def new_recorder(
    group_name: str, ranks: tuple[int, ...], global_rank: int, timeout: timedelta
) -> FlightRecorder:
    """The ring of a new group; in debug mode it verifies each collective before it runs."""
    recorder = FlightRecorder(group_name, ranks, capacity_from_env())
    if debug_mode():
        recorder.verify = FingerprintCheck(group_name, ranks, global_rank, timeout)
    return recorder


def recording(call: Any, op: str, fixed: tuple[Any, ...], dtype: torch_dtype) -> Recording | None:
    """How a fast path of ``op`` records its calls in the group's flight recorder and
    translates its failures (``Backend.recorded_plan``); None in debug mode, where every
    collective goes through :func:`recorded` instead, to be verified across ranks first."""
    group = call.group
    root = fixed[0] if op in _ROOTED_PLANS else -1
    return group.recorder.recording(op, dtype, root, functools.partial(raise_translated, group, op))


def recorded(
    call: Any, op: str, fixed: tuple[Any, ...], payload: int, run: Callable[..., Any]
) -> Callable[..., Any]:
    """``run`` (a plan's fast path) with every call entered in the group's flight recorder, and
    its failures translated like ``dispatch.run_op``'s (:meth:`FlightRecorder.recorded`). This wrapper is
    the recorder's whole per-call cost on the planned hot path (benchmarks/overhead/recorder_and_debug_checks.py
    measures it)."""
    group = call.group
    root = fixed[0] if op in _ROOTED_PLANS else -1
    fail = functools.partial(raise_translated, group, op)
    return group.recorder.recorded(op, root, payload, run, fail, one_tensor=op in _ONE_TENSOR_PLANS)
