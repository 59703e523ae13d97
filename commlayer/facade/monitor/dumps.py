"""Flight-recorder dumps: every group's ring of this rank, written as one JSON document.

Dumps are written on request (:func:`dump_flight_recorder`), on SIGUSR1, when an op fails with a
commlayer error, and at exit after an uncaught commlayer error (see :mod:`commlayer.facade.lifecycle.signal_handlers`). Each job writes into its own
folder, ``$COMMLAYER_TRACE_DIR/<job id>`` (:mod:`commlayer.core.job`), so that two jobs' dumps
never mix; ``commlayer trace analyze`` reads the newest job's folder. A rank announces its dump
once per failure, however many of the failure's paths (the op, the peer's request, the uncaught
error at exit) write it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from commlayer.core.boundary import user_facing
from commlayer.core.flight_recorder import write_dump
from commlayer.core.job import TRACE_DIR_ENV, job_id, trace_root
from commlayer.facade.groups.group import World, world_or_none

__all__ = ["TRACE_DIR_ENV", "dump_flight_recorder", "job_trace_directory", "trace_directory"]

log = logging.getLogger("commlayer.dist")

_dump_lock = threading.Lock()
# Dumps within this long of the last announced one belong to the same failure: written, not announced.
_SAME_FAILURE_S = 60.0
_last_announced: dict[Path, float] = {}


def trace_directory() -> Path:
    """The folder of every job's dump folder: ``$COMMLAYER_TRACE_DIR``, else ``<tmp>/commlayer-trace``."""
    return trace_root(os.environ)


def job_trace_directory() -> Path:
    """This job's dump folder: ``trace_directory() / <job id>``."""
    return trace_directory() / job_id(os.environ)


@user_facing
def dump_flight_recorder(
    directory: str | os.PathLike[str] | None = None, reason: str = "request"
) -> Path | None:
    """Write this rank's flight-recorder rings as ``DIR/rank<N>.json``; returns the file (None
    before init). ``DIR`` defaults to this job's folder, ``$COMMLAYER_TRACE_DIR/<job id>``
    (``$COMMLAYER_TRACE_DIR`` defaults to ``<tmp>/commlayer-trace``). Read the dumps of every
    rank with ``commlayer trace analyze``."""
    world = world_or_none()
    if world is None:
        return None
    with _dump_lock:
        document = _document(world, reason)
        path = write_dump(directory or job_trace_directory(), world.rank, document)
        now = time.monotonic()
        announce = now - _last_announced.get(path, -_SAME_FAILURE_S) >= _SAME_FAILURE_S
        _last_announced[path] = now
    level = logging.WARNING if announce else logging.DEBUG
    # The error itself is the rank's own next line: the notice names only the cause's kind.
    cause = reason.split(": ", 1)[0]
    log.log(level, "commlayer: flight recorder of rank %d dumped to %s (%s)", world.rank, path, cause)
    return path


def _document(world: World, reason: str) -> dict[str, Any]:
    groups = [world.default_group, *world.groups.values()]
    return {
        "rank": world.rank,
        "world_size": world.size,
        "pid": os.getpid(),
        "job": job_id(os.environ),
        "reason": reason,
        "time": time.time(),
        "monotonic_ns": time.monotonic_ns(),
        "groups": [group.recorder.to_json() for group in groups],
    }
