"""A per-group ring buffer of the last collectives, cheap enough to stay on in production.

Every op the facade runs is recorded before it reaches the backend, as one small list::

    [seq, op, shape, dtype, root, state, queued_ns, completed_ns, work_ref]

``seq`` counts the group's collectives (point-to-point ops have their own counter, marked by a
``p2p`` op name), so entry #1234 on one rank is the same collective as #1234 on every other rank
of the group. ``state`` is ``started`` until a synchronous op returns (then ``completed``); an
async op's state is read from its Work, through a weak reference, when the ring is dumped. A dump
is plain JSON, one file per rank; ``commlayer trace analyze DIR`` merges them
(:mod:`commlayer.trace_analysis`).
"""

from __future__ import annotations

import functools
import itertools
import json
import linecache
import os
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

import torch

from commlayer.core import settings

__all__ = [
    "COMPLETED",
    "DEFAULT_CAPACITY",
    "ENTRY_FIELDS",
    "FAILED",
    "P2P_OPS",
    "STARTED",
    "FlightRecorder",
    "Recording",
    "c_spec",
    "capacity_from_env",
    "describe_entry",
    "mark_completed",
    "prefill",
    "track",
    "write_dump",
]

DEFAULT_CAPACITY = 2000
CAPACITY_ENV = settings.FLIGHT_RECORDER_SIZE.name
STARTED = "started"
COMPLETED = "completed"
FAILED = "failed"  # the op raised on this rank (an async op's Work failed, or the caller's call raised)
P2P_OPS = frozenset({"send", "recv"})

# An entry's fields, in order: declared here once. An entry is a list, not an object (building
# one costs ~30 ns, an instance ~300 ns); the C fast paths read its layout from
# csrc/common/recorder_spec.h, generated from these declarations (see write_c_spec).
ENTRY_FIELDS = ("seq", "op", "shape", "dtype", "root", "state", "queued_ns", "completed_ns", "work")
SEQ, OP, SHAPE, DTYPE, ROOT, STATE, QUEUED_NS, COMPLETED_NS, WORK = range(len(ENTRY_FIELDS))

_monotonic_ns = time.monotonic_ns
_weak = weakref.ref
_Tensor = torch.Tensor


def capacity_from_env(environ: dict[str, str] | os._Environ = os.environ) -> int:
    """Ring size from ``$COMMLAYER_FLIGHT_RECORDER_SIZE`` (default 2000, at least 1)."""
    return max(1, int(settings.FLIGHT_RECORDER_SIZE.value(environ)))


# The tensor of a planned op's call that its entry records (the index in the fast path's
# ``run(async_op, *tensors)``), as the facade plans them: the one tensor, all_gather's output,
# reduce_scatter's and all_to_all's input. Backends' fast paths read it from here.
PLANNED_PAYLOAD: dict[str, int] = {
    "all_reduce": 0,
    "broadcast": 0,
    "all_gather_into_tensor": 0,
    "reduce_scatter_tensor": 1,
    "all_to_all_single": 1,
}


class Recording(NamedTuple):
    """What a fast path needs to enter its calls in a ring itself, with no Python call: the spec
    every fast path records by, in Python (:meth:`fast_path`) and in C (which reads these fields
    by name, csrc/common/recorder.h).

    A wrapper frame and an ``enter`` call cost a planned op more than the entry's own work, so
    fast paths that record (``Backend.recorded_plan``) take these steps inline, in this order::

        seq = next_seq()
        entry = [seq, op, shape, dtype, root, STARTED, monotonic_ns(), 0, None]
        ring[seq % capacity] = entry   # then WORK (weakly) or STATE and COMPLETED_NS

    where ``shape`` is ``payload.shape`` (a point-to-point entry's too: its dump lists it as the
    one shape of a list, as :meth:`FlightRecorder.enter` records them). On any exception
    the fast path calls ``fail(error)`` inside its ``except`` block: it re-raises ``error`` or
    its typed translation (and dumps the rings, see ``commlayer.facade.calls.failures``).
    In Python these steps are written once, in :data:`_STEPS`.
    """

    next_seq: Callable[[], int]
    ring: list[list[Any] | None]
    capacity: int
    op: str  # as entered: "all_reduce", or "p2p:send" for point-to-point ops
    dtype: torch.dtype
    root: int
    fail: Callable[[Exception], NoReturn]

    def fast_path(
        self, payload: int, start: Callable[..., Any], one_tensor: bool = False
    ) -> Callable[..., Any]:
        """``run(async_op, *tensors)``: each call entered as listed above, around ``start``.

        Args:
            payload: the index of the tensor the entry describes.
            start: ``start(async_op, *tensors)`` begins the op and returns the async op's Work
                (tracked weakly, returned to the caller), or for a synchronous op what to wait
                for, or None when it has already completed.
            one_tensor: the op takes exactly one tensor: ``run(async_op, tensor)`` passes it on
                without ``*args`` packing (as cheap as the steps written inline).
        """
        run = _steps("start", one_tensor, inline=True)(*self, start=start, payload=payload)
        return functools.update_wrapper(run, start)  # named after start: where the fast path's op is

    def method_fast_path(
        self, payload: int, method: Callable[..., Any], fixed: tuple[Any, ...]
    ) -> Callable[..., Any]:
        """:meth:`fast_path` around a backend's op method itself, without a frame of its own:
        ``run(async_op, *tensors)`` calls ``method(*tensors, *fixed, async_op=async_op)``."""
        return _steps("method", False, inline=True)(*self, start=method, payload=payload, fixed=fixed)


