"""Fault-tolerant data parallelism: keep training when a replica dies.

A job of ``replicas x shards`` members (ZeRO partitions within a replica, replicas across) trains
through per-step commits in the rendezvous store. When a member dies (killed, exited, hung),
the survivors abandon that step's collectives, agree through a quorum in the store on the
complete replicas still alive, build fresh communicators for the new generation and retry the
step with the gradient average over the replicas that contribute. A replacement member, started
in the dead member's slot by ``commlayer run --ft``, receives the newest parameters and optimizer
state from a healthy peer over the backend and joins at the next step. When no live member holds
some shard of the state, every member raises :class:`NoHealthyReplicaError`: restart from the
last checkpoint (:mod:`.checkpoint`). ``examples/fault_tolerant_training.py`` is a whole job::

    manager = Manager(FaultToleranceOptions(shards=2))  # store, member, replicas: the launcher's
    engine = FaultTolerantDataParallel(model, lambda ps: torch.optim.AdamW(ps), manager, stage=2)
    while engine.step < steps:
        engine.train_step(lambda module, step: loss_of(module, step, *manager.slot))
    manager.finish()
"""

from __future__ import annotations

from commlayer.ft.checkpoint import read_parameters
from commlayer.ft.data_parallel import FaultTolerantDataParallel
from commlayer.ft.errors import JobFinishedError, NoHealthyReplicaError, StepAbortedError
from commlayer.ft.manager import Manager, TrainingState
from commlayer.ft.options import FaultToleranceOptions
from commlayer.ft.quorum import Decision, Registration, decide, joinable_replicas

__all__ = [
    "Decision",
    "FaultToleranceOptions",
    "FaultTolerantDataParallel",
    "JobFinishedError",
    "Manager",
    "NoHealthyReplicaError",
    "Registration",
    "StepAbortedError",
    "TrainingState",
    "decide",
    "joinable_replicas",
    "read_parameters",
]
