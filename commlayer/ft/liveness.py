"""Heartbeats in the store, and the verdict on whether a member is alive.

Each member's heartbeat thread writes ``<prefix>/hb/<member>`` every interval: the time, the
process id and host, the incarnation (a replacement has a new one) and when the training loop
last made progress. A peer is dead when its heartbeat is stale, when its process is gone (a
zombie or a stopped process counts as gone; checked through /proc on the same host), or when
it is hung: its loop made no progress for ``hang_timeout_s`` while it was not waiting on a peer.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from commlayer.core.processes import process_gone
from commlayer.ft.options import FaultToleranceOptions

__all__ = ["Heartbeat", "Liveness"]

_HOST = socket.gethostname()


@dataclass
class _Beat:
    member: int
    incarnation: str
    pid: int
    host: str
    time: float
    progress: float
    waiting: bool


class Heartbeat:
    """The thread that publishes this member's heartbeat; ``progress()`` marks loop progress."""

    def __init__(self, store: Any, member: int, options: FaultToleranceOptions) -> None:
        self.store, self.member, self.options = store, member, options
        self.incarnation = uuid.uuid4().hex[:12]
        self._progress = time.time()
        self._waiting = 0
        self._stop = threading.Event()
        self._publish()
        self._thread = threading.Thread(target=self._run, name="commlayer-ft-heartbeat", daemon=True)
        self._thread.start()

    @property
    def last_progress(self) -> float:
        """When the training loop last moved on or started waiting (time.time())."""
        return self._progress

    def progress(self) -> None:
        """The training loop moved on (call it between phases of a step)."""
        self._progress = time.time()

    def waiting(self, on: bool) -> None:
        """Mark this member as blocked on its peers (it is not hung while waiting)."""
        self._waiting += 1 if on else -1
        self._progress = time.time()

    def stop(self) -> None:
        """Stop publishing (peers then see this member as gone once its process exits)."""
        self._stop.set()
        self._thread.join(timeout=2)

    def _publish(self) -> None:
        beat = {
            "incarnation": self.incarnation,
            "pid": os.getpid(),
            "host": _HOST,
            "time": time.time(),
            "progress": self._progress,
            "waiting": self._waiting > 0,
        }
        self.store.set(f"{self.options.prefix}/hb/{self.member}", json.dumps(beat))

    def _run(self) -> None:
        while not self._stop.wait(self.options.heartbeat_interval_s):
            try:
                self._publish()
            except Exception:  # noqa: BLE001 - the store went away: the job is ending
                return


class Liveness:
    """Reads heartbeats and judges members (see the module docstring)."""

    def __init__(self, store: Any, options: FaultToleranceOptions) -> None:
        self.store, self.options = store, options

    def beat(self, member: int) -> _Beat | None:
        """The newest heartbeat of ``member``, or None when it has none (yet)."""
        key = f"{self.options.prefix}/hb/{member}"
        try:
            if not self.store.check([key]):
                return None
            raw = json.loads(self.store.get(key))
        except Exception:  # noqa: BLE001 - an unreadable heartbeat is no heartbeat
            return None
        return _Beat(
            member, raw["incarnation"], raw["pid"], raw["host"], raw["time"], raw["progress"], raw["waiting"]
        )

    def dead_reason(self, member: int, incarnation: str | None = None) -> str | None:
        """Why ``member`` (of ``incarnation``, when given) is dead, or None while it is alive."""
        beat = self.beat(member)
        if beat is None:
            return "no heartbeat"
        if incarnation is not None and beat.incarnation != incarnation:
            return "replaced by a new incarnation"
        now = time.time()
        if beat.host == _HOST and process_gone(beat.pid):
            return f"process {beat.pid} is gone"
        if now - beat.time > self.options.heartbeat_timeout_s:
            return f"heartbeat {now - beat.time:.1f}s old"
        if not beat.waiting and now - beat.progress > self.options.hang_timeout_s:
            return f"no progress for {now - beat.progress:.1f}s"
        return None

    def hung(self, member: int) -> bool:
        """Whether ``member`` is alive but hung: its heartbeat is fresh, its loop is not."""
        beat = self.beat(member)
        now = time.time()
        return (
            beat is not None
            and now - beat.time <= self.options.heartbeat_timeout_s
            and not beat.waiting
            and now - beat.progress > self.options.hang_timeout_s
        )

    def dead(self, members: Iterable[int], incarnations: dict[int, str] | None = None) -> dict[int, str]:
        """``{member: reason}`` for every dead member of ``members``."""
        found = {}
        for member in members:
            reason = self.dead_reason(member, (incarnations or {}).get(member))
            if reason is not None:
                found[member] = reason
        return found
