"""Fault-tolerant data parallelism: ZeRO stages 0-2, sharded within a replica, replicated across.

::

    manager = Manager(FaultToleranceOptions(shards=2))  # under `commlayer run --ft`
    engine = FaultTolerantDataParallel(model, lambda params: torch.optim.AdamW(params), manager, stage=2)
    while engine.step < steps:
        engine.train_step(lambda module, step: loss_of(module, batch(step, manager.slot)))

Parameters live in one flat fp32 buffer. Stage 0 all-reduces gradients over every member and
steps the whole optimizer on each; stages 1 and 2 reduce-scatter gradients within the replica,
all-reduce each shard across the replicas, step the optimizer on the member's shard of the
fp32 master weights, and all-gather the parameters within the replica. The gradient average
divides by the members that contributed, so a step run by fewer replicas is the mean over
theirs. A step whose collectives fail is retried by the survivors (never applied twice).
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Callable
from pathlib import Path

import torch

from commlayer.core.errors import CheckpointError
from commlayer.core.types import ReduceOp
from commlayer.ft import checkpoint
from commlayer.ft.communicators import Generation, standalone_backend
from commlayer.ft.errors import StepAbortedError
from commlayer.ft.manager import Manager

__all__ = ["FaultTolerantDataParallel"]


def _parameters_layout(
    params: list[torch.nn.Parameter], manager: Manager
) -> tuple[torch.dtype, torch.device]:
    """The one dtype and device of ``params``, checked against the Manager's backend."""
    dtypes, devices = {p.dtype for p in params}, {p.device for p in params}
    if len(dtypes) != 1 or len(devices) != 1:
        raise ValueError(
            f"FaultTolerantDataParallel: argument 'model' expected parameters of one dtype on "
            f"one device, received dtypes {sorted(map(str, dtypes))} on {sorted(map(str, devices))} "
            f"(member {manager.member})"
        )
    device = devices.pop()
    backend = standalone_backend(manager.options.backend)
    if device.type not in backend.capabilities.devices:
        raise ValueError(
            f"FaultTolerantDataParallel: argument 'model' expected parameters on a device of backend "
            f"'{backend.name}' ({', '.join(sorted(backend.capabilities.devices))}), received {device} "
            f"(member {manager.member})"
        )
    return dtypes.pop(), device