# The steps of every Python fast path, written once (``Recording`` lists them). What varies is
# filled in per kind, compiled once: how the op starts (``start``: a callable's Work, or what a
# blocking op waits for; ``method``: a backend op method's Work; ``run``: a plan's run, which
# waits itself), whether the op takes exactly one tensor, and whether the entry is written inline
# or made by ``FlightRecorder.enter`` (which debug mode verifies). Each kind is a closure factory,
# so a fast path runs exactly the bytecode these steps would be written out as.
_STEPS = """\
def make(next_seq, ring, capacity, name, dtype, root, fail, *, start, payload, fixed=(), enter=None):
    def run(async_op, {tensors}):
        {enter}
        try:
            work = {start}
            if async_op:
                entry[WORK] = _weak(work)
                return work
            {wait}
        except Exception as error:  # fail() re-raises it, translated; zero-cost until raised
            fail(error)
        entry[STATE] = COMPLETED
        entry[COMPLETED_NS] = _monotonic_ns()
        return None

    return run
"""
# An inline entry's fields, as expressions of the factory's names (in ENTRY_FIELDS' order).
_INLINE_ENTRY = {
    "seq": "seq",
    "op": "name",
    "shape": "{payload}.shape",
    "dtype": "dtype",
    "root": "root",
    "state": "STARTED",
    "queued_ns": "_monotonic_ns()",
    "completed_ns": "0",
    "work": "None",
}
_STARTS = {
    "start": ("start(async_op, {arguments})", "if work is not None:\n                work.wait()"),
    "method": ("start({arguments}, *fixed, async_op=async_op)", "work.wait()"),
    "run": ("start(async_op, {arguments})", "pass  # the plan's run waited"),
}


@functools.cache
def _steps(starts: str, one_tensor: bool, inline: bool) -> Callable[..., Callable[..., Any]]:
    """The closure factory of one kind of fast path (see :data:`_STEPS`)."""
    tensors, arguments, described = (
        ("tensor", "tensor", "tensor") if one_tensor else ("*tensors", "*tensors", "tensors[payload]")
    )
    entry = "[" + ", ".join(_INLINE_ENTRY[field] for field in ENTRY_FIELDS).format(payload=described) + "]"
    enter = (
        f"seq = next_seq()\n        entry = {entry}\n        ring[seq % capacity] = entry"
        if inline
        else f"entry = enter(name, {described}, root)"
    )
    start, wait = _STARTS[starts]
    source = _STEPS.format(tensors=tensors, enter=enter, start=start.format(arguments=arguments), wait=wait)
    filename = f"<flight recorder steps: {starts}, {'one tensor' if one_tensor else 'tensors'}, {'inline' if inline else 'enter'}>"
    linecache.cache[filename] = (
        len(source),
        None,
        source.splitlines(keepends=True),
        filename,
    )  # for tracebacks
    names = {"__name__": __name__, "_weak": _weak, "_monotonic_ns": _monotonic_ns}
    names |= {"STARTED": STARTED, "COMPLETED": COMPLETED}
    names |= {"WORK": WORK, "STATE": STATE, "COMPLETED_NS": COMPLETED_NS}
    exec(compile(source, filename, "exec"), names)  # noqa: S102 - our own template, compiled once per kind
    return names["make"]


