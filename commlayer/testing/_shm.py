"""Shared-memory regions that killed MPI ranks leave behind (see :mod:`commlayer.fabric_regions`)."""

from __future__ import annotations

from ..fabric_regions import release_stale_regions

__all__ = ["release_stale_regions"]
