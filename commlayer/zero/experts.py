"""Expert parameters of mixture-of-experts layers under ZeRO: sharded over "edp", not "dp".

The experts of an MoE layer differ across the "ep" group (:class:`commlayer.parallel.MoE`), so
ZeRO cannot shard them over the whole data-parallel group as it does the dense weights. They get
a partition of their own: a flat layout, fp32 master shard and gradient reducer over
``mesh["edp"]`` (the ranks holding the same experts). Their gradients are summed over "edp" and
divided by the data-parallel size -- each expert already saw the tokens of its whole "ep" group,
so that is the average over every data-parallel rank, as for the dense weights.

Stages 0-2 (stage 3 would need per-expert gather units) on meshes without "sp" or hybrid
replication; :func:`check_expert_support` says so before any communication.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from commlayer import dist
from commlayer.dist import ProcessGroup
from commlayer.mesh import Mesh
from commlayer.parallel.moe import is_expert_parameter
from commlayer.zero.config import ZeroConfig, ZeroConfigError
from commlayer.zero.hybrid import DataParallelDims
from commlayer.zero.master import MasterShard
from commlayer.zero.partition import bucket_indices, build_layout
from commlayer.zero.reducer import GradientReducer
from commlayer.zero.replicated import ReplicatedParams

__all__ = ["ExpertShards", "check_expert_support", "split_experts"]


def splits_experts(mesh: Mesh) -> bool:
    """Expert parameters need their own partition only when experts differ across ranks."""
    return mesh.layout.expert_parallel_size > 1


def split_experts(
    names: Sequence[str], params: Sequence[torch.nn.Parameter], mesh: Mesh
) -> tuple[list[str], list[torch.nn.Parameter], list[str], list[torch.nn.Parameter]]:
    """(dense names, dense params, expert names, expert params), registration order kept."""
    expert = [splits_experts(mesh) and is_expert_parameter(p) for p in params]
    dense_names = [n for n, e in zip(names, expert) if not e]
    expert_names = [n for n, e in zip(names, expert) if e]
    return (
        dense_names,
        [p for p, e in zip(params, expert) if not e],
        expert_names,
        [p for p, e in zip(params, expert) if e],
    )


def check_expert_support(
    params: Sequence[torch.nn.Parameter], mesh: Mesh, config: ZeroConfig, dims: DataParallelDims, rank: int
) -> None:
    """Reject what the expert partition does not do, naming what to change (no communication)."""
    if not splits_experts(mesh) or not any(is_expert_parameter(p) for p in params):
        return
    problem = None
    if config.stage == 3:
        problem = "zero_optimization.stage <= 2 (stage 3 does not gather expert parameters)"
    elif dims.replicate or "sp" in mesh.mesh_dim_names and mesh.size("sp") > 1:
        problem = "a mesh without hybrid replicate_dims or an 'sp' dim larger than 1"
    if problem is not None:
        raise ZeroConfigError(
            f"initialize: a model with expert-parallel MoE parameters expected {problem}, received stage "
            f"{config.stage} on {mesh!r} (rank {rank})"
        )


class ExpertShards:
    """The expert partition: layout, master shard, reducer and parameter storage over "edp"."""

    def __init__(
        self,
        names: Sequence[str],
        params: Sequence[torch.nn.Parameter],
        mesh: Mesh,
        config: ZeroConfig,
        *,
        full_grads: bool,
        scratch: int | None,
        alignment: int,
    ) -> None:
        self.names, self.params = list(names), list(params)
        self.dtypes = [p.dtype for p in params]
        self.group: ProcessGroup = mesh["edp"].group
        self.data_parallel_group: ProcessGroup = mesh["dp"].group
        zero, stage = config.zero_optimization, config.stage
        numels = [p.numel() for p in params]
        buckets = bucket_indices(numels, list(reversed(range(len(params)))), zero.reduce_bucket_size)
        self.layout = build_layout(buckets, numels, 1 if stage == 0 else self.group.size(), alignment)
        device = params[0].device
        self.master = MasterShard(
            self.layout, self.group.rank() if self.layout.shards > 1 else 0, params, device
        )
        reducer = GradientReducer(
            self.group, self.master, config.reduce_dtype, scratch, divisor=mesh.size("dp")
        )
        self.runtime = ReplicatedParams(
            params,
            names,
            self.layout,
            self.master,
            reducer,
            mesh["edp"].duplicate_group() if stage >= 1 else None,
            full_grads=full_grads,
            train_dtype=config.train_dtype,
            overlap=zero.overlap,
            allgather_numel=zero.allgather_bucket_size,
        )
        self._take_first_replica_values(device)

    def _take_first_replica_values(self, device: torch.device) -> None:
        """Every replica of an expert starts from the values of the first rank of its "edp" group."""
        for segment in self.layout.segments:
            full = torch.zeros(segment.padded_numel, dtype=torch.float32, device=device)
            for slot in segment.slots:
                full[slot.offset : slot.offset + slot.numel].copy_(
                    self.params[slot.param].detach().reshape(-1)
                )
            dist.broadcast(full, src=self.group.ranks[0], group=self.group)
            self.runtime.adopt(segment, full)
        self.runtime.install()

    def grad_norm_squared(self) -> torch.Tensor:
        """This rank's share of the squared norm, such that summing over "dp" counts each element once."""
        squared = self.master.grad_norm_squared()
        return squared if self.layout.shards > 1 else squared / self.group.size()
