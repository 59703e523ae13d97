"""The path every facade op takes: resolve the group, pick the backend, stage, launch, wait.

Ops on a rank outside the group return None without communicating (torch's NON_GROUP_MEMBER
behaviour). Non-contiguous tensors are copied to contiguous buffers and copied back when the work
completes, because some libraries (torch 2.13's gloo among them) silently mis-handle strided
memory; backends therefore only ever see contiguous tensors.

Plans (the hot path). The ops that run thousands of times a second (all_reduce, broadcast,
all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single, send/recv) validate their
arguments fully on the first call of a kind, then store a :class:`Plan` under a key of everything
that validation depended on: the op, the ``group`` argument, the scalar arguments (reduce op,
root, peer, tag) and each tensor's dtype, device and layout. A later call with the same key only
checks what the key cannot hold (contiguity, element counts, split sizes) and calls the plan:
one dict lookup instead of resolving, re-validating and wrapping. A plan is built by the
backend's ``plan`` method (a fused launcher, e.g. a torch ProcessGroup's bound method with
prebuilt options) or, for backends without one, by :func:`new_plan` around the ordinary backend
op. Every plan is dropped (:func:`forget_plans`) when a group or the world is created or
destroyed and when the observer changes, so none outlives what it was checked against.

Observers (the hook point). With an observer set (:func:`set_observer`: the comms logger in the
"logger" slot, the public hooks of :mod:`.hooks` in the "hooks" slot), plans are rebuilt so that
each launch goes through ``observer.observe(call, nbytes, start, **details)``; ops without plans
go through :func:`launch`, which calls the same hook. Several observers nest, the latest slot
outermost. Without one, neither path pays anything for it.

Profiler events (:mod:`commlayer.profiling`). While a torch profiler runs, plans are rebuilt so
that each launch on a backend whose library records no events of its own is recorded as one
event named like torch's; ops without plans test one module flag. With no profiler running,
planned calls pay nothing for it and unplanned ones that flag.
"""

from __future__ import annotations

import atexit
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import torch

from .. import profiling
from ..backend import Backend
from ..errors import UnsupportedError, invalid_argument
from ..flight_recorder import COMPLETED, COMPLETED_NS, STATE, Recording, track
from ..types import ReduceOp
from ..work import CompletedWork, Work
from .failures import on_failure
from .groups import ProcessGroup, resolve_group
from .recording import recorded, recording

try:  # the C lookups of planned calls (PlannedP2P, PlannedCollective, PlannedPaired)
    from ..backends import _torch_launcher as native
except ImportError:  # pragma: no cover - a tree whose extensions are not built
    native = None  # type: ignore[assignment]
else:  # every backend's lookups read tensors through the C reader, where one fits this torch
    from ..backends._tensor_reader import tensor_meta_reader

    native.set_tensor_meta(tensor_meta_reader())

__all__ = [
    "NO_PLAN",
    "Observer",
    "OpCall",
    "Plan",
    "averaged",
    "begin",
    "contiguous",
    "device_type",
    "forget_plans",
    "launch",
    "new_plan",
    "observed",
    "plans",
    "run_planned",
    "run_staged",
    "set_observer",
    "wire_op",
    "wrapped_plan",
]

log = logging.getLogger("commlayer.dist")
_monotonic_ns = time.monotonic_ns


class OpCall(NamedTuple):
    """One facade call after its group and backend are resolved (a tuple: cheap to build)."""

    op: str
    group: ProcessGroup
    backend: Backend
    device_type: str | None = None  # of the call's tensors ("cpu", "cuda"); None for tensorless ops

    @property
    def rank(self) -> int:
        """Global rank, for error messages."""
        return self.group.global_rank


class Observer(Protocol):
    """The hook every op passes through while set (the comms logger, the public hooks).

    ``observe`` wraps ``start`` (which launches the op and returns its Work) and returns the Work
    the caller gets; ``details`` are the call's arguments (see :func:`launch`: ``tensors``,
    ``inputs``, ``root``, ``reduce_op``, ``async_op``), for observers that want them. An observer
    may also define ``wrap_plan(call, run, payload, fixed)``, returning its own
    ``run(async_op, *tensors)`` around a plan's launcher, built once per plan (``fixed``: the
    plan's scalar arguments): that is where a cheap per-call record belongs. Without it, plans
    go through :func:`observed`.
    """

    def observe(self, call: OpCall, nbytes: int, start: Callable[[], Work], **details: Any) -> Work: ...


