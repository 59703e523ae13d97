"""The errors of fault-tolerant data parallelism."""

from __future__ import annotations

from commlayer.core.errors import CommError

__all__ = ["JobFinishedError", "NoHealthyReplicaError", "StepAbortedError"]


class StepAbortedError(CommError):
    """A step's collectives were abandoned because a member died or hung; the step is retried."""


class NoHealthyReplicaError(CommError):
    """No live member holds the state of some shard: training cannot go on without a restart.

    The last checkpoint written by the job stays loadable; ``commlayer run --max-restarts``
    restarts the world from it.
    """


class JobFinishedError(CommError):
    """The job's members finished every step while this member waited to join."""
