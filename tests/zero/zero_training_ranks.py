"""ZeRO checks run inside one spawned world each (CI has 2 cores: one spawn, many checks).

``run_world("tests.zero.zero_training_ranks:world4", 4, args=[directory])`` then ``world2`` at size 2:

- every stage, fp32: the weights after 6 AdamW steps (accumulation 2, clipping) equal
  single-process training on the same global batch within 1e-5;
- each rank's optimizer state covers exactly its shard: ceil(total / N) plus alignment padding;
- world 4 saves checkpoints mid-run and the weights of the uninterrupted run; world 2 loads
  them (resharding 4 -> 2, and stage 3 -> stage 1) and trains on to the same weights;
- world 2 also checks stage 3 with the blocks coalesced into one unit, the bf16 loss curve, fp16
  overflow skipping agreed by all ranks, errors raised before any communication, stages 1-2
  without accumulation, and the bytes each rank holds (working copy, full gradient or not,
  master, fp32 gradient or pieces, AdamW state) against their closed form.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from commlayer import dist, zero
from commlayer.core.errors import InvalidArgumentError
from commlayer.zero.engine_setup import ALIGNMENT

from . import zero_model as common
from .zero_model import Recipe

TOLERANCE = 1e-5
RECIPE = Recipe(steps=6)
SAVE_AT = 3


def config(recipe: Recipe, world: int, stage: int, **extra: object) -> dict:
    return {
        "train_batch_size": recipe.global_micro * recipe.accumulation,
        "train_micro_batch_size_per_gpu": recipe.micro_batch(world),
        "gradient_clipping": recipe.clip,
        # Small buckets and units, so the tiny model spans many segments and units.
        "zero_optimization": {
            "stage": stage,
            "reduce_bucket_size": 3000,
            "allgather_bucket_size": 7000,
            "stage3_max_unit_numel": 5000,
            "stage3_min_unit_numel": 100,
            "stage3_prefetch_bucket_size": 6000,
        },
        **extra,
    }


def engine_for(recipe: Recipe, world: int, stage: int, **extra: object) -> zero.ZeroEngine:
    model = common.make_model(recipe)
    return zero.initialize(
        model=model,
        optimizer=common.make_optimizer(model, recipe),
        config=config(recipe, world, stage, **extra),
    )


def log(message: str) -> None:
    if dist.get_rank() == 0:
        print(message, file=sys.stderr, flush=True)


# --- world 4 ---------------------------------------------------------------------------------


def world4(directory: str) -> None:
    torch.set_num_threads(1)  # ranks share 2 cores: spinning intra-op threads would starve each other
    rank, world = dist.get_rank(), dist.get_world_size()
    expected, _ = common.reference_run(RECIPE)
    for stage in range(4):
        check_state_bytes(stage, world)
        engine = engine_for(RECIPE, world, stage)
        common.train(engine, RECIPE, rank, world, range(SAVE_AT))
        if stage >= 2:
            engine.save_checkpoint(directory, tag=f"stage{stage}")
            saved = engine.full_state_dict()
        common.train(engine, RECIPE, rank, world, range(SAVE_AT, RECIPE.steps))
        final = engine.full_state_dict()  # collective: every rank calls it
        check_equal(final, expected, f"world {world} stage {stage} fp32")
        if stage >= 2:
            check_plain_model_loads(directory, f"stage{stage}", saved)
            if rank == 0:
                torch.save(final, Path(directory) / f"uninterrupted_stage{stage}.pt")
    dist.barrier()


def check_equal(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], what: str) -> None:
    difference, key = common.max_difference(actual, expected)
    assert difference <= TOLERANCE, f"{what}: '{key}' differs by {difference:.3g} (> {TOLERANCE})"
    log(f"{what}: max difference {difference:.3g} ('{key}')")


def check_state_bytes(stage: int, world: int) -> None:
    """Optimizer state per rank: its shard only. Padding is at most one alignment per segment."""
    engine = engine_for(RECIPE, world, stage)
    total = sum(math.prod(shape) for shape in engine.master.shapes)  # stage 3 params are empty now
    shards = 1 if stage == 0 else world
    layout = engine.layout
    shard = sum(math.ceil(s.numel / (shards * ALIGNMENT)) * ALIGNMENT for s in layout.segments)
    assert engine.master.values.numel() == layout.shard_numel == shard
    assert math.ceil(total / shards) <= shard <= math.ceil(total / shards) + len(layout.segments) * ALIGNMENT
    owned = sum(f.numel for f in engine.master.fragments)  # the real elements this rank steps
    counts = torch.tensor([owned], dtype=torch.int64)
    dist.all_reduce(counts)
    assert counts.item() == total * (world if stage == 0 else 1), (counts.item(), total)
    assert owned <= shard
    # One step creates AdamW's state; 'step' is a scalar, exp_avg and exp_avg_sq are per element.
    common.train(engine, RECIPE, dist.get_rank(), world, range(1))
    state_bytes = sum(
        v.numel() * v.element_size()
        for s in engine.optimizer.state.values()
        for k, v in s.items()
        if k != "step"
    )
    assert state_bytes == 2 * 4 * owned, (state_bytes, owned)


def check_plain_model_loads(directory: str, tag: str, saved: dict[str, torch.Tensor]) -> None:
    plain = common.make_model(RECIPE, seed=99)
    plain.load_state_dict(zero.consolidated_state_dict(directory, tag))
    assert common.max_difference(plain.state_dict(), saved)[0] == 0.0


# --- world 2 ---------------------------------------------------------------------------------


def world2(directory: str) -> None:
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    check_errors_before_communication(world)
    expected, reference_losses = common.reference_run(RECIPE)
    for stage in range(4):
        engine = engine_for(RECIPE, world, stage)
        common.train(engine, RECIPE, rank, world, range(RECIPE.steps))
        check_equal(engine.full_state_dict(), expected, f"world {world} stage {stage} fp32")
    # Reductions after backward instead of from the hooks, and a world-sized reduction bucket.
    engine = engine_for(RECIPE, world, 2, zero_optimization={"stage": 2, "overlap_comm": False})
    common.train(engine, RECIPE, rank, world, range(RECIPE.steps))
    check_equal(engine.full_state_dict(), expected, f"world {world} stage 2 fp32 without overlap, one bucket")
    # Stage 3 with both blocks gathered, freed and reduced as one unit.
    joined = {"stage3_max_unit_numel": 13000, "stage3_coalesce_numel": 26000, "stage3_min_unit_numel": 100}
    engine = engine_for(RECIPE, world, 3, zero_optimization={"stage": 3, **joined})
    common.train(engine, RECIPE, rank, world, range(RECIPE.steps))
    check_equal(engine.full_state_dict(), expected, f"world {world} stage 3 fp32, blocks coalesced")
    check_rank0_weights_win()
    check_memory_without_accumulation()
    check_memory_with_accumulation()
    check_resume(directory, saved_stage=2, load_stage=2)
    check_resume(directory, saved_stage=3, load_stage=1)
    check_bf16_loss_curve(reference_losses)
    check_fp16_overflow_skips_together()


def check_rank0_weights_win() -> None:
    """Ranks that built different weights all start from rank 0's (broadcast at initialize)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    for stage in (1, 3):
        model = common.make_model(RECIPE, seed=100 + rank)
        rank0 = common.make_model(RECIPE, seed=100).state_dict()
        engine = zero.initialize(
            model=model, optimizer=common.make_optimizer(model, RECIPE), config=config(RECIPE, world, stage)
        )
        assert common.max_difference(engine.full_state_dict(), rank0)[0] == 0.0


