"""Shared-memory regions that ranks killed mid-job leave in /dev/shm, and their removal.

libfabric's shm provider (Intel MPI, oneCCL over OFI) keeps one region per process in
``/dev/shm/<pid>:<n>:<m>`` and removes it only on a clean exit. Once a killed rank's pid is handed
to a new process (``pid_max`` is often 32768, and threads draw from the same pool), that process
fails in MPI_Init with "OFI EP enable failed (Device or resource busy)". So a survivor removes the
regions of a peer it saw die, a process that abandoned a communicator removes its own at exit,
and tests that kill ranks on purpose clean up after themselves; a test session also clears what
earlier runs' killed processes left (:func:`release_dead_regions`).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from commlayer.core.processes import pid_running

__all__ = [
    "create_mapped",
    "note_local_peers",
    "release_dead_regions",
    "release_job_regions",
    "release_regions_of",
    "release_stale_regions",
]

_SHARED_MEMORY = Path("/dev/shm")
_REGION_NAME = re.compile(r"(\d+):\d+:\d+")


def create_mapped(path: Path | str, nbytes: int) -> mmap.mmap:
    """A new file at ``path`` (which must not exist), readable by this user only, ``nbytes`` long
    and zeroed, mapped shared; the file descriptor is closed, the mapping keeps the memory."""
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(descriptor, nbytes)
        return mmap.mmap(descriptor, nbytes)
    finally:
        os.close(descriptor)


def release_stale_regions(created_after: float, directory: Path = _SHARED_MEMORY) -> list[Path]:
    """Remove regions modified after ``created_after`` (epoch seconds) whose process has exited."""
    return _release(
        directory, lambda pid, entry: not pid_running(pid) and entry.stat().st_mtime >= created_after
    )


def release_dead_regions(directory: Path = _SHARED_MEMORY) -> list[Path]:
    """Remove every region of this user whose process has exited, however old: nothing maps it
    for communication any more, and the next process given that pid would fail in MPI_Init."""
    uid = os.getuid()
    return _release(directory, lambda pid, entry: not pid_running(pid) and entry.stat().st_uid == uid)


# Processes of this job's other ranks on this host (the peer monitor learns them): a rank that
# ends the job with MPI_Abort removes their regions too, since the launcher then kills them
# before they can remove their own (unlinking a region its owner still maps is harmless).
_local_peers: set[int] = set()


def note_local_peers(pids: Iterable[int]) -> None:
    """Remember the pids of this job's other ranks on this host."""
    _local_peers.update(pids)


def release_job_regions() -> list[Path]:
    """Remove this process's regions and those of the job's other ranks on this host: called by a
    rank about to abort the job."""
    return release_regions_of({os.getpid(), *_local_peers})


def release_regions_of(pids: Iterable[int], directory: Path = _SHARED_MEMORY) -> list[Path]:
    """Remove the regions of ``pids`` (exited processes, or this one as it exits)."""
    wanted = set(pids)
    return _release(directory, lambda pid, entry: pid in wanted)


def _release(directory: Path, doomed: Callable[[int, Path], bool]) -> list[Path]:
    removed = []
    with contextlib.suppress(OSError):
        for entry in directory.iterdir():
            match = _REGION_NAME.fullmatch(entry.name)
            if match is None:
                continue
            with contextlib.suppress(OSError):
                if doomed(int(match.group(1)), entry):
                    entry.unlink()
                    removed.append(entry)
    return removed
