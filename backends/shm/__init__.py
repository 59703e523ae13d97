"""The ``shm`` backend: collectives through shared memory between the ranks of one host (csrc/shm)."""

from commlayer.backends.shm.backend import ShmBackend
from commlayer.backends.shm.options import ShmOptions

__all__ = ["ShmBackend", "ShmOptions"]