def expected_bytes(
    engine: zero.ZeroEngine, item: int, *, full_grads: bool, master_grads: int
) -> dict[str, int]:
    """The closed form per rank: working copy ``item`` bytes per padded element, fp32 master and
    AdamW's two fp32 moments on this rank's shard, and a full gradient only when asked."""
    layout = engine.layout
    owned = sum(f.numel for f in engine.master.fragments)
    return {
        "params": item * layout.padded_numel,
        "full_grads": item * layout.padded_numel if full_grads else 0,
        "master": 4 * layout.shard_numel,
        "master_grads": master_grads,
        "optimizer": 2 * 4 * owned,
    }


def check_memory_without_accumulation() -> None:
    """One micro-step per step: stages 1 and 2 hold no full gradient and, between steps, no fp32
    gradient shard; right after backward only the reduced pieces in the training dtype."""
    rank, world = dist.get_rank(), dist.get_world_size()
    recipe = Recipe(accumulation=1)
    expected, _ = common.reference_run(recipe)
    for stage in (1, 2):
        engine = engine_for(recipe, world, stage)
        common.train(engine, recipe, rank, world, range(recipe.steps))
        check_equal(
            engine.full_state_dict(), expected, f"world {world} stage {stage} fp32 without accumulation"
        )
        assert engine.memory_bytes() == expected_bytes(engine, 4, full_grads=False, master_grads=0)
        engine = engine_for(recipe, world, stage, bf16={"enabled": True})
        common.train(engine, recipe, rank, world, range(1))
        engine.backward(engine(*common.rank_batch(recipe, 1, 0, rank, world)))
        pieces = 2 * engine.layout.shard_numel  # every segment's reduced piece, bf16
        assert engine.memory_bytes() == expected_bytes(engine, 2, full_grads=False, master_grads=pieces)
        engine.step()
        assert engine.memory_bytes() == expected_bytes(engine, 2, full_grads=False, master_grads=0)
    log(f"world {world} stages 1-2 without accumulation: no full gradient, no fp32 gradient between steps")


