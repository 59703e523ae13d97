"""Shared-memory regions that killed MPI ranks leave behind, and their removal.

libfabric's shm provider (Intel MPI, oneCCL over OFI) keeps one region per process in
``/dev/shm/<pid>:<n>:<m>`` and removes it only on a clean exit. Once a killed rank's pid is handed
to a new process (``pid_max`` is often 32768, and threads draw from the same pool), that process
fails in MPI_Init with "OFI EP enable failed (Device or resource busy)". Tests that kill ranks on
purpose therefore clean up after themselves.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

from ..launcher import pid_running

__all__ = ["release_stale_regions"]

_SHARED_MEMORY = Path("/dev/shm")
_REGION_NAME = re.compile(r"(\d+):\d+:\d+")


def release_stale_regions(created_after: float, directory: Path = _SHARED_MEMORY) -> list[Path]:
    """Remove regions modified after ``created_after`` (epoch seconds) whose process has exited."""
    removed = []
    with contextlib.suppress(OSError):
        for entry in directory.iterdir():
            match = _REGION_NAME.fullmatch(entry.name)
            if match is None or pid_running(int(match.group(1))):
                continue
            with contextlib.suppress(OSError):
                if entry.stat().st_mtime >= created_after:
                    entry.unlink()
                    removed.append(entry)
    return removed
