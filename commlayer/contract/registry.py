"""Backend registry: the ``commlayer.backends`` entry points plus run-time registrations.

Entry points are read once, lazily, on the first lookup, and a backend's module is imported only
when that backend is asked for, so ``import commlayer`` never pays for mpi4py or oneCCL.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata

from commlayer.contract.backend import Backend
from commlayer.core.backend_choice import unavailable_backend, unknown_backend
from commlayer.core.errors import BackendUnavailableError
from commlayer.core.types import Availability

__all__ = [
    "ENTRY_POINT_GROUP",
    "BackendInfo",
    "availability_of",
    "get_backend_class",
    "list_backends",
    "register_backend",
    "unregister_backend",
]

ENTRY_POINT_GROUP = "commlayer.backends"


@dataclass(frozen=True)
class _Entry:
    name: str
    origin: str  # "module:Class" of an entry point, or "register_backend()"
    load: Callable[[], type[Backend]]


@dataclass(frozen=True)
class BackendInfo:
    """One row of :func:`list_backends`."""

    name: str
    origin: str
    availability: Availability


_lock = threading.Lock()
_entries: dict[str, _Entry] = {}
_entry_points_loaded = False


def register_backend(name: str, backend_class: type[Backend]) -> None:
    """Register ``backend_class`` under ``name`` at run time; a taken name raises ValueError."""
    if not (isinstance(backend_class, type) and issubclass(backend_class, Backend)):
        raise TypeError(f"register_backend: expected a Backend subclass for '{name}', got {backend_class!r}")
    _add(
        _Entry(
            name,
            f"register_backend({backend_class.__module__}.{backend_class.__qualname__})",
            lambda: backend_class,
        )
    )


def unregister_backend(name: str) -> None:
    """Remove a run-time or entry-point registration (tests use it to undo theirs)."""
    _ensure_entry_points()
    with _lock:
        _entries.pop(name, None)


def get_backend_class(name: str) -> type[Backend]:
    """The class registered as ``name``, checked available; otherwise a one-line error saying why
    (:mod:`commlayer.core.backend_choice`: the closest installed name, or the backend's reason)."""
    _ensure_entry_points()
    entry = _entries.get(name)
    if entry is None:
        with _lock:
            known = list(_entries)
        raise BackendUnavailableError(unknown_backend(name, known))
    backend_class, availability = _load(entry)
    if backend_class is None or not availability:
        message = unavailable_backend(name, availability.reason, availability.install_hint)
        raise BackendUnavailableError(message)
    return backend_class


def availability_of(name: str) -> Availability | None:
    """Whether the backend registered as ``name`` can run here (importing it alone); None if unknown."""
    _ensure_entry_points()
    entry = _entries.get(name)
    return None if entry is None else _load(entry)[1]


def list_backends() -> list[BackendInfo]:
    """Every installed backend with its availability, sorted by name."""
    _ensure_entry_points()
    with _lock:
        entries = sorted(_entries.values(), key=lambda entry: entry.name)
    return [BackendInfo(entry.name, entry.origin, _load(entry)[1]) for entry in entries]


def _load(entry: _Entry) -> tuple[type[Backend] | None, Availability]:
    try:
        backend_class = entry.load()
    except Exception as error:  # noqa: BLE001 - a broken plugin must not break the others
        return None, Availability.no(f"importing {entry.origin} failed: {type(error).__name__}: {error}")
    try:
        return backend_class, backend_class.is_available()
    except Exception as error:  # noqa: BLE001
        return backend_class, Availability.no(f"is_available() raised {type(error).__name__}: {error}")


def _add(entry: _Entry) -> None:
    _ensure_entry_points()
    with _lock:
        taken = _entries.get(entry.name)
        if taken is not None:
            raise ValueError(f"backend '{entry.name}' is already registered by {taken.origin}")
        _entries[entry.name] = entry


def _ensure_entry_points() -> None:
    global _entry_points_loaded
    with _lock:
        if _entry_points_loaded:
            return
        for point in metadata.entry_points(group=ENTRY_POINT_GROUP):
            _add_entry_point(point)
        _entry_points_loaded = True


def _add_entry_point(point: metadata.EntryPoint) -> None:
    taken = _entries.get(point.name)
    if taken is not None and taken.origin != point.value:
        raise ValueError(f"backend '{point.name}' is provided twice: by {taken.origin} and by {point.value}")
    _entries[point.name] = _Entry(point.name, point.value, point.load)