class FlightRecorder:
    """The ring of one process group on this rank."""

    def __init__(self, group_name: str, ranks: Sequence[int], capacity: int = DEFAULT_CAPACITY) -> None:
        self.group_name = group_name
        self.ranks = tuple(ranks)
        self.capacity = capacity
        self._ring: list[list[Any] | None] = [None] * capacity
        self._p2p_ring: list[list[Any] | None] = [None] * capacity
        self._collectives = itertools.count(1)  # the group's collective sequence numbers
        self._p2p = itertools.count(1)
        # Debug mode's cross-rank check of each collective (commlayer.facade.calls.failures), else None.
        self.verify: Callable[[list[Any]], None] | None = None

    def enter(self, op: str, payload: torch.Tensor | Sequence[torch.Tensor], root: int = -1) -> list[Any]:
        """Record ``op`` as started and return its entry (the caller marks it completed).

        ``root`` is the group rank of a rooted op (-1 otherwise). In debug mode the collective is
        compared across ranks here, before it reaches the backend. This runs on every call, so
        it is written for speed (about 0.2 us): counters are itertools counters, the entry a list.
        """
        if op in P2P_OPS:
            return self._enter_p2p(op, payload)
        seq = next(self._collectives)
        if type(payload) is _Tensor:
            entry = [seq, op, payload.shape, payload.dtype, root, STARTED, _monotonic_ns(), 0, None]
        else:
            entry = _list_entry(seq, op, payload, root)
        self._ring[seq % self.capacity] = entry
        if self.verify is not None:
            self.verify(entry)
        return entry

    def recording(
        self, op: str, dtype: torch.dtype, root: int, fail: Callable[[Exception], NoReturn]
    ) -> Recording | None:
        """How a fast path of ``op`` on ``dtype`` tensors records its calls; None in debug
        mode, where every collective must go through :meth:`enter` (which verifies it)."""
        if self.verify is not None:
            return None
        if op in P2P_OPS:
            return Recording(self._p2p.__next__, self._p2p_ring, self.capacity, "p2p:" + op, dtype, -1, fail)
        return Recording(self._collectives.__next__, self._ring, self.capacity, op, dtype, root, fail)

    def recorded(
        self,
        op: str,
        root: int,
        payload: int,
        run: Callable[..., Any],
        fail: Callable[[Exception], NoReturn],
        one_tensor: bool = False,
    ) -> Callable[..., Any]:
        """``run`` (a plan's run, ``run(async_op, *tensors)``) with each call entered through
        :meth:`enter` (so debug mode verifies it first), tracked or completed after, and its
        errors passed to ``fail`` (which re-raises them, translated).

        Args:
            op: the op as entered.
            root: the group rank of a rooted op, else -1.
            payload: the index of the tensor the entry describes.
            run: the plan's run to record.
            fail: called inside the except block with the error.
            one_tensor: ``run`` takes exactly one tensor (no ``*args`` packing: about 0.1 us less).
        """
        make = _steps("run", one_tensor, inline=False)
        return make(None, None, 0, op, None, root, fail, start=run, payload=payload, enter=self.enter)

    def op_of(self, work: Any) -> str | None:
        """The op (``recv``, not ``p2p:recv``) whose entry tracks ``work``, if still in the rings."""
        for entry in (*self._ring, *self._p2p_ring):
            if entry and entry[SEQ] and isinstance(entry[WORK], weakref.ref) and entry[WORK]() is work:
                return entry[OP].removeprefix("p2p:")
        return None

    def mark_failed(self, op: str) -> None:
        """Mark the newest started entry of ``op`` (``recv``, not ``p2p:recv``) failed: the call
        raised on this rank, which a dump then tells from a call still waiting."""
        name, ring = ("p2p:" + op, self._p2p_ring) if op in P2P_OPS else (op, self._ring)
        started = [
            entry for entry in ring if entry and entry[SEQ] and entry[OP] == name and entry[STATE] == STARTED
        ]
        if started:
            max(started, key=lambda entry: entry[SEQ])[STATE] = FAILED

    def overdue(self, limit_s: float) -> tuple[int, str] | None:
        """``(seq, op)`` of the oldest op still running after ``limit_s`` seconds, if any (for
        the watchdog: reads the rings and the async ops' Works, never waits)."""
        oldest = _monotonic_ns() - int(limit_s * 1e9)
        late = [
            entry
            for entry in (*self._ring, *self._p2p_ring)
            if entry and entry[SEQ] and entry[STATE] == STARTED and entry[QUEUED_NS] < oldest
        ]
        for entry in sorted(late, key=lambda entry: entry[QUEUED_NS]):
            if describe_entry(entry)["state"] == STARTED:
                return entry[SEQ], entry[OP]
        return None

    def recorded_any(self) -> bool:
        """Whether any op was entered in this group's rings."""
        return any(entry and entry[SEQ] for entry in (*self._ring, *self._p2p_ring))

    def _enter_p2p(self, op: str, payload: torch.Tensor | Sequence[torch.Tensor]) -> list[Any]:
        seq = next(self._p2p)
        entry = _list_entry(seq, "p2p:" + op, [payload] if type(payload) is _Tensor else payload, -1)
        self._p2p_ring[seq % self.capacity] = entry
        return entry

    def snapshot(self) -> list[dict[str, Any]]:
        """The recorded entries, oldest first, as JSON-ready dicts (reads async states now)."""
        entries = [describe_entry(entry) for entry in (*self._ring, *self._p2p_ring) if entry and entry[SEQ]]
        return sorted(entries, key=lambda entry: (entry["op"].startswith("p2p:"), entry["seq"]))

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group_name,
            "ranks": list(self.ranks),
            "last_collective": max((entry[SEQ] for entry in self._ring if entry), default=0),
            "entries": self.snapshot(),
        }


