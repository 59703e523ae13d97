"""Shared-memory regions that killed MPI ranks leave behind (see :mod:`commlayer.shm_regions`)."""

from __future__ import annotations

from ..shm_regions import release_stale_regions

__all__ = ["release_stale_regions"]