def check_memory_with_accumulation() -> None:
    """Accumulating: stage 1 keeps the full gradient and reduces on the boundary only; stage 2
    folds each micro-step's pieces into an fp32 shard that lives until the step."""
    rank, world = dist.get_rank(), dist.get_world_size()
    for stage in (1, 2):
        engine = engine_for(RECIPE, world, stage, bf16={"enabled": True})
        common.train(engine, RECIPE, rank, world, range(1))
        engine.backward(engine(*common.rank_batch(RECIPE, 1, 0, rank, world)))
        held = 0 if stage == 1 else 4 * engine.layout.shard_numel
        assert engine.memory_bytes() == expected_bytes(engine, 2, full_grads=stage == 1, master_grads=held)
        engine.step()
        engine.backward(engine(*common.rank_batch(RECIPE, 1, 1, rank, world)))
        engine.step()
        assert engine.memory_bytes() == expected_bytes(engine, 2, full_grads=stage == 1, master_grads=0)


def check_resume(directory: str, saved_stage: int, load_stage: int) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    engine = engine_for(RECIPE, world, load_stage)
    engine.load_checkpoint(directory, tag=f"stage{saved_stage}")
    assert engine.global_steps == SAVE_AT and engine.micro_steps == SAVE_AT * RECIPE.accumulation
    common.train(engine, RECIPE, rank, world, range(SAVE_AT, RECIPE.steps))
    uninterrupted = torch.load(Path(directory) / f"uninterrupted_stage{saved_stage}.pt")
    check_equal(
        engine.full_state_dict(),
        uninterrupted,
        f"stage {saved_stage} at world 4 -> stage {load_stage} at world 2",
    )


def check_bf16_loss_curve(reference_losses: list[float]) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    for stage, reduce_in in ((1, None), (3, "fp32")):
        engine = engine_for(RECIPE, world, stage, bf16={"enabled": True}, communication_data_type=reduce_in)
        assert all(p.dtype == torch.bfloat16 for p in engine.module.parameters() if p.numel())
        losses = common.train(engine, RECIPE, rank, world, range(RECIPE.steps))
        worst = max(abs(a - b) for a, b in zip(losses, reference_losses))
        assert worst < 0.05, (losses, reference_losses)
        log(f"bf16 stage {stage}: loss curve within {worst:.3g} of fp32")


def check_fp16_overflow_skips_together() -> None:
    """A 2**30 loss scale overflows fp16 gradients: every rank skips, the scale halves each time."""
    rank, world = dist.get_rank(), dist.get_world_size()
    fp16 = {"enabled": True, "initial_scale_power": 30, "hysteresis": 1, "loss_scale_window": 1000}
    engine = engine_for(RECIPE, world, 2, fp16=fp16)
    before = engine.full_state_dict()
    common.train(engine, RECIPE, rank, world, range(1))
    assert engine.skipped_steps == 1 and engine.loss_scale == 2.0**29 and engine.global_steps == 1
    assert common.max_difference(engine.full_state_dict(), before)[0] == 0.0
    steps = 30  # the scale must fall from 2**30 to fp16's range (about 2**15) before steps happen
    losses = common.train(engine, RECIPE, rank, world, range(1, steps))
    agreed = torch.tensor([engine.skipped_steps, engine.loss_scale], dtype=torch.float64)
    everyone = [torch.zeros_like(agreed) for _ in range(world)]
    dist.all_gather(everyone, agreed)
    assert all(torch.equal(agreed, other) for other in everyone), everyone
    assert engine.skipped_steps < steps and all(math.isfinite(loss) for loss in losses), (
        engine.skipped_steps,
        losses,
    )
    log(f"fp16: {engine.skipped_steps} steps skipped on every rank, loss scale now {engine.loss_scale:g}")


def check_errors_before_communication(world: int) -> None:
    """Each error is raised on every rank alike before any collective, so the world survives."""
    model = common.make_model(RECIPE)
    optimizer = common.make_optimizer(model, RECIPE)
    with pytest.raises(
        zero.ZeroConfigError, match="unknown key.*'stagee'.*valid keys are: allgather_bucket_size"
    ):
        zero.initialize(
            model=model,
            optimizer=optimizer,
            config={"train_batch_size": 16, "zero_optimization": {"stagee": 1}},
        )
    with pytest.raises(zero.ZeroConfigError, match=r"received 30 but 2 \* 2 \* 2 = 8"):
        zero.initialize(
            model=model,
            optimizer=optimizer,
            config={
                "train_batch_size": 30,
                "train_micro_batch_size_per_gpu": 2,
                "gradient_accumulation_steps": 2,
            },
        )
    other = common.make_model(RECIPE)
    with pytest.raises(
        InvalidArgumentError, match=r"argument 'optimizer' expected only parameters of the model"
    ):
        zero.initialize(
            model=model, optimizer=common.make_optimizer(other, RECIPE), config=config(RECIPE, world, 1)
        )
    with pytest.raises(
        InvalidArgumentError, match=r"element-wise optimizer for ZeRO stage 2.*received LBFGS"
    ):
        zero.initialize(
            model=model, optimizer=torch.optim.LBFGS(model.parameters()), config=config(RECIPE, world, 2)
        )
    partial = torch.optim.AdamW([model.tok.weight])
    with pytest.raises(InvalidArgumentError, match=r"every trainable model parameter.*'pos.weight'"):
        zero.initialize(model=model, optimizer=partial, config=config(RECIPE, world, 0))
    assert all(p.numel() for p in model.parameters())  # the model was left untouched
