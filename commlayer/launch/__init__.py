"""Launching ranks: on this host (:mod:`.local`), across hosts from a hostfile (:mod:`.multinode`
through :mod:`.commands`' ssh/pdsh/mpirun/srun lines and the per-host :mod:`.agent`), all watched
by :func:`.supervise.supervise`, which stops every process on the first failure.
"""

from __future__ import annotations

from commlayer.launch.local import LaunchConfig, RankPlace, free_port, launch, rank_environment
from commlayer.launch.supervise import (
    TIMEOUT_EXIT_CODE,
    LaunchResult,
    ProcessOutcome,
    ProcessSpec,
    SuperviseOptions,
    pid_running,
    supervise,
)

__all__ = [
    "TIMEOUT_EXIT_CODE",
    "LaunchConfig",
    "LaunchResult",
    "ProcessOutcome",
    "ProcessSpec",
    "RankPlace",
    "SuperviseOptions",
    "free_port",
    "launch",
    "pid_running",
    "rank_environment",
    "supervise",
]
