"""Flight-recorder dumps and debug-mode mismatch detection for the facade.

Every group's :class:`~commlayer.flight_recorder.FlightRecorder` is filled by ``launch``. This
module writes them out -- on request (:func:`dump_flight_recorder`), on SIGUSR1, when an op fails
with a commlayer error, and at exit after an uncaught commlayer error -- and, with
``COMMLAYER_DEBUG=detail`` or ``TORCH_DISTRIBUTED_DEBUG=DETAIL``, compares every collective's
fingerprint across the group through the rendezvous store before it runs. Example, rank 1 of 2
posting 8 elements where rank 0 posts 4::

    CollectiveMismatchError: all_reduce #3 on group 'world': the ranks called different
    collectives: rank 0: all_reduce(float32[4], root=-1); rank 1: all_reduce(float32[8], root=-1)
"""

from __future__ import annotations

import functools
import logging
import os
import re
import signal
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

import torch.distributed as torch_dist
from torch import dtype as torch_dtype

from .. import health
from ..errors import (
    CollectiveMismatchError,
    CommError,
    CommTimeoutError,
    PeerFailureError,
    describe_ranks,
    invalid_argument,
)
from ..flight_recorder import (
    COMPLETED,
    COMPLETED_NS,
    DTYPE,
    OP,
    ROOT,
    SEQ,
    SHAPE,
    STATE,
    WORK,
    FlightRecorder,
    Recording,
    capacity_from_env,
    write_dump,
)
from ..work import set_wait_error_hook
from ._groups import ProcessGroup, World, resolve_group, world_or_none
from ._health import request_dumps

__all__ = [
    "DEBUG_ENV",
    "TRACE_DIR_ENV",
    "debug_mode",
    "dump_flight_recorder",
    "install_handlers",
    "new_recorder",
    "on_failure",
    "recorded",
    "recording",
    "translate",
    "wait_translated",
]

log = logging.getLogger("commlayer.dist")

DEBUG_ENV = "COMMLAYER_DEBUG"
TRACE_DIR_ENV = "COMMLAYER_TRACE_DIR"
# All-to-all inputs may differ in shape between ranks (uneven splits): only op and dtype count.
_SHAPE_FREE_OPS = frozenset({"all_to_all", "all_to_all_single"})
_FINGERPRINT_PREFIX = "commlayer/fingerprint"
_dump_lock = threading.Lock()
_monotonic_ns = time.monotonic_ns
# What gloo, torch and MPI libraries say when a peer's process is gone.
_PEER_LOSS = re.compile(
    r"connection (reset|closed|refused)|broken pipe|end of file|peer (closed|disconnected)|"
    r"socket closed|ECONNRESET|EPIPE|read error",
    re.IGNORECASE,
)
_TIMEOUT = re.compile(r"timed out|timeout", re.IGNORECASE)
# What a backend's own error says when it saw a peer process exit (shm: "peer rank 1 (pid 42) exited").
_PEER_EXITED = re.compile(r"peer rank \d+ .*exited")
# commlayer errors that already say everything: passed on as they are.
_FINAL_ERRORS = (PeerFailureError, CommTimeoutError, CollectiveMismatchError)
# Longest a survivor waits for the peer monitor to name the rank whose connection dropped.
_IDENTIFY_DEAD_PEER_S = 15.0


