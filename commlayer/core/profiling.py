"""torch.profiler events for every collective, at no cost while no profiler runs.

torch's own ProcessGroups (gloo, nccl) show each collective in a profile as the dispatcher op that
runs it (``c10d::allreduce_``) and their work event (``gloo:all_reduce``); a backend whose library
knows nothing of torch (shm, mpi, ccl, a plugin) would show nothing. While a profiler runs, the
facade records one event per call for those backends (:func:`event`, :func:`profiled`), named as
torch names the op, with the call's tensors as its inputs (``record_shapes`` shows their shapes
and dtypes) and ``op``, ``group``, ``dtype`` and ``size`` (elements) as keyword inputs.

Knowing whether a profiler runs costs nothing per call: torch calls
``torch.autograd.profiler._run_on_profiler_start`` and ``_run_on_profiler_stop`` around every
profiler it starts (``torch.profiler.profile``, ``torch.autograd.profiler.profile``, emit_nvtx,
emit_itt). :func:`install` wraps the two so that they flip :data:`active` and call the
listeners (the facade drops its plans then, so planned calls, C lookups included, run recording
fast paths only while a profiler runs, and the unplanned path reads one module flag).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.autograd.profiler as _torch_profiler

__all__ = ["TORCH_OPS", "active", "event", "hidden", "install", "listen", "profiled"]

# The dispatcher op torch's ProcessGroup runs for each facade op: the name its event carries.
TORCH_OPS = {
    "all_reduce": "c10d::allreduce_",
    "broadcast": "c10d::broadcast_",
    "reduce": "c10d::reduce_",
    "all_gather": "c10d::allgather_",
    "all_gather_into_tensor": "c10d::_allgather_base_",
    "gather": "c10d::gather_",
    "scatter": "c10d::scatter_",
    "reduce_scatter": "c10d::reduce_scatter_",
    "reduce_scatter_tensor": "c10d::_reduce_scatter_base_",
    "all_to_all": "c10d::alltoall_",
    "all_to_all_single": "c10d::alltoall_base_",
    "barrier": "c10d::barrier",
    "monitored_barrier": "c10d::monitored_barrier_",
    "send": "c10d::send",
    "recv": "c10d::recv_",
    "recv_any": "c10d::recv_any_source_",
    "all_reduce_coalesced": "c10d::allreduce_coalesced_",
    "all_gather_coalesced": "c10d::allgather_coalesced_",
}

active: bool = bool(getattr(_torch_profiler, "_is_profiler_enabled", False))
_listeners: list[Callable[[bool], None]] = []
_hiding = threading.local()  # .depth: how many hidden() blocks this thread is inside
_Record = torch._C._profiler._RecordFunctionFast
_enable_record_function = torch._C._autograd._enable_record_function


def listen(listener: Callable[[bool], None]) -> None:
    """Call ``listener(active)`` whenever a profiler starts or stops."""
    _listeners.append(listener)


def _toggled(on: bool) -> None:
    global active
    if active != on:
        active = on
        for listener in _listeners:
            listener(on)


def _wrap(original: Callable[[], None], on: bool) -> Callable[[], None]:
    def hook() -> None:
        original()
        _toggled(on)

    hook.commlayer_hook = True  # type: ignore[attr-defined]
    return hook


def install() -> None:
    """Hook torch's profiler start and stop (once; a torch without them leaves events off)."""
    for name, on in (("_run_on_profiler_start", True), ("_run_on_profiler_stop", False)):
        original = getattr(_torch_profiler, name, None)
        if original is not None and not getattr(original, "commlayer_hook", False):
            setattr(_torch_profiler, name, _wrap(original, on))


def _tensors(payload: Any) -> list[torch.Tensor]:
    if isinstance(payload, torch.Tensor):
        return [payload]
    return [tensor for tensor in payload if isinstance(tensor, torch.Tensor)]


def event(op: str, group: str, payload: torch.Tensor | Sequence[Any]) -> Any:
    """The profiler event of one ``op`` call on ``group`` over ``payload``'s tensors (a context)."""
    tensors = _tensors(payload)
    first = tensors[0] if tensors else None
    keywords = {
        "op": op,
        "group": group,
        "dtype": str(first.dtype) if first is not None else "",
        "size": sum(tensor.numel() for tensor in tensors),
    }
    return _Record(TORCH_OPS.get(op, f"c10d::{op}"), tensors, keywords)


def profiled(op: str, group: str, run: Callable[..., Any]) -> Callable[..., Any]:
    """``run(async_op, *arguments)`` (a plan's fast path) recording one event per call."""

    def profiled_run(async_op: bool, *arguments: Any) -> Any:
        with event(op, group, arguments):
            return run(async_op, *arguments)

    return profiled_run


@contextlib.contextmanager
def hidden() -> Iterator[None]:
    """Record nothing on this thread inside (a backend's own exchange, not the user's call);
    nested uses keep recording off until the outermost ends."""
    depth = getattr(_hiding, "depth", 0)
    if not depth:
        _enable_record_function(False)
    _hiding.depth = depth + 1
    try:
        yield
    finally:
        _hiding.depth = depth
        if not depth:
            _enable_record_function(True)