_observer: Observer | None = None
_profiling = profiling.active  # a torch profiler runs: see the module docstring
# Slot name -> observer; _observer is their nesting (see set_observer).
_observers: dict[str, Observer] = {}

# The async_op keyword every backend op takes, built once per mode.
_MODE = {True: {"async_op": True}, False: {"async_op": False}}
_AVG, _SUM = ReduceOp.AVG, ReduceOp.SUM
# Plan ops that reduce, so AVG may need the facade's division of their first tensor (the output).
_REDUCING_PLANS = frozenset({"all_reduce", "reduce_scatter_tensor"})

# Facade ops that are not backend ops, and the backend ops they are built from.
_BUILT_FROM = {"monitored_barrier": ("send", "recv")}


# torch.device.type builds a new str on every access (about 160 ns, as much as a whole tensor
# check); devices hash in about 20 ns, so each distinct device's type is computed once.
_device_types: dict[torch.device, str] = {}


def device_type(device: torch.device) -> str:
    """``device.type``, memoised."""
    kind = _device_types.get(device)
    if kind is None:
        kind = _device_types[device] = device.type
    return kind


def _profiler_toggled(on: bool) -> None:
    global _profiling
    _profiling = on
    forget_plans()


profiling.install()
profiling.listen(_profiler_toggled)


def set_observer(observer: Observer | None, slot: str = "logger") -> None:
    """Route every op's launch through ``observer`` in ``slot`` (None: empty the slot); drops every plan.

    Slots let the comms logger ("logger") and the public hooks ("hooks") observe at once.
    """
    global _observer
    _observers.pop(slot, None)
    if observer is not None:
        _observers[slot] = observer
    chain = tuple(_observers.values())
    _observer = None if not chain else chain[0] if len(chain) == 1 else _Nested(chain)
    forget_plans()


class _Nested:
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


class Plan(NamedTuple):
    """A validated way to run one kind of call: ``run(async_op, *tensors)`` starts it.

    ``run`` returns the Work when ``async_op`` is true; otherwise it waits, as torch does, and
    returns None. ``size`` is the group's size, for the per-call element-count checks.
    """

    run: Callable[..., Work | None]
    call: OpCall
    size: int


# Key -> Plan; see the module docstring for what keys hold and when plans are dropped.
plans: dict[tuple[Any, ...], Plan] = {}


NO_PLAN: Any = object()  # what a planned lookup returns when the call has no plan to run


def run_planned(head: tuple[Any, ...], tensor: Any, async_op: bool) -> Any:
    """Run the plan keyed ``(*head, tensor.dtype, tensor.device, tensor.layout)`` on ``tensor``, or
    return NO_PLAN (not a tensor, an unhashable argument, no plan yet, a strided tensor: the
    checked path then validates, plans, stages or refuses the call). The Python twin of the C
    lookups' ``run_planned`` (csrc/torch_launcher/planned.c), for trees where it is not built."""
    try:
        plan = plans.get((*head, tensor.dtype, tensor.device, tensor.layout))
    except (AttributeError, TypeError):
        return NO_PLAN
    if plan is None or not tensor.is_contiguous():
        return NO_PLAN
    return plan.run(async_op, tensor)


def forget_plans() -> None:
    """Drop every plan (groups changed, or the observer did)."""
    plans.clear()


atexit.register(forget_plans)  # plans refer to backends: release them before interpreter teardown


def new_plan(
    call: OpCall, op: str, *fixed: Any, payload: int = 0, flat: bool = False, dtype: torch.dtype | None = None
) -> Plan:
    """The plan for ``call``: ``backend.<op>(*tensors, *fixed)`` started, and waited unless async.

    ``payload`` indexes the tensor whose size an observer reports and the flight recorder enters
    (of dtype ``dtype``); ``flat`` passes 1-D views to the backend op, which the contract
    promises for the tensor-in/tensor-out collectives.
    """
    run = _recorded_launcher(call, op, fixed, payload, flat, dtype)
    if _profiling and not call.backend.records_profiler_events:
        run = profiling.profiled(op, call.group.group_name, run)
    observer = _observer
    if observer is not None:
        run = wrapped_plan(observer, call, run, payload, fixed)
    return Plan(run, call, call.group.size())


