"""The ``peermem`` backend: intra-host GPU collectives over peer-mapped memory, NCCL for the rest."""

from commlayer.backends.peermem.backend import PeermemBackend

__all__ = ["PeermemBackend"]
