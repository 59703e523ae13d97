"""The ZeRO engine: DeepSpeed's training loop shape, over nothing but ``commlayer.dist``.

::

    engine = commlayer.zero.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()), config=cfg)
    for batch in data:
        loss = engine(*batch)      # forward
        engine.backward(loss)      # scaled by 1/accumulation (and the fp16 loss scale)
        engine.step()              # every micro-step; the optimizer steps on the boundary

Stage 0 keeps everything on every rank and all-reduces gradient buckets; stage 1 shards the
fp32 master weights and optimizer state; stage 2 also shards gradients (reduce-scattered
during backward); stage 3 also shards parameters (see :mod:`.stage3`). The partition group is
the mesh's "dp" group, or "dp_sp" when the mesh has sequence parallelism; with hybrid sharding
(:mod:`.hybrid`) shards are replicated across the ``replicate_dims``. The engine's parts are
built by :mod:`.engine_setup`.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from commlayer import dist
from commlayer.dist import ProcessGroup
from commlayer.mesh import Mesh
from commlayer.zero.checkpoint import load_checkpoint, save_checkpoint
from commlayer.zero.config import BatchSizes, ZeroConfig
from commlayer.zero.engine_setup import build_experts, build_runtime, plan_layout, take_rank0_values
from commlayer.zero.experts import split_experts
from commlayer.zero.hybrid import DataParallelDims, effective_dims, partition_dims
from commlayer.zero.master import MasterShard, param_group_index
from commlayer.zero.replicated import ReplicatedParams
from commlayer.zero.scaler import LossScaler
from commlayer.zero.stage3 import PartitionedParams

__all__ = ["ZeroEngine"]

log = logging.getLogger("commlayer.zero")


class ZeroEngine:
    """Built by :func:`commlayer.zero.initialize`; see the module docstring for the loop."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        config: ZeroConfig,
        batch: BatchSizes,
        mesh: Mesh,
        names: list[str],
        params: list[torch.nn.Parameter],
        dims: DataParallelDims | None = None,
    ) -> None:
        self.module, self.optimizer, self.config, self.batch, self.mesh = (
            model,
            optimizer,
            config,
            batch,
            mesh,
        )
        names, params, expert_names, expert_params = split_experts(names, params, mesh)
        self.param_names, self.params = names, params
        self.param_dtypes = [p.dtype for p in params]
        self.train_dtype = config.train_dtype
        self.global_steps = self.micro_steps = self.skipped_steps = 0
        self.scaler = LossScaler.from_config(config.fp16)
        self.dims = effective_dims(dims or DataParallelDims(partition_dims(mesh), ()), mesh, config.stage)
        self.group: ProcessGroup = mesh[self.dims.shard].group
        self.group_rank, self.group_size = self.group.rank(), self.group.size()
        # Hybrid sharding: shards are replicated across these ranks (see .hybrid).
        self.replica_group = mesh[self.dims.replicate].group if self.dims.replicate else None
        self.replica_rank = self.replica_group.rank() if self.replica_group is not None else 0
        self.data_parallel_group = (
            mesh[self.dims.in_mesh_order(mesh)].group if self.replica_group is not None else self.group
        )
        self.device = params[0].device
        self._last_grad_norm: torch.Tensor | None = None
        self._backward_done = False
        self.layout, self.unit_plans = plan_layout(model, params, config, self.group_size)
        self.master = MasterShard(
            self.layout, self.group_rank if self.layout.shards > 1 else 0, params, self.device
        )
        self.runtime = build_runtime(
            params=params,
            names=names,
            layout=self.layout,
            unit_plans=self.unit_plans,
            master=self.master,
            config=config,
            batch=batch,
            group=self.group,
            replica_group=self.replica_group,
            mesh=mesh,
            dims=self.dims,
        )
        take_rank0_values(
            model, params, self.layout, self.runtime, self.data_parallel_group, self.train_dtype
        )
        group_of = param_group_index(optimizer)
        self.master.attach(optimizer, params, group_of)
        # Expert-parallel MoE weights: a partition of their own over "edp" (see .experts).
        self.experts = build_experts(expert_names, expert_params, mesh, config, batch)
        if self.experts is not None:
            self.experts.master.attach(optimizer, expert_params, group_of, append=True)

    def _partitions(self) -> list[tuple[MasterShard, ReplicatedParams | PartitionedParams]]:
        """(master shard, runtime) of the dense parameters, then of the experts when there are any."""
        parts: list[tuple[MasterShard, ReplicatedParams | PartitionedParams]] = [(self.master, self.runtime)]
        if self.experts is not None:
            parts.append((self.experts.master, self.experts.runtime))
        return parts

    # --- the training loop -------------------------------------------------------------------

    def __call__(self, *inputs: Any, **kwargs: Any) -> Any:
        return self.forward(*inputs, **kwargs)

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        """Run the model; floating-point inputs are cast to the training dtype first."""
        if self.train_dtype != torch.float32:
            inputs, kwargs = _cast(inputs, self.train_dtype), _cast(kwargs, self.train_dtype)
        return self.module(*inputs, **kwargs)

    def is_gradient_accumulation_boundary(self) -> bool:
        """Whether the next ``step()`` applies the optimizer (the last micro-step of a batch)."""
        return (self.micro_steps + 1) % self.batch.gradient_accumulation_steps == 0

    def backward(self, loss: torch.Tensor, retain_graph: bool = False) -> torch.Tensor:
        """Backpropagate ``loss / accumulation_steps`` (times the fp16 loss scale) and reduce."""
        scaled = loss * (self.scaler.scale / self.batch.gradient_accumulation_steps)
        parts = self._partitions()
        for _, runtime in parts:
            runtime.begin_backward(self.is_gradient_accumulation_boundary())
        try:
            scaled.backward(retain_graph=retain_graph)
        finally:
            for _, runtime in parts:
                runtime.finish_backward()
        for master, _ in parts:
            if master.pending and not self.is_gradient_accumulation_boundary():
                # The next micro-step adds to these gradients: accumulate them in fp32 from now on.
                master.fold_pending()
        self._backward_done = True
        return loss

    def step(self) -> None:
        """Count a micro-step; on the accumulation boundary, step the optimizer."""
        if not self._backward_done:
            raise RuntimeError(
                "zero: engine.step() without engine.backward(loss) since the last step; "
                "each micro-step is engine(...), engine.backward(loss), engine.step()"
            )
        self._backward_done = False
        boundary = self.is_gradient_accumulation_boundary()
        self.micro_steps += 1
        if boundary:
            self._optimizer_step()

    def zero_grad(self) -> None:
        """Drop every gradient the engine holds (its partitions' and the master copies')."""
        for master, runtime in self._partitions():
            runtime.zero_grads()
            master.release_grads()

    def _optimizer_step(self) -> None:
        overflow = self.config.fp16.enabled and self._any_rank_overflowed()
        if overflow:
            self.skipped_steps += 1
            log.info(
                "step %d skipped: fp16 gradient overflow at loss scale %g",
                self.global_steps,
                self.scaler.scale,
            )
        else:
            factor = self._gradient_factor()
            for master, _ in self._partitions():
                grads = master.fold_pending()
                if not (isinstance(factor, float) and factor == 1.0):
                    grads.mul_(factor)
                master.link_grads()
            self.optimizer.step()
            for _, runtime in self._partitions():
                runtime.refresh_params()
        self.zero_grad()
        self.scaler = self.scaler.update(overflow)
        self.global_steps += 1
        self._maybe_log()

    def _any_rank_overflowed(self) -> bool:
        flag = self.master.nonfinite_flag()
        group = self.group
        if self.experts is not None:  # experts differ across "ep": agree over all data parallel
            flag = torch.maximum(flag, self.experts.master.nonfinite_flag())
            group = self.experts.data_parallel_group
        if group.size() > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group, async_op=True).wait()
        return bool(flag.item())

    def _gradient_factor(self) -> torch.Tensor | float:
        """Unscale (fp16) and clip to ``gradient_clipping`` by the global norm, without a host sync."""
        unscale = 1.0 / self.scaler.scale
        if self.config.gradient_clipping <= 0:
            return unscale
        squared = self.master.grad_norm_squared()
        if self.layout.shards > 1:
            dist.all_reduce(squared, group=self.group, async_op=True).wait()
        if self.experts is not None:
            experts = self.experts.grad_norm_squared()
            dist.all_reduce(experts, group=self.experts.data_parallel_group, async_op=True).wait()
            squared = squared + experts
        norm = squared.sqrt() * unscale
        self._last_grad_norm = norm
        clip = (self.config.gradient_clipping / (norm + 1e-6)).clamp(max=1.0)
        return clip * unscale

    def _maybe_log(self) -> None:
        every = self.config.steps_per_print
        if every and self.global_steps % every == 0 and dist.get_rank() == 0:
            norm = None if self._last_grad_norm is None else round(float(self._last_grad_norm.item()), 6)
            lr = [group.get("lr") for group in self.optimizer.param_groups]
            log.warning(
                "step=%d skipped=%d lr=%s loss_scale=%g grad_norm=%s",
                self.global_steps,
                self.skipped_steps,
                lr,
                self.scaler.scale,
                norm,
            )

    # --- state -------------------------------------------------------------------------------

    @property
    def loss_scale(self) -> float:
        """The fp16 dynamic loss scale now in force (1.0 without fp16)."""
        return self.scaler.scale

    def get_global_grad_norm(self) -> float | None:
        """The clipped step's global gradient norm (before clipping), when clipping is on."""
        return None if self._last_grad_norm is None else float(self._last_grad_norm.item())

    def train_batch_size(self) -> int:
        """The global batch size: micro-batch x accumulation steps x data-parallel size."""
        return self.batch.train_batch_size

    def train_micro_batch_size_per_gpu(self) -> int:
        """The micro-batch size one rank runs per forward pass."""
        return self.batch.micro_batch_size

    def gradient_accumulation_steps(self) -> int:
        """How many micro-steps make one optimizer step."""
        return self.batch.gradient_accumulation_steps

    def train(self, mode: bool = True) -> ZeroEngine:
        """Put the wrapped module in training mode (or evaluation mode with ``mode=False``).

        Args:
            mode: training (True) or evaluation (False).

        Returns:
            The engine, as ``torch.nn.Module.train`` returns the module.
        """
        self.module.train(mode)
        return self

    def eval(self) -> ZeroEngine:
        """Put the wrapped module in evaluation mode.

        Returns:
            The engine.
        """
        return self.train(False)

    def memory_bytes(self) -> dict[str, int]:
        """Bytes of each buffer the engine holds on this rank right now (activations not included).

        ``params``: the working parameters (stages 0-2: the flat training-dtype buffer; stage 3:
        units gathered now); ``full_grads``: the whole-model gradient buffer (stage 0, or stage 1
        with accumulation); ``master``: the fp32 shard; ``master_grads``: its fp32 gradient plus
        reduced pieces not yet folded (zero between steps); ``optimizer``: the optimizer state.
        """

        def size(tensor: torch.Tensor | None) -> int:
            return 0 if tensor is None else tensor.untyped_storage().nbytes()

        runtime = self.runtime
        if isinstance(runtime, ReplicatedParams):
            params, full_grads = size(runtime.flat), size(runtime.grad_flat)
        else:
            params, full_grads = sum(size(unit.full) for unit in runtime.units), 0
        state = [value for values in self.optimizer.state.values() for value in values.values()]
        optimizer = sum(size(value) for value in state if isinstance(value, torch.Tensor) and value.dim() > 0)
        return {
            "params": params,
            "full_grads": full_grads,
            "master": size(self.master.values),
            "master_grads": self.master.grad_bytes(),
            "optimizer": optimizer,
        }

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's weights (fp32 masters in the original dtypes) and buffers, on CPU.

        Collective: every rank of the partition group must call it; every rank gets the result.
        With expert-parallel MoE layers, the experts are this rank's own (under their local names).
        """
        values = self.runtime.full_values()
        by_id = {id(p): v.to(dtype).cpu() for p, v, dtype in zip(self.params, values, self.param_dtypes)}
        if self.experts is not None:  # this rank's experts, gathered over "edp"
            expert_values = self.experts.runtime.full_values()
            pairs = zip(self.experts.params, expert_values, self.experts.dtypes)
            by_id.update({id(p): v.to(dtype).cpu() for p, v, dtype in pairs})
        state = {}
        for key, value in self.module.state_dict(keep_vars=True).items():
            state[key] = by_id[id(value)] if id(value) in by_id else value.detach().cpu().clone()
        return state

    def save_checkpoint(self, save_dir: str, tag: str | None = None, client_state: dict | None = None) -> str:
        """Write this rank's shards (and, on one replica, the shared state) under ``save_dir/tag``.

        Collective: every rank of the engine's groups calls it.

        Args:
            save_dir: the checkpoint folder.
            tag: the sub-folder; by default ``global_step<N>``.
            client_state: extra picklable state saved with the model and returned by load_checkpoint.

        Returns:
            The path the checkpoint was written to.

        Example::

            >>> engine.save_checkpoint("ckpt")
            'ckpt/global_step10'
        """
        return save_checkpoint(self, save_dir, tag, client_state)

    def load_checkpoint(
        self, load_dir: str, tag: str | None = None, load_optimizer_states: bool = True
    ) -> tuple[str, dict]:
        """Load a checkpoint written by :meth:`save_checkpoint`, resharding it to this run's layout.

        Args:
            load_dir: the checkpoint folder.
            tag: the sub-folder; by default the latest one recorded there.
            load_optimizer_states: also restore the optimizer's state (True by default).

        Returns:
            ``(path, client_state)``: where it loaded from and the state given to save_checkpoint.

        Example::

            >>> path, client_state = engine.load_checkpoint("ckpt")
        """
        return load_checkpoint(self, load_dir, tag, load_optimizer_states)

    def destroy(self) -> None:
        """Remove the engine's hooks from the model (the parameters stay as they are)."""
        for _, runtime in self._partitions():
            runtime.remove_hooks()


def _cast(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, tuple):
        return tuple(_cast(item, dtype) for item in value)
    if isinstance(value, list):
        return [_cast(item, dtype) for item in value]
    if isinstance(value, dict):
        return {key: _cast(item, dtype) for key, item in value.items()}
    return value
