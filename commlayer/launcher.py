"""Compatibility name of :mod:`commlayer.launch` (local launch, supervision), which replaced this module."""

from __future__ import annotations

from .launch import (
    TIMEOUT_EXIT_CODE,
    LaunchConfig,
    LaunchResult,
    ProcessOutcome,
    ProcessSpec,
    SuperviseOptions,
    free_port,
    launch,
    pid_running,
    supervise,
)

__all__ = [
    "TIMEOUT_EXIT_CODE",
    "LaunchConfig",
    "LaunchResult",
    "ProcessOutcome",
    "ProcessSpec",
    "SuperviseOptions",
    "free_port",
    "launch",
    "pid_running",
    "supervise",
]
