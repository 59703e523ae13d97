"""The ``mpi`` backend: MPI through mpi4py, for jobs started by ``mpirun``.

Importing this package never imports mpi4py's MPI module (that initialises MPI); the backend loads
it in ``create_world`` and :func:`discovery.exchange_master_address` when the rendezvous needs it.
"""

from __future__ import annotations

from commlayer.backends.mpi.backend import MpiBackend
from commlayer.backends.mpi.options import MpiOptions

__all__ = ["MpiBackend", "MpiOptions"]