class FaultTolerantDataParallel:
    """Train ``model`` with ``manager``'s fault tolerance (see the module docstring).

    Args:
        model: the module (CPU parameters of one dtype), initialised alike on every member.
        make_optimizer: builds the optimizer over a list of parameters (the member's master shard).
        manager: this member's :class:`~.manager.Manager`.
        stage: ZeRO stage, 0, 1 or 2 (1 and 2 keep the same shards here: gradients are
            reduce-scattered straight into the member's shard).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        make_optimizer: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer],
        manager: Manager,
        stage: int = 2,
    ) -> None:
        if stage not in (0, 1, 2):
            raise ValueError(
                f"FaultTolerantDataParallel: argument 'stage' expected 0, 1 or 2, received {stage}"
            )
        if manager.sharded != (stage > 0):
            raise ValueError(
                f"FaultTolerantDataParallel: stage {stage} needs a Manager with sharded={stage > 0}, "
                f"received sharded={manager.sharded}"
            )
        self.module, self.manager, self.stage = model, manager, stage
        self.params = [p for p in model.parameters() if p.requires_grad]
        shards = manager.options.shards if stage > 0 else 1
        numel = sum(p.numel() for p in self.params)
        dtype, device = _parameters_layout(self.params, manager)
        self.shard_numel = math.ceil(numel / shards)
        self.flat = torch.zeros(self.shard_numel * shards, dtype=dtype, device=device)
        self._view_params_into_flat()
        self.shard_index = manager.options.slot(manager.member)[1] if stage > 0 else 0
        start = self.shard_index * self.shard_numel
        self.master = torch.nn.Parameter(self.flat[start : start + self.shard_numel].clone())
        self.optimizer = make_optimizer([self.master])
        self.grads = torch.zeros_like(self.flat)
        # A member that starts after the job began holds no state until a peer sends it.
        self._step = -1 if manager.joining_at_start() else 0
        self._gathered: int | None = None
        self.last_contributors: list[int] = []

    @property
    def step(self) -> int:
        """Steps applied so far (the next step to run); -1 before a joining member got state."""
        return self._step

    def _view_params_into_flat(self) -> None:
        offset = 0
        with torch.no_grad():
            for param in self.params:
                n = param.numel()
                self.flat[offset : offset + n].copy_(param.detach().reshape(-1))
                param.data = self.flat[offset : offset + n].view_as(param)
                offset += n

    # --- TrainingState -------------------------------------------------------------------------

    def state_step(self) -> int:
        """Steps applied to the held state; -1 when it holds none (see TrainingState)."""
        return self._step

    def export_state(self) -> bytes:
        """This member's master shard and optimizer state, serialized (see TrainingState)."""
        buffer = io.BytesIO()
        torch.save({"master": self.master.detach(), "optimizer": self.optimizer.state_dict()}, buffer)
        return buffer.getvalue()

    def import_state(self, payload: bytes, step: int) -> None:
        """Take a peer's master shard and optimizer state, at ``step`` (see TrainingState)."""
        state = torch.load(io.BytesIO(payload), map_location=self.flat.device, weights_only=True)
        self.restore(state["master"], state["optimizer"], step)

    def restore(self, master: torch.Tensor, optimizer_state: dict, step: int) -> None:
        """Hold ``master`` (this member's shard) and ``optimizer_state`` after ``step`` steps."""
        with torch.no_grad():
            self.master.copy_(master)
        self.optimizer.load_state_dict(optimizer_state)
        self._step = step
        self._gathered = None  # the parameters are gathered from the shards before the next step

    # --- checkpoints ---------------------------------------------------------------------------

    @property
    def shard_count(self) -> int:
        """How many shards the state is split into (1 for stage 0)."""
        return self.manager.options.shards if self.stage > 0 else 1

    def save_checkpoint(self, directory: str | os.PathLike, keep: int = 2) -> Path | None:
        """Write this member's shard of the state after ``self.step`` steps under ``directory``
        when it is its shard's writer, a member of the first replica that trained the step (no
        collective: call it on every member); returns the file written, or None. The ``keep``
        newest complete checkpoints stay. See :mod:`commlayer.ft.checkpoint`."""
        replica, shard = self.manager.slot
        contributors = self.last_contributors
        if self._step <= 0 or not contributors or replica != contributors[0]:
            return None  # another replica's member writes this shard (or nothing was trained yet)
        if self.shard_count == 1 and shard != 0:
            return None  # replicated state: one member writes it
        payload = {
            "names": self._names(),
            "master": self.master.detach(),
            "optimizer": self.optimizer.state_dict(),
        }
        self.manager.heartbeat.progress()  # writing is progress: peers must not take it for a hang
        written = checkpoint.write_shard(
            directory, self._step, self.shard_index, self.shard_count, payload, keep
        )
        self.manager.heartbeat.progress()
        return written

    def load_checkpoint(self, directory: str | os.PathLike) -> int | None:
        """Resume from the newest complete checkpoint under ``directory``; returns its step, or
        None when there is none or when this member joins a running job (a peer sends it the
        newest state instead).

        Raises:
            CheckpointError: the checkpoint holds another model's parameters.
        """
        if self._step < 0:
            return None
        found = checkpoint.newest_shard(directory, self.shard_index, self.shard_count, self.flat.device)
        if found is None:
            return None
        step, payload, path = found
        if payload.get("format") != checkpoint.FORMAT or payload["names"] != self._names():
            raise CheckpointError(
                f"FaultTolerantDataParallel.load_checkpoint: {path} expected this model's "
                f"{len(self._names())} parameters, received a checkpoint of {len(payload.get('names', []))} "
                f"(member {self.manager.member})"
            )
        self.restore(payload["master"], payload["optimizer"], step)
        return step

    def _names(self) -> list[tuple[str, list[int]]]:
        return [
            (name, list(param.shape)) for name, param in self.module.named_parameters() if param.requires_grad
        ]

    # --- training ------------------------------------------------------------------------------

    def train_step(self, loss_fn: Callable[[torch.nn.Module, int], torch.Tensor]) -> float:
        """Run step ``self.step`` to completion, retrying it on the survivors after a failure.

        ``loss_fn(module, step)`` returns this member's loss for ``step`` (its own micro-batch).
        Returns the loss of the attempt that was applied.
        """
        while True:
            generation = self.manager.ensure_generation(self)
            try:
                self._gather_after_rebuild(generation)
                step = self._step
                self.manager.begin(f"s{step}")
                loss = self._backward(loss_fn, step)
                self._reduce(generation)
                outcome = self.manager.commit(step)
            except StepAbortedError:
                self.manager.abandon()
                continue
            self.last_contributors = outcome["replicas"]
            self._apply(generation, step)
            if outcome["join"]:
                self.manager.abandon()
            return loss

    def _backward(self, loss_fn: Callable[[torch.nn.Module, int], torch.Tensor], step: int) -> float:
        for param in self.params:
            param.grad = None
        loss = loss_fn(self.module, step)
        loss.backward()
        offset = 0
        for param in self.params:
            n = param.numel()
            grad = param.grad if param.grad is not None else torch.zeros_like(param)
            self.grads[offset : offset + n].copy_(grad.reshape(-1))
            offset += n
        self.manager.heartbeat.progress()
        return float(loss.detach())

    def _reduce(self, generation: Generation) -> None:
        run = self.manager.run
        contributors = len(generation.decision.members)  # members of complete replicas
        if self.stage == 0:
            if generation.world is not None:
                run(generation.world, lambda world: world.all_reduce(self.grads, ReduceOp.SUM, async_op=True))
            self.master.grad = self.grads / contributors
            return
        shard = torch.empty(self.shard_numel, dtype=self.flat.dtype, device=self.flat.device)
        start = self.shard_index * self.shard_numel
        group, replicas = generation.shard_group, generation.replica_group
        if group is None:
            shard.copy_(self.grads[start : start + self.shard_numel])
        elif group.backend.capabilities.native_reduce_scatter:
            run(
                group,
                lambda shards: shards.reduce_scatter_tensor(shard, self.grads, ReduceOp.SUM, async_op=True),
            )
        else:  # an all_reduce and a slice anyway, and gloo's Work must be waited to finish
            run(group, lambda shards: shards.all_reduce(self.grads, ReduceOp.SUM, async_op=True))
            shard.copy_(self.grads[start : start + self.shard_numel])
        if replicas is not None:
            run(replicas, lambda across: across.all_reduce(shard, ReduceOp.SUM, async_op=True))
        self.master.grad = shard.div_(contributors)

    def _apply(self, generation: Generation, step: int) -> None:
        self.optimizer.step()
        self.master.grad = None
        self._step = step + 1
        self._gathered = None
        try:
            self.manager.begin(f"s{step}/gather")
            self._gather(generation)
        except StepAbortedError:
            self.manager.abandon()  # the replica lost a member: parameters are gathered again later

    def _gather_after_rebuild(self, generation: Generation) -> None:
        if self._gathered != generation.number:
            self.manager.begin("gather")
            self._gather(generation)

    def _gather(self, generation: Generation) -> None:
        group = generation.shard_group
        if self.stage == 0 or group is None:
            with torch.no_grad():
                self.flat[self.shard_index * self.shard_numel :][: self.shard_numel].copy_(
                    self.master.detach()
                )
        else:
            source = self.master.detach()
            self.manager.run(
                group, lambda shards: shards.all_gather_into_tensor(self.flat, source, async_op=True)
            )
        self._gathered = generation.number
