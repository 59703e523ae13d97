"""Fault-tolerant data parallelism: keep training when a replica dies.

A job of ``replicas x shards`` members (ZeRO partitions within a replica, replicas across) trains
through per-step commits in the rendezvous store. When a member dies (killed, exited, hung),
the survivors abandon that step's collectives, agree through a quorum in the store on the
complete replicas still alive, build fresh communicators for the new generation and retry the
step with the gradient average over the replicas that contribute. A replacement member, started
by hand or by a launcher, receives the newest parameters and optimizer state from a healthy
peer over the backend and joins at the next step. When no live member holds some shard of the
state, every member raises :class:`NoHealthyReplicaError`: restart from the last checkpoint.

::

    from commlayer.ft import FaultToleranceOptions, FaultTolerantDataParallel, Manager
    options = FaultToleranceOptions(replicas=2, shards=2, backend="gloo")
    manager = Manager(store, member=replica * 2 + shard, options=options, sharded=True)
    engine = FaultTolerantDataParallel(model, lambda ps: torch.optim.AdamW(ps), manager, stage=2)
    while engine.step < steps:
        engine.train_step(lambda module, step: loss_of(module, step))
    manager.finish()
"""

from __future__ import annotations

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
]
