"""``commlayer run``'s check of the backend choice, before any rank starts.

The choice is ``--backend`` or ``$COMMLAYER_BACKEND``: a name, or a device map such as
``cpu:gloo,cuda:nccl``. A name no installed backend has fails at once, from the entry points
alone (torch is not imported); a backend that cannot run on this host fails with its reason
(this imports it, and torch). One line each, worded as ``init_process_group`` words them
(:mod:`commlayer.core.backend_choice`)::

    commlayer run: --backend 'glo' names no installed backend (did you mean 'gloo'?); installed: ccl, gloo, mpi, shm
    commlayer run: $COMMLAYER_BACKEND 'nccl' cannot run on this host: no CUDA device is visible

The same choice tells how the ranks start: a backend whose ``launcher`` is ``"mpirun"`` (mpi)
has them started by mpirun.
"""

from __future__ import annotations

from importlib import metadata

from commlayer.core import settings
from commlayer.core.backend_choice import unavailable_backend, unknown_backend

__all__ = ["ENTRY_POINT_GROUP", "backend_names", "check_backend", "chosen_backend", "launcher_of"]

ENTRY_POINT_GROUP = "commlayer.backends"  # the registry's group, read here without importing torch


def backend_names(spec: str) -> list[str]:
    """The backends a choice names: ``"gloo"`` -> ``["gloo"]``, ``"cpu:gloo,cuda:nccl"`` -> both."""
    items = [item.strip() for item in spec.lower().split(",")]
    return [item.partition(":")[2].strip() if ":" in item else item for item in items if item]


def check_backend(spec: str, source: str, availability: bool = True) -> str | None:
    """The one-line problem with the choice ``spec`` (named by ``source``, e.g. ``--backend``),
    or None when every backend it names is installed (and, with ``availability``, can run here)."""
    installed = sorted({point.name for point in metadata.entry_points(group=ENTRY_POINT_GROUP)})
    names = backend_names(spec)
    if not names:
        return f"{source} {spec!r} names no backend; installed: {', '.join(installed)}"
    for name in names:
        if name not in installed:
            return unknown_backend(name, installed, source)
    if not availability:
        return None
    from commlayer.contract.registry import availability_of  # imports torch: only for an installed name

    for name in names:
        status = availability_of(name)
        if status is not None and not status:
            return unavailable_backend(name, str(status.reason or ""), source=source)
    return None


def launcher_of(spec: str) -> str:
    """How a world of ``spec``'s backend starts: "mpirun" for a bare name whose backend asks for
    it (mpi), else "local"."""
    names = backend_names(spec)
    if len(names) != 1 or ":" in spec:
        return "local"
    from commlayer.contract.registry import get_backend_class  # imports torch
    from commlayer.core.errors import BackendUnavailableError

    try:
        return get_backend_class(names[0]).launcher
    except BackendUnavailableError:
        return "local"


def chosen_backend(option: str | None) -> tuple[str, str] | None:
    """``(spec, source)``: ``--backend`` when given, else ``$COMMLAYER_BACKEND``, else None."""
    if option:
        return option, "--backend"
    configured = settings.BACKEND.text()
    return (configured, f"${settings.BACKEND.name}") if configured else None
