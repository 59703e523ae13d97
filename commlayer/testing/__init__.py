"""Multi-process test harness: every multi-rank test runs its rank bodies through :func:`run_world`.

``run_world(target, world_size, *, backend="gloo", timeout=120.0, launcher="local", env=None, args=())``
runs ``target(*args)`` on each rank of a fresh world (local processes or mpirun) and raises an
AssertionError carrying every failing rank's traceback. See :mod:`commlayer.testing.harness`.
"""

from __future__ import annotations

from commlayer.testing.harness import require_mpirun, run_world
from commlayer.testing.mpi import MpirunError, MpirunPlan, mpirun_plan, mpirun_unavailable_reason

__all__ = [
    "MpirunError",
    "MpirunPlan",
    "mpirun_plan",
    "mpirun_unavailable_reason",
    "require_mpirun",
    "run_world",
]
