"""Compatibility name of :mod:`commlayer.launch` (local launch, supervision), which replaced this module."""

from __future__ import annotations

from . import launch as _launch
from .launch import *  # the same names under the old module

__all__ = list(_launch.__all__)
