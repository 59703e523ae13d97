"""Flight-recorder dumps: every group's ring of this rank, written as one JSON document.

Dumps are written on request (:func:`dump_flight_recorder`), by the watchdog thread
(:mod:`commlayer.core.watchdog`: on SIGUSR1, a collective's timeout, a peer's death), when an op
fails in communication, and at exit after an uncaught communication error (see
:mod:`commlayer.facade.lifecycle.signal_handlers`). An error raised before any communication (a
bad argument) writes none (:func:`dumps_for`). Each job writes into its own folder,
``$COMMLAYER_TRACE_DIR/<job id>`` (the id agreed at init, :mod:`commlayer.core.job`), so that two
jobs' dumps never mix; ``commlayer trace analyze`` reads the newest job's folder, and the oldest
folders beyond ``$COMMLAYER_KEEP_JOBS`` are removed when a job writes its first dump. A rank
announces its dump once per failure, however many of the failure's paths (the op, the peer's
request, the uncaught error at exit) write it.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

from commlayer.core import health, watchdog
from commlayer.core.boundary import user_facing
from commlayer.core.errors import (
    BackendUnavailableError,
    CheckpointError,
    CollectiveMismatchError,
    RendezvousError,
)
from commlayer.core.flight_recorder import write_dump
from commlayer.core.job import TRACE_DIR_ENV, current_job_id, keep_jobs, prune_job_folders, trace_root
from commlayer.core.metrics import format_duration
from commlayer.facade.groups.group import World, world_or_none

__all__ = [
    "TRACE_DIR_ENV",
    "dump_flight_recorder",
    "dump_on_peer_failure",
    "dumps_for",
    "has_recorded_ops",
    "job_trace_directory",
    "overdue_ops",
    "trace_directory",
]

log = logging.getLogger("commlayer.dist")

_dump_lock = threading.Lock()
# Dumps within this long of the last announced one belong to the same failure: written, not announced.
_SAME_FAILURE_S = 60.0
_last_announced: dict[Path, float] = {}
# What a job folder holds: dumps, and the partial files a dump is written through.
_JOB_FOLDER_FILE = re.compile(r"rank\d+\.json|\.rank\d+\.json\.\d+\.tmp")
_pruned: set[Path] = set()
# Errors raised before any communication: nothing in the rings explains them.
_NOT_COMMUNICATION = (ValueError, TypeError, BackendUnavailableError, CheckpointError, RendezvousError)


def trace_directory() -> Path:
    """The folder of every job's dump folder: ``$COMMLAYER_TRACE_DIR``, else ``<tmp>/commlayer-trace``."""
    return trace_root(os.environ)


def job_trace_directory() -> Path:
    """This job's dump folder: ``trace_directory() / <job id>``."""
    return trace_directory() / current_job_id(os.environ)


def dumps_for(error: BaseException) -> bool:
    """Whether a failure with ``error`` is worth a dump: a failure in communication, not an
    argument, a missing backend or a checkpoint refused before any communication."""
    if isinstance(error, CollectiveMismatchError):
        return True  # found by comparing the ranks' calls: the rings show where
    return not isinstance(error, _NOT_COMMUNICATION)


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
        folder = Path(directory) if directory else job_trace_directory()
        path = write_dump(folder, world.rank, document)
        if directory is None and folder not in _pruned:
            _pruned.add(folder)
            prune_job_folders(folder.parent, keep_jobs(), _is_job_folder, spare=folder)
        now = time.monotonic()
        announce = now - _last_announced.get(path, -_SAME_FAILURE_S) >= _SAME_FAILURE_S
        _last_announced[path] = now
    level = logging.WARNING if announce else logging.DEBUG
    # The error itself is the rank's own next line: the notice names only the cause's kind.
    cause = reason.split(": ", 1)[0]
    log.log(level, "commlayer: flight recorder of rank %d dumped to %s (%s)", world.rank, path, cause)
    return path


def overdue_ops() -> list[tuple[object, str]]:
    """``(key, reason)`` for each group whose oldest running op has outlived the group's timeout
    (the watchdog dumps once per key)."""
    world = world_or_none()
    if world is None:
        return []
    found: list[tuple[object, str]] = []
    for group in [world.default_group, *list(world.groups.values())]:
        late = group.recorder.overdue(group.timeout.total_seconds())
        if late is not None:
            seq, op = late
            limit = format_duration(group.timeout.total_seconds())
            reason = f"timeout: {op} #{seq} on group '{group.name}' still running after the group's timeout of {limit}"
            found.append(((group.name, op, seq), reason))
    return found


def dump_on_peer_failure(failure: health.PeerFailure) -> None:
    """A :mod:`commlayer.core.health` listener: the watchdog dumps this rank when a peer dies,
    if it has communicated (its rings then show what it waits in)."""
    if has_recorded_ops():
        watchdog.request_dump(f"peer rank {failure.rank} failed: {failure.reason}")


def has_recorded_ops() -> bool:
    """Whether any group of this rank recorded an op (an automatic dump of empty rings says nothing)."""
    world = world_or_none()
    if world is None:
        return False
    return any(group.recorder.recorded_any() for group in [world.default_group, *list(world.groups.values())])


def _is_job_folder(folder: Path) -> bool:
    return all(_JOB_FOLDER_FILE.fullmatch(child.name) for child in folder.iterdir())


def _document(world: World, reason: str) -> dict[str, Any]:
    # A copy: the watchdog dumps while the main thread may be creating a group.
    groups = [world.default_group, *list(world.groups.values())]
    return {
        "rank": world.rank,
        "world_size": world.size,
        "pid": os.getpid(),
        "job": current_job_id(os.environ),
        "reason": reason,
        "time": time.time(),
        "monotonic_ns": time.monotonic_ns(),
        "groups": [group.recorder.to_json() for group in groups],
    }
