"""The one-line messages about a backend choice that cannot be served, written once.

``init_process_group`` raises them (:func:`commlayer.contract.registry.get_backend_class`), and
``commlayer run`` prints them before it starts any rank, naming where the choice came from
(:mod:`commlayer.launch.backend_check`); this module imports no torch, so the launcher can word a
problem from the entry points alone. For example::

    backend 'glo' names no installed backend (did you mean 'gloo'?); installed: ccl, gloo, mpi, shm
    backend 'nccl' cannot run on this host: no CUDA device is visible (torch.cuda.is_available() is False)
    commlayer run: --backend 'glo' names no installed backend (did you mean 'gloo'?); installed: ...

``commlayer backends`` lists every installed backend with its reason.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["did_you_mean", "unavailable_backend", "unknown_backend"]


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``" (did you mean 'nccl'?)"`` for a name close to a known one (difflib), else ``""``."""
    close = difflib.get_close_matches(str(name).lower(), sorted(known), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def unknown_backend(name: str, installed: Iterable[str], source: str = "backend") -> str:
    """A name no installed backend has, with the closest one and the installed names; ``source``
    says where the name came from (``--backend``, ``$COMMLAYER_BACKEND``)."""
    names = sorted(installed)
    return f"{source} {name!r} names no installed backend{did_you_mean(name, names)}; installed: {', '.join(names)}"


def unavailable_backend(name: str, reason: str, install_hint: str = "", source: str = "backend") -> str:
    """An installed backend that cannot run on this host, with its reason (first line) and fix."""
    first_line = (reason or "it reported no reason").strip().splitlines()[0]
    hint = f"; install: {install_hint}" if install_hint else ""
    return f"{source} {name!r} cannot run on this host: {first_line}{hint}"
