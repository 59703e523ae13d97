"""Flight-recorder dumps: every group's ring of this rank, written as one JSON document.

Dumps are written on request (:func:`dump_flight_recorder`), on SIGUSR1, when an op fails with a
commlayer error, and at exit after an uncaught commlayer error (see :mod:`.signal_handlers`). Read
the dumps of every rank with ``commlayer trace analyze DIR``.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from .. import settings
from ..flight_recorder import write_dump
from .groups import World, world_or_none

__all__ = ["TRACE_DIR_ENV", "dump_flight_recorder", "trace_directory"]

log = logging.getLogger("commlayer.dist")

TRACE_DIR_ENV = settings.TRACE_DIR.name
_dump_lock = threading.Lock()


def trace_directory() -> Path:
    """``$COMMLAYER_TRACE_DIR``, else ``<tmp>/commlayer-trace``."""
    configured = settings.TRACE_DIR.text()
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
