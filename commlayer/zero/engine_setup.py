"""Building a :class:`~.engine.ZeroEngine`'s parts: the flat layout of its parameters (gradient
buckets, or stage 3's units), the runtime that holds the working parameters (replicated for
stages 0-2, partitioned for stage 3), the expert shards, and the first broadcast that gives
every rank the first data-parallel rank's values.
"""

from __future__ import annotations

import torch

from commlayer import dist
from commlayer.dist import ProcessGroup
from commlayer.mesh import Mesh
from commlayer.zero.config import BatchSizes, ZeroConfig
from commlayer.zero.experts import ExpertShards
from commlayer.zero.hybrid import DataParallelDims
from commlayer.zero.master import MasterShard
from commlayer.zero.partition import FlatLayout, bucket_indices, build_layout
from commlayer.zero.reducer import GradientReducer
from commlayer.zero.replicated import ReplicatedParams, keeps_full_gradients
from commlayer.zero.stage3 import PartitionedParams
from commlayer.zero.units import UnitPlan, plan_units

__all__ = [
    "ALIGNMENT",
    "MAX_SCRATCH_IN_FLIGHT",
    "build_experts",
    "build_runtime",
    "plan_layout",
    "take_rank0_values",
]

#: Every shard is a multiple of this many elements, so shard boundaries stay vector-aligned.
ALIGNMENT = 64
#: Scratch gradient buckets (stages 2 and 3) reduced at once; more in flight wait for the oldest.
MAX_SCRATCH_IN_FLIGHT = 2


def plan_layout(
    module: torch.nn.Module, params: list[torch.nn.Parameter], config: ZeroConfig, group_size: int
) -> tuple[FlatLayout, list[UnitPlan] | None]:
    """The flat layout of ``params`` and, for stage 3, the units it is made of (else None)."""
    numels = [p.numel() for p in params]
    stage = config.stage
    unit_plans = None
    if stage == 3:
        zero = config.zero_optimization
        unit_plans = plan_units(
            module,
            params,
            zero.stage3_max_unit_numel,
            zero.stage3_min_unit_numel,
            zero.stage3_coalesce_numel,
        )
        groups = [plan.params for plan in unit_plans]
    else:
        # Reverse registration order: roughly the order in which backward produces gradients.
        order = list(reversed(range(len(params))))
        groups = bucket_indices(numels, order, config.zero_optimization.reduce_bucket_size)
    return build_layout(groups, numels, 1 if stage == 0 else group_size, ALIGNMENT), unit_plans


def build_runtime(
    *,
    params: list[torch.nn.Parameter],
    names: list[str],
    layout: FlatLayout,
    unit_plans: list[UnitPlan] | None,
    master: MasterShard,
    config: ZeroConfig,
    batch: BatchSizes,
    group: ProcessGroup,
    replica_group: ProcessGroup | None,
    mesh: Mesh,
    dims: DataParallelDims,
) -> ReplicatedParams | PartitionedParams:
    """The runtime that holds the working parameters, with its gradient reducer over ``group``."""
    zero, stage = config.zero_optimization, config.stage
    full_grads = keeps_full_gradients(stage, batch.gradient_accumulation_steps)
    scratch = None if full_grads else MAX_SCRATCH_IN_FLIGHT
    reducer = GradientReducer(group, master, config.reduce_dtype, scratch, replica_group=replica_group)
    # A second communicator for parameter gathers: ordered independently of the reductions.
    gather_group = mesh[dims.shard].duplicate_group() if stage >= 1 else None
    if stage == 3:
        assert gather_group is not None and unit_plans is not None
        return PartitionedParams(
            params,
            names,
            unit_plans,
            layout,
            master,
            reducer,
            gather_group,
            train_dtype=config.train_dtype,
            prefetch_numel=zero.stage3_prefetch_bucket_size,
        )
    return ReplicatedParams(
        params,
        names,
        layout,
        master,
        reducer,
        gather_group,
        full_grads=full_grads,
        train_dtype=config.train_dtype,
        overlap=zero.overlap,
        allgather_numel=zero.allgather_bucket_size,
    )


def build_experts(
    names: list[str], params: list[torch.nn.Parameter], mesh: Mesh, config: ZeroConfig, batch: BatchSizes
) -> ExpertShards | None:
    """The expert-parallel MoE weights' own partition over "edp", or None without experts."""
    if not params:
        return None
    full_grads = keeps_full_gradients(config.stage, batch.gradient_accumulation_steps)
    scratch = None if full_grads else MAX_SCRATCH_IN_FLIGHT
    return ExpertShards(
        names, params, mesh, config, full_grads=full_grads, scratch=scratch, alignment=ALIGNMENT
    )


def take_rank0_values(
    module: torch.nn.Module,
    params: list[torch.nn.Parameter],
    layout: FlatLayout,
    runtime: ReplicatedParams | PartitionedParams,
    group: ProcessGroup,
    train_dtype: torch.dtype,
) -> None:
    """Broadcast every segment (and buffer) from the first rank of ``group``, then adopt it."""
    source = group.ranks[0]
    device = params[0].device
    for segment in layout.segments:
        full = torch.zeros(segment.padded_numel, dtype=torch.float32, device=device)
        for slot in segment.slots:
            full[slot.offset : slot.offset + slot.numel].copy_(params[slot.param].detach().reshape(-1))
        dist.broadcast(full, src=source, group=group)
        runtime.adopt(segment, full)
    runtime.install()
    for buffer in module.buffers():
        if buffer.is_floating_point():
            buffer.data = buffer.data.to(train_dtype)
        dist.broadcast(buffer.data, src=source, group=group)
