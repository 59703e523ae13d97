"""The ``peermem`` backend: intra-host GPU collectives over peer-mapped memory, NCCL for the rest."""

from .backend import PeermemBackend

__all__ = ["PeermemBackend"]
