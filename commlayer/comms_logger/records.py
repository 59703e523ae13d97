"""The comms logger's records: running totals per (op, size), trace events and the C timers' log.

Lower than ``_logger`` (which holds one instance and the public functions): nothing here knows
the facade or the world.
"""

from __future__ import annotations

import math
import operator
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from commlayer.core.metrics import busbw_factor

__all__ = ["TraceEvent"]


@dataclass
class _Accumulator:
    """Running totals of one (op, message size) on this rank."""

    count: int = 0
    total_s: float = 0.0
    min_s: float = math.inf
    max_s: float = 0.0
    bus_bytes: float = 0.0  # sum of S x busbw factor: busbw = bus_bytes / total_s

    def add_folded(self, count: int, total_s: float, min_s: float, max_s: float, bus_bytes: float) -> None:
        """``count`` calls of ``bus_bytes`` (S x busbw factor) each, already summed."""
        self.count += count
        self.total_s += total_s
        self.min_s = min(self.min_s, min_s)
        self.max_s = max(self.max_s, max_s)
        self.bus_bytes += bus_bytes * count

    def add(self, seconds: float, bus_bytes: float) -> None:
        self.count += 1
        self.total_s += seconds
        self.min_s = min(self.min_s, seconds)
        self.max_s = max(self.max_s, seconds)
        self.bus_bytes += bus_bytes


class TraceEvent(NamedTuple):
    """One logged op (a tuple: the enabled logger builds one per call)."""

    op: str
    nbytes: int
    start_us: float  # wall clock, so ranks on one host line up in the trace
    duration_us: float
    backend: str
    group: str
    group_size: int


# What a pending entry needs of its call: (op, backend name, group name, group size, global rank).
# A plain tuple of str and int, never a NamedTuple: the collector untracks only exact tuples.
_Label = tuple[str, str, str, int, int]
_OP, _BACKEND, _GROUP, _SIZE, _RANK = range(5)


@dataclass
class _Records:
    """What the logger has seen; survives disable() so that summary() still works after it."""

    rank: int = 0
    totals: dict[tuple[str, int], _Accumulator] = field(default_factory=dict)
    events: deque[Any] = field(default_factory=deque)  # TraceEvents and raw pending entries
    dropped_events: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    # (label, S, perf_counter at start, at return) of blocking ops on CPU tensors, appended by the
    # plan wrappers and folded into totals and events when read (drain), not on the hot path.
    # Only atomic values (a label is a tuple of str and int, see _Label): the garbage collector
    # untracks such tuples at its first pass instead of promoting thousands of them, whose full
    # collections cost the hot path about 2 us a call.
    pending: list[tuple[_Label, int, float, float]] = field(default_factory=list)
    wall_offset: float = 0.0  # time.time() - time.perf_counter(), for pending's timestamps
    # The C timers' entries (a TimedLog, see timer.py): a ring of the most recent calls, folded
    # into totals by drain() and made trace events only by trace().
    log: Any = None

    def c_log(self, capacity: int, make: Callable[[int], Any]) -> Any:
        """The C timers' log, keeping ``capacity`` calls; made on first use. A log of another
        capacity (an enable() with another ``max_trace_events``) is folded in and replaced, its
        calls kept as trace events."""
        if self.log is not None and self.log.capacity != capacity:
            self._fold_log()
            with self.lock:
                self.events.extend(self.log.events())
                self.dropped_events += self.log.dropped()
            self.log = None
        if self.log is None:
            self.log = make(capacity)
        return self.log

    def has_unfolded(self) -> bool:
        return bool(self.pending) or (self.log is not None and self.log.unfolded > 0)

    def drain(self, max_events: int) -> None:
        """Fold every pending entry into totals and events, one pass per (op, S) group."""
        self._fold_log()
        if self.pending:
            self._drain_pending(max_events)

    def _fold_log(self) -> None:
        if self.log is not None and self.log.unfolded:
            self._add_folded(self.log.fold())

    def _add_folded(self, folded: list[tuple[_Label, int, int, float, float, float]]) -> None:
        """Into the totals: (label, S, count, total_s, min_s, max_s) per (op, S) group of calls."""
        with self.lock:
            for label, nbytes, count, total_s, min_s, max_s in folded:
                self.rank = label[_RANK]
                bus_bytes = nbytes * busbw_factor(label[_OP], label[_SIZE])
                self._accumulator(label[_OP], nbytes).add_folded(count, total_s, min_s, max_s, bus_bytes)

    def _accumulator(self, op: str, nbytes: int) -> _Accumulator:
        accumulator = self.totals.get((op, nbytes))
        if accumulator is None:  # not setdefault: that would build an accumulator per call
            accumulator = self.totals[(op, nbytes)] = _Accumulator()
        return accumulator

    def _drain_pending(self, max_events: int) -> None:
        batch = self.pending[:]  # appends may race with this: only the copied ones are removed
        del self.pending[: len(batch)]
        groups: dict[tuple[_Label, int], list[tuple[_Label, int, float, float]]] = {}
        for entry in batch:
            members = groups.get(entry[:2])
            if members is None:
                groups[entry[:2]] = [entry]
            else:
                members.append(entry)
        folded = []
        for (label, nbytes), members in groups.items():
            seconds = list(map(operator.sub, map(_ENDED, members), map(_BEGAN, members)))
            folded.append((label, nbytes, len(seconds), sum(seconds), min(seconds), max(seconds)))
        self._add_folded(folded)
        with self.lock:
            if max_events > 0:
                self.events.extend(batch[-max_events:])  # raw entries: made TraceEvents when read
                for _ in range(len(self.events) - max_events):
                    self.events.popleft()
                    self.dropped_events += 1
            else:
                self.dropped_events += len(batch)

    def trace(self, max_events: int) -> tuple[list[TraceEvent], int]:
        """The kept events, oldest first, at most ``max_events`` of them, and how many were
        dropped (call under ``lock``). The C timers' calls join the others in start order."""
        events = [event if isinstance(event, TraceEvent) else self._event(*event) for event in self.events]
        dropped = self.dropped_events
        if self.log is not None:
            timed = [self._event(*event) for event in self.log.events()]
            events = sorted(events + timed, key=_START) if events else timed
            dropped += self.log.dropped()
        excess = max(0, len(events) - max_events)
        return events[excess:], dropped + excess

    def _event(self, label: _Label, nbytes: int, began: float, ended: float) -> TraceEvent:
        start_us = (began + self.wall_offset) * 1e6
        return TraceEvent(
            label[_OP], nbytes, start_us, (ended - began) * 1e6, label[_BACKEND], label[_GROUP], label[_SIZE]
        )


_BEGAN, _ENDED = operator.itemgetter(2), operator.itemgetter(3)
_START = operator.attrgetter("start_us")
