"""The ``shm`` backend: collectives through shared memory between the ranks of one host (csrc/shm)."""

from .backend import ShmBackend
from .options import ShmOptions

__all__ = ["ShmBackend", "ShmOptions"]
