"""ZeRO data parallelism (stages 0-3) over ``commlayer.dist`` only: runs on gloo, mpi, ccl, nccl.

::

    from commlayer import dist, zero
    dist.init_process_group()
    engine = zero.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()),
                             config={"train_micro_batch_size_per_gpu": 8, "bf16": {"enabled": True},
                                     "zero_optimization": {"stage": 2}})

The config takes DeepSpeed's keys (see :mod:`.config`); checkpoints are sharded per rank and
load at any world size, or into a plain model with :func:`consolidated_state_dict`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from commlayer import dist
from commlayer.core.errors import NotInitializedError, missing_extra

try:  # the config is checked with pydantic, commlayer's optional "zero" part
    import pydantic  # noqa: F401
except ModuleNotFoundError as missing:
    raise missing_extra(missing, "zero", "commlayer.zero") from None

from commlayer.mesh import Mesh, init_mesh
from commlayer.zero.checkpoint import consolidated_state_dict
from commlayer.zero.checks import check_model_and_optimizer
from commlayer.zero.config import ZeroConfig, ZeroConfigError, load_config, resolve_batch_sizes
from commlayer.zero.engine import ZeroEngine
from commlayer.zero.experts import check_expert_support
from commlayer.zero.hybrid import plan_data_parallel

__all__ = [
    "ZeroConfig",
    "ZeroConfigError",
    "ZeroEngine",
    "consolidated_state_dict",
    "initialize",
    "load_config",
]


def initialize(
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    config: ZeroConfig | dict[str, Any] | str | Path | None = None,
    mesh: Mesh | None = None,
    *,
    replicate_dims: Sequence[str] = (),
) -> ZeroEngine:
    """Wrap ``model`` and ``optimizer`` in a ZeRO engine (collective over the world).

    ``mesh`` defaults to a 1-D "dp" mesh over the whole world. ZeRO shards over its "dp" dim
    (with "sp" when present); ``replicate_dims`` names further mesh dims to replicate across
    (hybrid sharding, see :mod:`.hybrid`; ``zero_optimization.mics_shard_size`` is the config
    spelling). Config, model, optimizer and mesh are all checked before the first collective,
    so bad input fails alike on every rank.
    """
    if not dist.is_initialized():
        raise NotInitializedError("zero.initialize: call commlayer.dist.init_process_group() first")
    rank, world = dist.get_rank(), dist.get_world_size()
    if config is None:
        raise ZeroConfigError(
            f"zero.initialize: argument 'config' expected a dict or a JSON file path, received None (rank {rank})"
        )
    checked = load_config(config)
    names, params = check_model_and_optimizer(model, optimizer, checked, rank)
    if mesh is not None and "dp" not in mesh.mesh_dim_names:
        raise ZeroConfigError(
            f"zero.initialize: argument 'mesh' expected a mesh with a 'dp' dim, received {mesh!r} (rank {rank})"
        )
    dims, mics_shape = plan_data_parallel(checked, mesh, replicate_dims, world, rank)
    if mesh is not None:
        check_expert_support(params, mesh, checked, dims, rank)
    batch = resolve_batch_sizes(checked, dims.batch_ranks(mesh) if mesh is not None else world)
    if mics_shape is not None:
        mesh = init_mesh(mics_shape, ("replicate", "dp"))
    elif mesh is None:
        mesh = init_mesh((world,), ("dp",))
    assert isinstance(model, torch.nn.Module) and isinstance(optimizer, torch.optim.Optimizer)
    return ZeroEngine(model, optimizer, checked, batch, mesh, names, params, dims)
