"""commlayer: a pluggable communication-backend framework for PyTorch.

``from commlayer import dist`` is a drop-in for ``import torch.distributed as dist``; backends are
plugins registered under the ``commlayer.backends`` entry-point group or with
:func:`register_backend`.

Attributes load on first use (PEP 562), so ``commlayer run`` and the launcher-side tools start
without importing torch; only the ranks pay for it.
"""

from __future__ import annotations

import importlib
from importlib import metadata
from typing import TYPE_CHECKING, Any

try:
    __version__ = metadata.version("commlayer")  # pyproject.toml's, as installed
except metadata.PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

_LAZY = {
    "dist": ("commlayer.dist", None),
    "mesh": ("commlayer.mesh", None),
    "parallel": ("commlayer.parallel", None),
    "zero": ("commlayer.zero", None),
    "Backend": ("commlayer.contract.backend", "Backend"),
    "get_backend_class": ("commlayer.contract.registry", "get_backend_class"),
    "list_backends": ("commlayer.contract.registry", "list_backends"),
    "register_backend": ("commlayer.contract.registry", "register_backend"),
    "unregister_backend": ("commlayer.contract.registry", "unregister_backend"),
    "Availability": ("commlayer.core.types", "Availability"),
    "Capabilities": ("commlayer.core.types", "Capabilities"),
    "GroupSpec": ("commlayer.core.types", "GroupSpec"),
    "ReduceOp": ("commlayer.core.types", "ReduceOp"),
    "Work": ("commlayer.core.work", "Work"),
    "Window": ("commlayer.windows", "Window"),
    "window": ("commlayer.windows", "window"),
}

__all__ = ["__version__", *sorted(_LAZY)]  # noqa: PLE0604 - the lazy names are strings

if TYPE_CHECKING:
    from commlayer import dist, mesh, parallel, zero
    from commlayer.contract.backend import Backend
    from commlayer.contract.registry import (
        get_backend_class,
        list_backends,
        register_backend,
        unregister_backend,
    )
    from commlayer.core.types import Availability, Capabilities, GroupSpec, ReduceOp
    from commlayer.core.work import Work
    from commlayer.windows import Window, window


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'commlayer' has no attribute {name!r}")
    module_name, attribute = _LAZY[name]
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
