"""Facade extensions found through entry points, so the facade never imports the layers above it.

An extension is a module registered under the ``commlayer.dist_extensions`` entry-point group,
the way backends register under ``commlayer.backends``::

    [project.entry-points."commlayer.dist_extensions"]
    comms_logger = "commlayer.comms_logger"

It is reachable as ``dist.<name>`` (imported on first access), and ``init_process_group``
imports every extension last, calling its ``on_init_process_group()`` where it defines one: the
comms logger enables itself there when ``$COMMLAYER_COMMS_LOGGER`` asks for it, and
:mod:`commlayer.hooks` gives every group ``register_pre_hook`` by being imported (see
:func:`commlayer.facade.groups.group.extend_groups`).
"""

from __future__ import annotations

import functools
from importlib import metadata
from types import ModuleType

__all__ = ["GROUP", "load", "names", "run_init_hooks"]

GROUP = "commlayer.dist_extensions"


@functools.cache
def _entry_points() -> dict[str, metadata.EntryPoint]:
    return {point.name: point for point in metadata.entry_points(group=GROUP)}


def names() -> list[str]:
    """The installed extensions' names."""
    return sorted(_entry_points())


def load(name: str) -> ModuleType | None:
    """The extension module registered as ``name``, or None if there is none."""
    point = _entry_points().get(name)
    return None if point is None else point.load()


def run_init_hooks() -> None:
    """Call every extension's ``on_init_process_group()``, in name order."""
    for name in names():
        hook = getattr(load(name), "on_init_process_group", None)
        if hook is not None:
            hook()