def debug_mode(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether collectives compare fingerprints across ranks before running.

    Also on after ``dist.set_debug_level(dist.DebugLevel.DETAIL)``, torch's debug-level API.
    """
    return (
        environ.get(DEBUG_ENV, "").lower() == "detail"
        or environ.get("TORCH_DISTRIBUTED_DEBUG", "").upper() == "DETAIL"
        or torch_dist.get_debug_level() == torch_dist.DebugLevel.DETAIL
    )


def new_recorder(
    group_name: str, ranks: tuple[int, ...], global_rank: int, timeout: timedelta
) -> FlightRecorder:
    """The ring of a new group; in debug mode it verifies each collective before it runs."""
    recorder = FlightRecorder(group_name, ranks, capacity_from_env())
    if debug_mode():
        recorder.verify = _FingerprintCheck(group_name, ranks, global_rank, timeout)
    return recorder


def trace_directory() -> Path:
    """``$COMMLAYER_TRACE_DIR``, else ``<tmp>/commlayer-trace``."""
    configured = os.environ.get(TRACE_DIR_ENV)
    return Path(configured) if configured else Path(tempfile.gettempdir()) / "commlayer-trace"


def dump_flight_recorder(
    directory: str | os.PathLike[str] | None = None, reason: str = "request"
) -> Path | None:
    """Write this rank's flight-recorder rings as ``DIR/rank<N>.json``; returns the file (None
    before init). ``DIR`` defaults to ``$COMMLAYER_TRACE_DIR`` or ``<tmp>/commlayer-trace``.
    Read the dumps of every rank with ``commlayer trace analyze DIR``."""
    world = world_or_none()
    if world is None:
        return None
    with _dump_lock:
        document = _document(world, reason)
        path = write_dump(directory or trace_directory(), world.rank, document)
    log.warning("commlayer: flight recorder of rank %d dumped to %s (%s)", world.rank, path, reason)
    return path


def on_failure(group: ProcessGroup, op: str, error: Exception) -> Exception:
    """The error to raise for a failed op, after dumping the flight recorder.

    A raw library error (gloo's "Connection reset by peer", a torch timeout, an mpi4py
    exception) becomes a typed commlayer error naming the op, the group and the rank; a peer
    failure or timeout also aborts the group, so that later calls on it fail at once. Other
    ranks are asked (through the store) to dump their recorders too.
    """
    translated = translate(group, op, error)
    if not isinstance(translated, CommError):
        return translated
    if isinstance(translated, (PeerFailureError, CommTimeoutError)):
        abort_group(group, translated)
    world = world_or_none()
    if world is None:
        return translated
    reason = f"{op} on group '{group.name}' failed: {type(translated).__name__}: {translated}"
    try:
        dump_flight_recorder(reason=reason)
    except Exception as problem:  # noqa: BLE001 - a failed dump must not hide the op's own error
        log.warning("commlayer: flight recorder dump failed: %s", problem)
    request_dumps(reason)
    return translated


# Plans whose fixed arguments start with a root (group rank), for the recorder's entry.
_ROOTED_PLANS = frozenset({"broadcast"})
# Plans launched on exactly one tensor get a wrapper without *args packing (about 0.1 us less).
_ONE_TENSOR_PLANS = frozenset({"all_reduce", "broadcast", "send", "recv"})


def recording(call: Any, op: str, fixed: tuple[Any, ...], dtype: torch_dtype) -> Recording | None:
    """How a fused launcher of ``op`` records its calls in the group's flight recorder and
    translates its failures (``Backend.recorded_plan``); None in debug mode, where every
    collective goes through :func:`recorded` instead, to be verified across ranks first."""
    group = call.group
    root = fixed[0] if op in _ROOTED_PLANS else -1
    return group.recorder.recording(op, dtype, root, functools.partial(_raise_translated, group, op))


def recorded(
    call: Any, op: str, fixed: tuple[Any, ...], payload: int, run: Callable[..., Any]
) -> Callable[..., Any]:
    """``run`` (a plan's launcher) with every call entered in the group's flight recorder, and
    its failures translated like ``launch``'s. This wrapper is the recorder's whole per-call
    cost on the planned hot path (benchmarks/reliability_overhead.py measures it)."""
    enter = call.group.recorder.enter
    group = call.group
    root = fixed[0] if op in _ROOTED_PLANS else -1

    if op in _ONE_TENSOR_PLANS:

        def run_recorded_one(async_op: bool, tensor: Any) -> Any:
            entry = enter(op, tensor, root)
            try:
                work = run(async_op, tensor)
            except Exception as error:  # noqa: BLE001 - re-raised (translated); zero-cost until raised
                _raise_translated(group, op, error)
            if work is None:
                entry[STATE] = COMPLETED
                entry[COMPLETED_NS] = _monotonic_ns()
            else:
                entry[WORK] = weakref.ref(work)
            return work

        return run_recorded_one

    def run_recorded(async_op: bool, *tensors: Any) -> Any:
        entry = enter(op, tensors[payload], root)
        try:
            work = run(async_op, *tensors)
        except Exception as error:  # noqa: BLE001 - re-raised, translated
            _raise_translated(group, op, error)
        if work is None:
            entry[STATE] = COMPLETED
            entry[COMPLETED_NS] = _monotonic_ns()
        else:
            entry[WORK] = weakref.ref(work)
        return work

    return run_recorded


def _raise_translated(group: ProcessGroup, op: str, error: Exception) -> NoReturn:
    """Called from an ``except`` block: re-raise ``error``, or its typed translation."""
    failure = on_failure(group, op, error)
    if failure is error:
        raise error
    raise failure from error


def wait_translated(work: Any, op: str, group_arg: Any, timeout: Any = None) -> None:
    """``work.wait(timeout)`` for a facade op that waits outside ``launch`` (send, recv, barrier),
    with the same error translation, abort and dump as ``launch``."""
    try:
        work.wait(timeout)
    except Exception as error:
        group = resolve_group(op, group_arg)
        if group is None:
            raise
        _raise_translated(group, op, error)


def translate(group: ProcessGroup, op: str, error: Exception) -> Exception:
    """A typed, named error for ``error``; commlayer's own errors and bad arguments pass as they are,
    but a backend's CommError that saw a peer exit becomes a PeerFailureError naming the dead rank."""
    if not isinstance(error, RuntimeError) or isinstance(error, _FINAL_ERRORS):
        return error
    if isinstance(error, CommError) and not _PEER_EXITED.search(str(error)):
        return error
    where = f"{op} on group '{group.name}'"
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    if _PEER_LOSS.search(str(error)) or _PEER_EXITED.search(str(error)) or health.current() is not None:
        failure = health.current() or _await_failure(group.timeout)
        if failure is not None:
            return health.peer_failure_error(op, group.name, group.global_rank, failure)
        return PeerFailureError(
            f"{where}: a peer closed its connection ({text}) and none has been identified as dead "
            f"yet (rank {group.global_rank})",
            op=op,
            group=group.name,
        )
    if _TIMEOUT.search(str(error)):
        return CommTimeoutError(
            f"{where} did not complete within the group timeout of {group.timeout} (rank "
            f"{group.global_rank}); a peer failed or did not call the same op in the same order: {text}"
        )
    return CommError(
        f"{where} failed in the backend (rank {group.global_rank}): {type(error).__name__}: {text}"
    )


def abort_group(group: ProcessGroup, error: CommError) -> None:
    """Make every later op on ``group`` fail at once with the reason (checked only on ``begin``'s
    miss path, so the happy path pays nothing)."""
    group.op_calls = _AbortedCalls(group, error)


class _AbortedCalls(dict):  # type: ignore[type-arg]
    """Stands in for a group's resolved-call cache once it is aborted: every lookup raises."""

    def __init__(self, group: ProcessGroup, error: CommError) -> None:
        super().__init__()
        self.group_name = group.name
        self.rank = group.global_rank
        self.error = error

    def get(self, key: Any, default: Any = None) -> Any:
        op = key[0] if isinstance(key, tuple) else str(key)
        if isinstance(self.error, PeerFailureError):
            why = f"peer rank {self.error.failed_rank} failed"
        else:
            why = "an op timed out" if isinstance(self.error, CommTimeoutError) else "an op failed"
        message = (
            f"{op}: group '{self.group_name}' cannot be used after {why}; it was aborted "
            f"(rank {self.rank}). The failure: {self.error}"
        )
        if isinstance(self.error, PeerFailureError):
            raise PeerFailureError(message, self.error.failed_rank, op, self.group_name)
        raise CommError(message)


def mark_destroyed(group: ProcessGroup) -> None:
    """Make every later op on a destroyed group raise a typed error naming op, group and rank
    (its backends are shut down: mpi's communicator is freed, gloo's would still run)."""
    group.op_calls = _DestroyedCalls(group.name, group.global_rank)


class _DestroyedCalls(dict):  # type: ignore[type-arg]
    """Stands in for a destroyed group's resolved-call cache: every lookup raises."""

    def __init__(self, group_name: str, rank: int) -> None:
        super().__init__()
        self.group_name = group_name
        self.rank = rank

    def get(self, key: Any, default: Any = None) -> Any:
        op = key[0] if isinstance(key, tuple) else str(key)
        raise invalid_argument(
            op,
            "group",
            "a process group that has not been destroyed",
            f"group '{self.group_name}', destroyed by destroy_process_group",
            self.rank,
        )


def _await_failure(timeout: timedelta) -> health.PeerFailure | None:
    """Give the peer monitor time to name the peer whose connection dropped (bounded)."""
    deadline = time.monotonic() + min(timeout.total_seconds(), _IDENTIFY_DEAD_PEER_S)
    while time.monotonic() < deadline:
        failure = health.current()
        if failure is not None:
            return failure
        time.sleep(0.05)
    return health.current()


def install_handlers() -> None:
    """SIGUSR1 dumps the rings (when nobody else handles it); an uncaught CommError dumps at exit;
    a torch Work's failed wait raises a typed error naming op, group and rank."""
    set_wait_error_hook(_typed_wait_error)
    on_main_thread = threading.current_thread() is threading.main_thread()
    if on_main_thread and signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGUSR1, _on_sigusr1)
    if not isinstance(sys.excepthook, _DumpingExceptHook):
        sys.excepthook = _DumpingExceptHook(sys.excepthook)


