"""commlayer: a pluggable communication-backend framework for PyTorch.

``from commlayer import dist`` is a drop-in for ``import torch.distributed as dist``; backends are
plugins registered under the ``commlayer.backends`` entry-point group or with
:func:`register_backend`.
"""
from __future__ import annotations

from . import dist
from .backend import Backend
from .registry import get_backend_class, list_backends, register_backend, unregister_backend
from .types import Availability, Capabilities, GroupSpec, ReduceOp
from .work import Work

__version__ = "0.1.0"

__all__ = [
    "Availability",
    "Backend",
    "Capabilities",
    "GroupSpec",
    "ReduceOp",
    "Work",
    "__version__",
    "dist",
    "get_backend_class",
    "list_backends",
    "register_backend",
    "unregister_backend",
]
