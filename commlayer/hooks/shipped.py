"""The comms logger and a flight recorder, offered as hooks."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from commlayer import comms_logger as _logger
from commlayer.core.flight_recorder import DEFAULT_CAPACITY, FlightRecorder, mark_completed
from commlayer.facade.groups.group import ProcessGroup
from commlayer.hooks.registry import CollectiveCall, register_post_hook, register_pre_hook

__all__ = ["LoggerHandle", "RecorderHook", "comms_logger", "flight_recorder"]


class LoggerHandle:
    """What :func:`comms_logger` returns: ``remove()`` (or leaving a ``with`` block) disables it."""

    def remove(self) -> None:
        _logger.disable()

    def __enter__(self) -> LoggerHandle:  # noqa: PYI034 - py3.10 has no typing.Self
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()


def comms_logger(ops: Iterable[str] | None = None, verbose: bool = False) -> LoggerHandle:
    """Turn the comms logger on (:func:`commlayer.comms_logger.enable`) and return its handle.

    The logger keeps its own fast per-plan timer (it observes in the dispatch's "logger" slot),
    so logging through this handle costs what ``comms_logger.enable`` costs, and nothing once
    removed. Read the records with ``dist.comms_logger.summary()`` / ``stats()``.
    """
    _logger.enable(ops=ops, verbose=verbose)
    return LoggerHandle()


class RecorderHook:
    """A flight recorder fed by hooks: one :class:`~commlayer.core.flight_recorder.FlightRecorder`
    per hooked group, each call entered by the pre-hook and marked completed by the post-hook.

    Unlike each group's built-in recorder (always on, fixed size), it records only the groups and
    ops chosen, with its own capacity, and can be removed.
    """

    def __init__(
        self,
        group: ProcessGroup | None = None,
        capacity: int = DEFAULT_CAPACITY,
        ops: Iterable[str] | None = None,
    ) -> None:
        self.capacity = capacity
        self.ops = None if ops is None else frozenset(ops)
        self.recorders: dict[str, FlightRecorder] = {}
        self._open: dict[tuple[str, int], list[Any]] = {}
        self._handles = (register_pre_hook(self._started, group), register_post_hook(self._completed, group))

    def _started(self, call: CollectiveCall) -> None:
        if self.ops is not None and call.op not in self.ops:
            return
        recorder = self.recorders.get(call.group_name)
        if recorder is None:
            recorder = self.recorders[call.group_name] = FlightRecorder(
                call.group_name, call.group.ranks, self.capacity
            )
        root = -1 if call.root is None else call.root
        self._open[(call.group_name, call.seq)] = recorder.enter(call.op, call.inputs or call.tensors, root)
        if len(self._open) > self.capacity:  # async calls never waited on: forget the oldest
            self._open.pop(next(iter(self._open)))

    def _completed(self, call: CollectiveCall) -> None:
        entry = self._open.pop((call.group_name, call.seq), None)
        if entry is not None:
            mark_completed(entry)

    def to_json(self) -> list[dict[str, Any]]:
        """Every recorded group's ring, as the flight recorder's dumps write it."""
        return [recorder.to_json() for recorder in self.recorders.values()]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()

    def __enter__(self) -> RecorderHook:  # noqa: PYI034 - py3.10 has no typing.Self
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()


def flight_recorder(
    group: ProcessGroup | None = None, capacity: int = DEFAULT_CAPACITY, ops: Iterable[str] | None = None
) -> RecorderHook:
    """Record the calls of ``group`` (None: every group), optionally only ``ops``, in rings of
    ``capacity`` entries; ``hook.to_json()`` reads them, ``hook.remove()`` stops recording."""
    return RecorderHook(group, capacity, ops)