def _typed_wait_error(work: Any, error: Exception) -> Exception:
    """The typed error for a raw one raised by ``work.wait()`` (gloo's "Connection reset by
    peer", a torch timeout): the op and group come from the flight-recorder entry tracking it."""
    world = world_or_none()
    if world is None:
        return error
    for group in (world.default_group, *world.groups.values()):
        op = group.recorder.op_of(work)
        if op is not None:
            return on_failure(group, op, error)
    return translate(world.default_group, "wait", error)


def _on_sigusr1(signum: int, frame: Any) -> None:
    dump_flight_recorder(reason="SIGUSR1")


class _DumpingExceptHook:
    def __init__(self, previous: Any) -> None:
        self.previous = previous

    def __call__(self, kind: type[BaseException], value: BaseException, trace: Any) -> None:
        if isinstance(value, CommError):
            try:
                dump_flight_recorder(reason=f"uncaught {kind.__name__}: {value}")
            except Exception as problem:  # noqa: BLE001 - never mask the original traceback
                log.warning("commlayer: flight recorder dump failed: %s", problem)
        self.previous(kind, value, trace)


def _document(world: World, reason: str) -> dict[str, Any]:
    groups = [world.default_group, *world.groups.values()]
    return {
        "rank": world.rank,
        "world_size": world.size,
        "pid": os.getpid(),
        "reason": reason,
        "time": time.time(),
        "monotonic_ns": time.monotonic_ns(),
        "groups": [group.recorder.to_json() for group in groups],
    }