def _recorded_launcher(
    call: OpCall, op: str, fixed: tuple[Any, ...], payload: int, flat: bool, dtype: torch.dtype | None
) -> Callable[..., Work | None]:
    """A launcher that enters each call in the group's flight recorder: the backend's own
    (``recorded_plan``), else the facade's (:func:`_fused_launcher`), each recording inline;
    the recording wrapper only around a backend ``plan`` and in debug mode."""
    backend = call.backend
    if op in _REDUCING_PLANS and _emulates_avg(call, fixed[0]):
        run = _launcher(backend, op, (_SUM, *fixed[1:]), flat, divisor=call.group.size())
        return recorded(call, op, fixed, payload, run)
    record = recording(call, op, fixed, dtype) if dtype is not None else None
    if record is not None:
        run = backend.recorded_plan(op, fixed, record)
        if run is not None:
            return run
    own = backend.plan(op, *fixed)
    if own is not None or record is None:
        return recorded(call, op, fixed, payload, own or _launcher(backend, op, fixed, flat))
    return _fused_launcher(backend, op, fixed, payload, flat, record)


def _launcher(
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
            work = work.then(lambda: _divide(outputs, divisor))
        if async_op:
            return work
        work.wait()
        return None

    return run


def _fused_launcher(
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


def observed(
    observer: Observer, call: OpCall, run: Callable[..., Work | None], payload: int
) -> Callable[..., Work | None]:
    """``run`` with every launch handed to ``observer.observe`` (a blocking run's None -> a done Work)."""

    def observed_run(async_op: bool, *tensors: torch.Tensor) -> Work | None:
        start = lambda: run(async_op, *tensors) or CompletedWork()
        work = observer.observe(call, _nbytes(tensors[payload]), start)
        if async_op:
            return work
        work.wait()
        return None

    return observed_run


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


def run_staged(
    plan: Plan, async_op: bool, copy_back: Sequence[tuple[torch.Tensor, torch.Tensor]], *tensors: torch.Tensor
) -> Work | None:
    """Run ``plan`` on contiguous stand-ins, copying staged outputs back into the caller's tensors."""
    work = plan.run(async_op, *tensors)
    if not copy_back:
        return work
    if work is None:  # a synchronous op has already completed
        _copy_back(copy_back)
        return None
    return work.then(lambda: _copy_back(copy_back))


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    # A view costs about a microsecond: skip it when already 1-D.
    return tensor if tensor.dim() == 1 else tensor.view(-1)


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


def contiguous(tensor: torch.Tensor, copy_back: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """A contiguous stand-in for ``tensor``; outputs register a copy back into the original."""
    if tensor.is_contiguous():
        return tensor
    buffer = tensor.contiguous()
    copy_back.append((tensor, buffer))
    return buffer


def launch(
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
    copy back: an AVG the backend ran as SUM (see :func:`averaged`).

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
            work = work.then(lambda: _divide(average, call.group.size()))
        if copy_back:
            work = work.then(lambda: _copy_back(copy_back))
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
        begin_op = lambda: observer.observe(call, _nbytes(payload), lambda: start(backend, mode), **details)
    if not _profiling or backend.records_profiler_events:
        return begin_op()
    with profiling.event(call.op, call.group.group_name, payload):
        return begin_op()


def _divide(tensors: Sequence[torch.Tensor], divisor: int) -> None:
    # Outside autograd, like the copy back: the facade's AVG writes a result, not a graph node.
    with torch.no_grad():
        for tensor in tensors:
            tensor.div_(divisor)


def _copy_back(copy_back: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
    # Outside autograd, as torch writes collective results: a leaf that requires grad accepts it.
    with torch.no_grad():
        for original, buffer in copy_back:
            original.copy_(buffer)


def wire_op(call: OpCall, op: ReduceOp) -> ReduceOp:
    """The reduction the backend runs: SUM for AVG unless it declares ``native_avg``."""
    return _SUM if _emulates_avg(call, op) else op


def averaged(call: OpCall, op: Any, results: Sequence[torch.Tensor]) -> Sequence[torch.Tensor]:
    """What the facade divides after the op: ``results`` for an AVG the backend runs as SUM.

    AVG is implemented here once: a backend sees it only if it declares ``native_avg``.
    """
    return results if _emulates_avg(call, op) else ()


def _emulates_avg(call: OpCall, op: Any) -> bool:
    return op is _AVG and not call.backend.capabilities.native_avg


def _nbytes(payload: torch.Tensor | Sequence[torch.Tensor]) -> int:
    tensors = [payload] if isinstance(payload, torch.Tensor) else payload
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)
