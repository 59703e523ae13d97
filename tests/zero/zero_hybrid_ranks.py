"""Hybrid-sharded ZeRO checks, many per spawned world (``run_world(..., 4)`` and at 2, gloo and mpi).

- ``mics_shard_size`` and the mesh spelling (``replicate_dims``), stages 0-3, fp32: the weights
  after 6 AdamW steps (accumulation 2, clipping) equal single-process training within 1e-5;
- each rank's optimizer state covers exactly its shard of its shard group;
- checkpoints saved under one mesh shape load into another (hybrid -> plain, hybrid -> another
  hybrid shape, plain -> hybrid) and train on to the uninterrupted weights;
- bad hybrid arguments raise ZeroConfigError naming them, before any communication.
"""

from __future__ import annotations

import math
import shutil
import sys
import tempfile

import pytest
import torch

from commlayer import dist, zero
from commlayer.mesh import init_mesh
from commlayer.zero import ZeroConfigError

from . import zero_model as common
from .zero_training_ranks import RECIPE, SAVE_AT, check_equal, config

TOLERANCE = 1e-5


def log(message: str) -> None:
    if dist.get_rank() == 0:
        print(message, file=sys.stderr, flush=True)


def hybrid_engine(
    stage: int, shard: int | None = None, mesh_shape: tuple[int, int] | None = None
) -> zero.ZeroEngine:
    """ZeRO sharding over ``shard`` ranks (mics_shard_size), or over a ("node", "dp") mesh's "dp"."""
    world = dist.get_world_size()
    settings = config(RECIPE, world, stage)
    if shard is not None:
        settings["zero_optimization"] = {**settings["zero_optimization"], "mics_shard_size": shard}
    model = common.make_model(RECIPE)
    mesh = init_mesh(mesh_shape, ("node", "dp")) if mesh_shape else None
    replicate = ("node",) if mesh_shape else ()
    return zero.initialize(
        model=model,
        optimizer=common.make_optimizer(model, RECIPE),
        config=settings,
        mesh=mesh,
        replicate_dims=replicate,
    )


def main() -> None:
    torch.set_num_threads(1)  # ranks share 2 cores
    rank, world = dist.get_rank(), dist.get_world_size()
    check_bad_arguments_fail_before_communicating(world)
    expected, _ = common.reference_run(RECIPE)
    variants = [(stage, {"shard": world // 2}) for stage in range(4)]
    variants.append((3, {"mesh_shape": (2, world // 2)}))
    for stage, how in variants:
        engine = hybrid_engine(stage, **how)
        check_shard_sizes(engine, world, stage)
        common.train(engine, RECIPE, rank, world, range(RECIPE.steps))
        check_equal(engine.full_state_dict(), expected, f"hybrid {how} stage {stage} world {world}")
        engine.destroy()
    check_checkpoints_across_mesh_shapes(world, expected)
    dist.barrier()


def check_shard_sizes(engine: zero.ZeroEngine, world: int, stage: int) -> None:
    """Shards split the model over the shard group only; replicas hold the same shard."""
    shard_ranks = engine.group_size
    total = sum(math.prod(shape) for shape in engine.master.shapes)
    owned = torch.tensor([sum(f.numel for f in engine.master.fragments)], dtype=torch.int64)
    dist.all_reduce(owned, group=engine.group)
    expected_total = total * (shard_ranks if stage == 0 else 1)
    assert owned.item() == expected_total, (owned.item(), expected_total)
    if stage > 0:
        replicas = world // shard_ranks
        assert engine.layout.shards == shard_ranks and (engine.replica_group is None) == (replicas == 1)
        assert engine.master.values.numel() >= math.ceil(total / shard_ranks)


def check_checkpoints_across_mesh_shapes(world: int, expected: dict[str, torch.Tensor]) -> None:
    rank = dist.get_rank()
    holder = [tempfile.mkdtemp(prefix="hybrid-") if rank == 0 else ""]
    dist.broadcast_object_list(holder, src=0)
    directory = holder[0]
    saves = {"hybrid": lambda: hybrid_engine(3, shard=world // 2), "plain": lambda: hybrid_engine(1)}
    for tag, build in saves.items():
        engine = build()
        common.train(engine, RECIPE, rank, world, range(SAVE_AT))
        engine.save_checkpoint(directory, tag=tag)
        engine.destroy()
    loads = [
        ("hybrid", lambda: hybrid_engine(2)),  # hybrid -> plain
        ("hybrid", lambda: hybrid_engine(1, shard=1)),  # -> every rank a replica
        ("hybrid", lambda: hybrid_engine(3, mesh_shape=(world // 2, 2))),  # -> another mesh shape
        ("plain", lambda: hybrid_engine(2, shard=world // 2)),  # plain -> hybrid
    ]
    for tag, build in loads:
        engine = build()
        engine.load_checkpoint(directory, tag=tag)
        assert engine.global_steps == SAVE_AT
        common.train(engine, RECIPE, rank, world, range(SAVE_AT, RECIPE.steps))
        check_equal(
            engine.full_state_dict(),
            expected,
            f"checkpoint '{tag}' resumed on shard group {engine.group_size}",
        )
        engine.destroy()
    dist.barrier()
    if rank == 0:
        shutil.rmtree(directory)


def check_bad_arguments_fail_before_communicating(world: int) -> None:
    model = common.make_model(RECIPE)
    optimizer = common.make_optimizer(model, RECIPE)
    base = config(RECIPE, world, 3)

    def with_shard(size: int) -> dict:
        return {**base, "zero_optimization": {**base["zero_optimization"], "mics_shard_size": size}}

    with pytest.raises(ZeroConfigError, match=r"mics_shard_size expected a divisor of the world size"):
        zero.initialize(model=model, optimizer=optimizer, config=with_shard(world + 1))
    with pytest.raises(ZeroConfigError, match=r"mics_shard_size must be a positive number of ranks"):
        zero.initialize(model=model, optimizer=optimizer, config=with_shard(0))
    with pytest.raises(ZeroConfigError, match=r"argument 'replicate_dims' expected distinct dims"):
        zero.initialize(model=model, optimizer=optimizer, config=base, replicate_dims=("node",))
    mesh = init_mesh((1, world), ("node", "dp"))
    with pytest.raises(ZeroConfigError, match=r"argument 'replicate_dims' .* received \('dp',\)"):
        zero.initialize(model=model, optimizer=optimizer, config=base, mesh=mesh, replicate_dims=("dp",))
    with pytest.raises(
        ZeroConfigError, match=r"argument 'mesh' expected None when zero_optimization.mics_shard_size"
    ):
        zero.initialize(model=model, optimizer=optimizer, config=with_shard(1), mesh=mesh)
    total = torch.ones(1)
    dist.all_reduce(total)
    assert total.item() == world
    log("hybrid: bad arguments raised before communicating")