def describe_call(entry: list[Any]) -> str:
    """``all_reduce(float32[4, 2], root=-1)``: what a rank called, as the mismatch error shows it."""
    shape = entry[SHAPE]
    dims = "; ".join(_dims(item) for item in shape) if isinstance(shape, list) else _dims(shape)
    dtype = str(entry[DTYPE]).replace("torch.", "")
    return f"{entry[OP]}({dtype}[{dims}], root={entry[ROOT]})"


def _dims(shape: Any) -> str:
    return ", ".join(map(str, shape))


class _FingerprintCheck:
    """Debug mode: every member publishes its call under the collective's sequence number, waits
    for all the others (bounded by the group timeout) and compares; costs a store round trip."""

    def __init__(self, group_name: str, ranks: tuple[int, ...], global_rank: int, timeout: timedelta) -> None:
        self.group_name = group_name
        self.ranks = ranks
        self.global_rank = global_rank
        self.timeout = timeout

    def __call__(self, entry: list[Any]) -> None:
        world = world_or_none()
        if world is None or len(self.ranks) == 1:
            return
        seq = entry[SEQ]
        call = describe_call(entry)
        mine = call if entry[OP] not in _SHAPE_FREE_OPS else f"{entry[OP]}({entry[DTYPE]!s})"
        prefix = f"{_FINGERPRINT_PREFIX}/{self.group_name}/{seq}/"
        store = world.store
        store.set(prefix + str(self.global_rank), mine)
        keys = [prefix + str(rank) for rank in self.ranks]
        self._wait(store, keys, seq, call)
        calls = dict(zip(self.ranks, (value.decode() for value in store.multi_get(keys))))
        self._forget(store, seq - 2)
        if len(set(calls.values())) > 1:
            listing = "; ".join(f"rank {rank}: {made}" for rank, made in calls.items())
            raise CollectiveMismatchError(
                f"{entry[OP]} #{seq} on group '{self.group_name}': the ranks called different "
                f"collectives: {listing} (rank {self.global_rank})",
                calls,
            )

    def _wait(self, store: Any, keys: list[str], seq: int, call: str) -> None:
        try:
            store.wait(keys, self.timeout)
        except Exception as error:  # DistStoreError, or the store's host died
            missing = [rank for rank, key in zip(self.ranks, keys) if not _present(store, key)]
            raise CommTimeoutError(
                f"{call.split('(')[0]} #{seq} on group '{self.group_name}': {describe_ranks(missing)} "
                f"did not call collective #{seq} within {self.timeout}; this rank called {call} "
                f"(rank {self.global_rank})"
            ) from error

    def _forget(self, store: Any, seq: int) -> None:
        # Every member has read #seq once this rank passed #seq + 1: its key can go.
        if seq > 0:
            try:
                store.delete_key(f"{_FINGERPRINT_PREFIX}/{self.group_name}/{seq}/{self.global_rank}")
            except Exception as problem:  # noqa: BLE001 - a leftover key only costs store memory
                log.debug("commlayer: could not delete a fingerprint key: %s", problem)


def _present(store: Any, key: str) -> bool:
    try:
        return bool(store.check([key]))
    except Exception:  # noqa: BLE001
        return False
