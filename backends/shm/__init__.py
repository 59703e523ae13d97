"""The ``shm`` backend: collectives through shared memory between the ranks of one host (csrc/shm)."""

from commlayer.backends.shm.backend import ShmBackend
from commlayer.backends.shm.options import ShmOptions
from commlayer.backends.shm.two_level import TwoLevelBackend  # serves groups that span hosts

__all__ = ["ShmBackend", "ShmOptions", "TwoLevelBackend"]