def prefill(ring: list[list[Any] | None]) -> None:
    """Fill the empty slots of ``ring`` with blank entries (``seq`` 0, which no call has).

    For fast paths that rewrite the entry they replace in place (shm's): without blanks, each of
    a group's first ``capacity`` calls allocates a list in fresh memory, ~0.25 us more per call
    on the project VM than the steady state. Every reader skips blank entries. Each blank is a
    list of its own (a fast path rewrites only an entry nothing else holds); the cost is one list
    per slot, about 130 bytes.
    """
    for slot, entry in enumerate(ring):
        if entry is None:
            ring[slot] = [0, "", (), None, -1, COMPLETED, 0, 0, None]


def mark_completed(entry: list[Any]) -> None:
    """A synchronous op's entry, completed (``dispatch.run_op`` takes these two steps inline)."""
    entry[STATE] = COMPLETED
    entry[COMPLETED_NS] = _monotonic_ns()


def track(entry: list[Any], work: Any) -> None:
    """Remember an async op's Work weakly: the ring must not keep its tensors alive."""
    entry[WORK] = weakref.ref(work)


def describe_entry(entry: list[Any]) -> dict[str, Any]:
    state = entry[STATE]
    work_ref = entry[WORK]
    if state == STARTED and work_ref is not None:
        work = work_ref()
        if work is None:
            state = "released"  # the caller dropped the handle; its outcome is unknown
        elif work.is_completed():
            state = COMPLETED if work.exception() is None else FAILED
    shape = entry[SHAPE]
    if isinstance(shape, list):
        described = [list(item) for item in shape]
    else:  # a fast path's point-to-point entry holds its one shape bare (saves a list a call)
        described = [list(shape)] if entry[OP].startswith("p2p:") else list(shape)
    return {
        "seq": entry[SEQ],
        "op": entry[OP],
        "shape": described,
        "dtype": str(entry[DTYPE]).replace("torch.", ""),
        "root": entry[ROOT],
        "state": state,
        "queued_ns": entry[QUEUED_NS],
        "completed_ns": entry[COMPLETED_NS] or None,
    }


def _list_entry(seq: int, op: str, payload: Sequence[torch.Tensor], root: int) -> list[Any]:
    dtype = payload[0].dtype if len(payload) else None
    return [seq, op, [tensor.shape for tensor in payload], dtype, root, STARTED, _monotonic_ns(), 0, None]


def write_dump(directory: str | os.PathLike[str], rank: int, document: dict[str, Any]) -> Path:
    """Write ``document`` as ``DIR/rank<rank>.json`` atomically (a reader never sees half a file)."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"rank{rank}.json"
    partial = folder / f".rank{rank}.json.{os.getpid()}.tmp"
    partial.write_text(json.dumps(document, indent=1))
    os.replace(partial, target)
    return target


# --- the C side's copy of the declarations above ------------------------------------------------

C_SPEC = Path(__file__).resolve().parents[2] / "csrc" / "common" / "recorder_spec.h"


def c_spec() -> str:
    """csrc/common/recorder_spec.h: the entry's slots, the Recording's field names and the entry
    states, as C reads them (tests/observability/test_recorder_spec.py keeps them equal)."""
    slots = [f"    RECORDER_ENTRY_{field.upper()} = {index}," for index, field in enumerate(ENTRY_FIELDS)]
    fields = [f'#define RECORDER_FIELD_{field.upper()} "{field}"' for field in Recording._fields]
    return "\n".join(
        [
            "// Generated from commlayer/core/flight_recorder.py by `python -m commlayer.core.flight_recorder`:",
            "// do not edit. tests/observability/test_recorder_spec.py fails when the two differ.",
            "#pragma once",
            "",
            "// An entry's slots (ENTRY_FIELDS).",
            "enum {",
            *slots,
            f"    RECORDER_ENTRY_SLOTS = {len(ENTRY_FIELDS)}",
            "};",
            "",
            "// The fields of a Recording, which C reads by name (csrc/common/recorder.h).",
            *fields,
            "",
            "// An entry's states.",
            f'#define RECORDER_ENTRY_STARTED "{STARTED}"',
            f'#define RECORDER_ENTRY_COMPLETED "{COMPLETED}"',
            "",
        ]
    )


if __name__ == "__main__":
    C_SPEC.write_text(c_spec())
    print(f"wrote {C_SPEC}")
