"""The path every facade op takes: resolve the group, pick the backend, stage, run, wait.

Ops on a rank outside the group return None without communicating (torch's NON_GROUP_MEMBER
behaviour). Strided tensors are staged through contiguous buffers (:mod:`.staging`), so backends
only ever see contiguous tensors.

Plans (the hot path, :mod:`.plans`): the ops that run thousands of times a second run a
cached :class:`~.plans.Plan` after their first call of a kind. A plan is built here
(:func:`new_plan`) around the backend's fast path (``recorded_plan`` or ``plan``, e.g. a torch
ProcessGroup's bound method with prebuilt options) or, for backends without one, around the
ordinary backend op (:func:`.plans.recorded_run`).

Observers (the hook point): with an observer set (:func:`set_observer`: the comms logger in the
"logger" slot, the public hooks of :mod:`commlayer.hooks` in the "hooks" slot), plans are rebuilt
so that each run goes through ``observer.observe(call, nbytes, start, **details)``; ops
without plans go through :func:`run_op`, which calls the same hook. Several observers nest, the
latest slot outermost. Without one, neither path pays anything for it.

Profiler events (:mod:`commlayer.core.profiling`). While a torch profiler runs, plans are rebuilt so
that each run on a backend whose library records no events of its own is recorded as one
event named like torch's; ops without plans test one module flag. With no profiler running,
planned calls pay nothing for it and unplanned ones that flag.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import torch

from commlayer.contract.backend import Backend
from commlayer.contract.fast_paths import FastPath
from commlayer.core import profiling
from commlayer.core.errors import UnsupportedError, invalid_argument
from commlayer.core.flight_recorder import COMPLETED, COMPLETED_NS, STATE, track
from commlayer.core.work import CompletedWork, Work
from commlayer.facade.calls.failures import on_failure
from commlayer.facade.calls.op_call import OpCall, device_type
from commlayer.facade.calls.plans import Plan, forget_plans, plans, recorded_run
from commlayer.facade.calls.staging import copy_back_results, divide_results
from commlayer.facade.groups.group import ProcessGroup, resolve_group

__all__ = [
    "NestedObservers",
    "Observer",
    "begin",
    "new_plan",
    "observed",
    "payload_nbytes",
    "remember",
    "run_op",
    "set_observer",
    "wrapped_plan",
]

log = logging.getLogger("commlayer.dist")
_monotonic_ns = time.monotonic_ns


class Observer(Protocol):
    """The hook every op passes through while set (the comms logger, the public hooks).

    ``observe`` wraps ``start`` (which starts the op and returns its Work) and returns the Work
    the caller gets; ``details`` are the call's arguments (see :func:`run_op`:
    ``tensors``, ``inputs``, ``root``, ``reduce_op``, ``async_op``), for observers that want them.
    An observer may also define ``wrap_plan(call, run, payload, fixed)``, returning its own
    ``run(async_op, *tensors)`` around a plan's fast path, built once per plan (``fixed``: the
    plan's scalar arguments): that is where a cheap per-call record belongs. Without it, plans
    go through :func:`observed`.
    """

    def observe(self, call: OpCall, nbytes: int, start: Callable[[], Work], **details: Any) -> Work: ...


class NestedObservers:
    """Several observers as one: the first innermost, each wrapping the start of the one before."""

    def __init__(self, chain: tuple[Observer, ...]) -> None:
        self.chain = chain

    def observe(self, call: OpCall, nbytes: int, start: Callable[[], Work], **details: Any) -> Work:
        for observer in self.chain:
            start = functools.partial(observer.observe, call, nbytes, start, **details)
        return start()

    def wrap_plan(self, call: OpCall, run: FastPath, payload: int, fixed: tuple[Any, ...] = ()) -> FastPath:
        for observer in self.chain:
            run = wrapped_plan(observer, call, run, payload, fixed)
        return run


def wrapped_plan(
    observer: Observer, call: OpCall, run: FastPath, payload: int, fixed: tuple[Any, ...]
) -> FastPath:
    """``run`` as ``observer`` wants plans run: its own ``wrap_plan``, else :func:`observed`."""
    wrap = getattr(observer, "wrap_plan", None)
    return wrap(call, run, payload, fixed) if wrap is not None else observed(observer, call, run, payload)


def observed(observer: Observer, call: OpCall, run: FastPath, payload: int) -> FastPath:
    """``run`` with every start handed to ``observer.observe`` (a blocking run's None -> a done Work)."""

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


_observer: Observer | None = None
_profiling = profiling.active  # a torch profiler runs: see the module docstring
# Slot name -> observer; _observer is their nesting (see set_observer).
_observers: dict[str, Observer] = {}

# The async_op keyword every backend op takes, built once per mode.
_MODE = {True: {"async_op": True}, False: {"async_op": False}}
# Facade ops that are not backend ops, and the backend ops they are built from.
_BUILT_FROM = {
    "monitored_barrier": ("send", "recv"),
    "all_reduce_coalesced": ("all_reduce",),
    "all_gather_coalesced": ("all_gather_into_tensor",),
}


def _profiler_toggled(on: bool) -> None:
    global _profiling
    _profiling = on
    forget_plans()


profiling.install()
profiling.listen(_profiler_toggled)


def set_observer(observer: Observer | None, slot: str = "logger") -> None:
    """Route every op's start through ``observer`` in ``slot`` (None: empty the slot); drops every plan.

    Slots let the comms logger ("logger") and the public hooks ("hooks") observe at once.
    """
    global _observer
    _observers.pop(slot, None)
    if observer is not None:
        _observers[slot] = observer
    chain = tuple(_observers.values())
    _observer = None if not chain else chain[0] if len(chain) == 1 else NestedObservers(chain)
    forget_plans()


def new_plan(
    call: OpCall, op: str, *fixed: Any, payload: int = 0, flat: bool = False, dtype: torch.dtype | None = None
) -> Plan:
    """The plan for ``call``: ``backend.<op>(*tensors, *fixed)`` started, and waited unless async.

    ``payload`` indexes the tensor whose size an observer reports and the flight recorder enters
    (of dtype ``dtype``); ``flat`` passes 1-D views to the backend op, which the contract
    promises for the tensor-in/tensor-out collectives.
    """
    run = recorded_run(call, op, fixed, payload, flat, dtype)
    if _profiling and not call.backend.records_profiler_events:
        run = profiling.profiled(op, call.group.group_name, run)
    observer = _observer
    if observer is not None:
        run = wrapped_plan(observer, call, run, payload, fixed)
    return Plan(run, call, call.group.size())


def remember(
    key: tuple[Any, ...],
    cacheable: bool,
    call: OpCall,
    op: str,
    *fixed: Any,
    payload: int = 0,
    flat: bool = False,
    dtype: torch.dtype | None = None,
) -> Plan:
    """The plan stored under ``key`` (built by :func:`new_plan` if missing), after validation passed.

    ``cacheable`` is False when the key could also match a call that validation would refuse
    (a torch ReduceOp equals a plain int); that call's plan is then used once and not stored.
    """
    plan = plans.get(key)
    if plan is None:
        plan = new_plan(call, op, *fixed, payload=payload, flat=flat, dtype=dtype)
        if cacheable:
            plans[key] = plan
    return plan


def begin(op: str, group_arg: Any, device: torch.device | None = None) -> OpCall | None:
    """The op's group and backend, checked once per (op, device) and group, then reused."""
    group = resolve_group(op, group_arg)
    if group is None:
        log.debug("%s: this rank is not a member of %r; doing nothing", op, group_arg)
        return None
    key = (op, device)
    call = group.op_calls.get(key)
    if call is None:
        call = group.op_calls[key] = _new_call(op, group, device)
    return call


def _new_call(op: str, group: ProcessGroup, device: torch.device | None) -> OpCall:
    backend = group.primary_backend if device is None else group.backend_for(device_type(device))
    if backend is None:
        raise invalid_argument(
            op,
            "tensor",
            f"a tensor on {' or '.join(group.device_types)} (backend '{group.backend_spec}')",
            f"a tensor on {device}",
            group.global_rank,
            UnsupportedError,
        )
    ops = backend.capabilities.ops
    if op not in ops and not (op in _BUILT_FROM and all(needed in ops for needed in _BUILT_FROM[op])):
        raise UnsupportedError(
            f"{op}: backend '{backend.name}' does not support this op (rank {group.global_rank})"
        )
    return OpCall(op, group, backend, None if device is None else device_type(device))


def run_op(
    call: OpCall,
    start: Callable[[Backend, Mapping[str, bool]], Work],
    *,
    async_op: bool,
    payload: torch.Tensor | Sequence[torch.Tensor] = (),
    copy_back: Sequence[tuple[torch.Tensor, torch.Tensor]] = (),
    root: int = -1,
    average: Sequence[torch.Tensor] = (),
    inputs: torch.Tensor | Sequence[torch.Tensor] | None = None,
    reduce_op: Any = None,
) -> Work | None:
    """Run ``start`` on the call's backend; wait unless ``async_op``, as torch does.

    A synchronous op waits with no explicit timeout, exactly like torch: on CUDA that only orders
    the current stream after the collective instead of blocking the CPU (a timed wait makes
    torch's NCCL work poll the CPU at 1 ms intervals), and every Work adapter bounds an untimed
    wait by its group's timeout itself (torch's own timeout, MPI and oneCCL adapters' deadline).

    ``average`` lists the buffers to divide by the group size once the op completes, before any
    copy back: an AVG the backend ran as SUM (see :func:`.op_call.averaged`).

    ``payload`` is the buffer whose size is the op's message size in nccl-tests' terms (the full
    gathered output, the full reduce-scatter input); it is only measured when the comms logger
    observes the call, so the common path pays nothing for it.

    ``inputs`` (this rank's contribution, when ``payload`` is not it) and ``reduce_op`` are only
    handed to an observer, for hooks that read the call's arguments.

    Every call is entered in its group's flight recorder first (``root``, a group rank, is part
    of the entry); in debug mode that entry is compared across ranks before the backend runs.
    """
    backend = call.backend
    mode = _MODE[async_op]
    entry = call.group.recorder.enter(call.op, payload, root)
    try:
        if _observer is None and not _profiling:
            work = start(backend, mode)
        else:
            work = _started(
                call,
                start,
                mode,
                payload,
                tensors=payload,
                inputs=payload if inputs is None else inputs,
                root=root,
                reduce_op=reduce_op,
                async_op=async_op,
            )
        if average:
            work = work.then(lambda: divide_results(average, call.group.size()))
        if copy_back:
            work = work.then(lambda: copy_back_results(copy_back))
        if async_op:
            track(entry, work)
            return work
        work.wait()
    except Exception as error:  # zero-cost until raised; raw library errors become typed ones
        failure = on_failure(call.group, call.op, error)
        if failure is error:
            raise
        raise failure from error
    entry[STATE] = COMPLETED  # inline: a call to flight_recorder.mark_completed costs ~50 ns more
    entry[COMPLETED_NS] = _monotonic_ns()
    return None


def _started(
    call: OpCall,
    start: Callable[[Backend, Mapping[str, bool]], Work],
    mode: Mapping[str, bool],
    payload: torch.Tensor | Sequence[torch.Tensor],
    **details: Any,
) -> Work:
    """``start`` run under the observers (given the call's ``details``) and, while a profiler
    runs, inside the call's event."""
    backend = call.backend
    observer = _observer
    if observer is None:
        begin_op = lambda: start(backend, mode)
    else:
        begin_op = lambda: observer.observe(
            call, payload_nbytes(payload), lambda: start(backend, mode), **details
        )
    if not _profiling or backend.records_profiler_events:
        return begin_op()
    with profiling.event(call.op, call.group.group_name, payload):
        return begin_op()
