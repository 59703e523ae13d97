"""Observers (the hook point): the :class:`Observer` protocol, their nesting, and observed plans.

With an observer set (:func:`.dispatch.set_observer`: the comms logger in the "logger" slot, the
public hooks of :mod:`.hooks` in the "hooks" slot), plans are rebuilt so that each launch goes
through ``observer.observe(call, nbytes, start, **details)``; ops without plans go through
:func:`.dispatch.launch`, which calls the same hook. Several observers nest, the latest slot
outermost. Without one, neither path pays anything for it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from commlayer.core.work import CompletedWork, Work
from commlayer.facade.calls.op_call import OpCall

__all__ = ["NestedObservers", "Observer", "observed", "payload_nbytes", "wrapped_plan"]


class Observer(Protocol):
    """The hook every op passes through while set (the comms logger, the public hooks).

    ``observe`` wraps ``start`` (which launches the op and returns its Work) and returns the Work
    the caller gets; ``details`` are the call's arguments (see :func:`.dispatch.launch`:
    ``tensors``, ``inputs``, ``root``, ``reduce_op``, ``async_op``), for observers that want them.
    An observer may also define ``wrap_plan(call, run, payload, fixed)``, returning its own
    ``run(async_op, *tensors)`` around a plan's launcher, built once per plan (``fixed``: the
    plan's scalar arguments): that is where a cheap per-call record belongs. Without it, plans
    go through :func:`observed`.
    """

    def observe(self, call: OpCall, nbytes: int, start: Callable[[], Work], **details: Any) -> Work: ...


class NestedObservers:
    """Several observers as one: the first innermost, each wrapping the launch of the one before."""

    def __init__(self, chain: tuple[Observer, ...]) -> None:
        self.chain = chain

    def observe(self, call: OpCall, nbytes: int, start: Callable[[], Work], **details: Any) -> Work:
        for observer in self.chain:
            start = functools.partial(observer.observe, call, nbytes, start, **details)
        return start()

    def wrap_plan(
        self, call: OpCall, run: Callable[..., Work | None], payload: int, fixed: tuple[Any, ...] = ()
    ) -> Callable[..., Work | None]:
        for observer in self.chain:
            run = wrapped_plan(observer, call, run, payload, fixed)
        return run


def wrapped_plan(
    observer: Observer, call: OpCall, run: Callable[..., Work | None], payload: int, fixed: tuple[Any, ...]
) -> Callable[..., Work | None]:
    """``run`` as ``observer`` wants plans run: its own ``wrap_plan``, else :func:`observed`."""
    wrap = getattr(observer, "wrap_plan", None)
    return wrap(call, run, payload, fixed) if wrap is not None else observed(observer, call, run, payload)


def observed(
    observer: Observer, call: OpCall, run: Callable[..., Work | None], payload: int
) -> Callable[..., Work | None]:
    """``run`` with every launch handed to ``observer.observe`` (a blocking run's None -> a done Work)."""

    def observed_run(async_op: bool, *tensors: torch.Tensor) -> Work | None:
        start = lambda: run(async_op, *tensors) or CompletedWork()
        work = observer.observe(call, payload_nbytes(tensors[payload]), start)
        if async_op:
            return work
        work.wait()
        return None

    return observed_run


def payload_nbytes(payload: torch.Tensor | Sequence[torch.Tensor]) -> int:
    """The size in bytes of a call's payload (one tensor or several), as observers report it."""
    tensors = [payload] if isinstance(payload, torch.Tensor) else payload
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)
