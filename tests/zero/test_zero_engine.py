"""Tier 2 (wiring) for ZeRO in a world of one: engine life cycle, checkpoints on disk, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from commlayer import dist, zero
from commlayer.core.errors import InvalidArgumentError, NotInitializedError
from commlayer.mesh import init_mesh
from commlayer.zero.reducer import GradientReducer
from tests.zero import zero_model as common
from tests.zero.zero_model import Recipe

RECIPE = Recipe(steps=3)


def make_engine(stage: int, **extra: object) -> zero.ZeroEngine:
    model = common.make_model(RECIPE)
    config = {
        "train_micro_batch_size_per_gpu": RECIPE.global_micro,
        "gradient_accumulation_steps": RECIPE.accumulation,
        "gradient_clipping": RECIPE.clip,
        "zero_optimization": {
            "stage": stage,
            "reduce_bucket_size": 4000,
            "stage3_max_unit_numel": 5000,
            "stage3_min_unit_numel": 100,
        },
        **extra,
    }
    return zero.initialize(model=model, optimizer=common.make_optimizer(model, RECIPE), config=config)


def test_initialize_before_init_process_group_fails() -> None:
    model = common.make_model(RECIPE)
    with pytest.raises(NotInitializedError, match="call commlayer.dist.init_process_group"):
        zero.initialize(
            model=model, optimizer=common.make_optimizer(model, RECIPE), config={"train_batch_size": 8}
        )


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_single_rank_engine_trains_like_plain_pytorch(world_of_one: None, stage: int) -> None:
    engine = make_engine(stage)
    common.train(engine, RECIPE, 0, 1, range(RECIPE.steps))
    expected, _ = common.reference_run(RECIPE)
    state = engine.full_state_dict()
    assert list(state) == list(common.make_model(RECIPE).state_dict())
    assert common.max_difference(state, expected)[0] <= 1e-6
    assert engine.global_steps == RECIPE.steps and engine.micro_steps == RECIPE.steps * RECIPE.accumulation


def test_stage3_frees_parameters_and_a_stray_use_fails_loudly(world_of_one: None) -> None:
    engine = make_engine(3)
    block = engine.module.blocks[0]
    assert block.qkv.weight.numel() == 0  # freed between steps: only the master shard holds it
    with pytest.raises(RuntimeError):
        torch.nn.functional.linear(
            torch.zeros(1, common.WIDTH), block.qkv.weight
        )  # used without its module's hooks
    assert block.qkv(torch.zeros(1, common.WIDTH)).shape == (
        1,
        3 * common.WIDTH,
    )  # its own forward gathers it
    assert block.qkv.weight.numel() == 0
    loss = engine(*common.rank_batch(RECIPE, 0, 0, 0, 1))
    engine.backward(loss)
    assert all(p.numel() == 0 for p in engine.module.parameters())


def test_stage3_gathers_coalesced_blocks_together_and_trains_alike(world_of_one: None) -> None:
    """Both blocks as one unit: the first is still gathered when the second starts, both are
    freed between steps, and training ends where plain PyTorch does."""
    joined = {"stage3_max_unit_numel": 13000, "stage3_coalesce_numel": 26000}
    engine = make_engine(3, zero_optimization={"stage": 3, "stage3_min_unit_numel": 100, **joined})
    first, second = engine.module.blocks
    seen: list[int] = []
    hook = second.register_forward_pre_hook(lambda module, args: seen.append(first.qkv.weight.numel()))
    common.train(engine, RECIPE, 0, 1, range(RECIPE.steps))
    hook.remove()
    assert seen == [3 * common.WIDTH * common.WIDTH] * RECIPE.steps * RECIPE.accumulation
    assert first.qkv.weight.numel() == 0 and second.qkv.weight.numel() == 0
    expected, _ = common.reference_run(RECIPE)
    assert common.max_difference(engine.full_state_dict(), expected)[0] <= 1e-6


@pytest.mark.parametrize("reduce_dtype", [torch.bfloat16, torch.float32])
def test_a_units_gradients_staged_at_once_equal_them_staged_one_by_one(
    world_of_one: None, reduce_dtype: torch.dtype
) -> None:
    """Stage 3 stages a unit's gradients together; the values must stay exactly stage()'s, which
    divides in the gradients' dtype (bf16) also where the buffer is fp32."""
    reducer = GradientReducer(dist.group.WORLD, None, reduce_dtype, None, divisor=3)  # type: ignore[arg-type]
    generator = torch.Generator().manual_seed(7)
    for dtypes in ((torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32)):
        grads = [
            torch.randn(5, 3, generator=generator).to(dtypes[0]),
            torch.randn(7, generator=generator).to(dtypes[1]),
        ]
        one_by_one, together = (
            torch.empty(22, dtype=reduce_dtype),
            torch.full((22,), -1.0, dtype=reduce_dtype),
        )
        reducer.stage(one_by_one[:15], grads[0])
        reducer.stage(one_by_one[15:], grads[1])
        reducer.stage_consecutive(together, grads)
        assert torch.equal(together, one_by_one), dtypes


def test_bf16_casts_parameters_buffers_and_float_inputs(world_of_one: None) -> None:
    engine = make_engine(1, bf16={"enabled": True})
    assert {p.dtype for p in engine.module.parameters()} == {torch.bfloat16}
    assert engine.module.temperature.dtype == torch.bfloat16
    assert engine.master.values.dtype == torch.float32
    seen = []
    hook = engine.module.register_forward_pre_hook(lambda module, args: seen.append(args[0].dtype))
    engine.module.forward = lambda x, y: (x.float().sum() * 0 + engine.module.tok.weight.sum()).float()  # type: ignore[method-assign]
    engine(torch.ones(2, dtype=torch.float32), torch.ones(2, dtype=torch.int64))
    hook.remove()
    assert seen == [torch.bfloat16]


def test_user_zero_grad_between_micro_steps_is_honoured(world_of_one: None) -> None:
    engine = make_engine(0)
    batch = common.rank_batch(RECIPE, 0, 0, 0, 1)
    engine.backward(engine(*batch))
    engine.module.zero_grad(set_to_none=True)  # drops the views into the flat gradient buffer
    engine.backward(engine(*batch))
    first = engine.runtime.grad_flat.clone()
    engine.zero_grad()
    engine.backward(engine(*batch))
    assert torch.equal(engine.runtime.grad_flat, first)


def test_checkpoint_round_trip_atomic_latest_and_plain_model(world_of_one: None, tmp_path: Path) -> None:
    engine = make_engine(2)
    common.train(engine, RECIPE, 0, 1, range(2))
    assert engine.save_checkpoint(tmp_path) == "global_step2"
    assert (tmp_path / "latest").read_text() == "global_step2"
    meta = json.loads((tmp_path / "global_step2" / "meta.json").read_text())
    assert meta["world_size"] == 1 and meta["global_steps"] == 2 and meta["stage"] == 2
    saved = engine.full_state_dict()
    # An interrupted later save leaves only a partial directory: "latest" still loads.
    partial = tmp_path / ".global_step3.partial"
    partial.mkdir()
    (partial / "rank_0.pt").write_bytes(b"truncated")
    fresh = make_engine(3)
    path, client = fresh.load_checkpoint(tmp_path)
    assert path.endswith("global_step2") and client == {} and fresh.global_steps == 2
    assert common.max_difference(fresh.full_state_dict(), saved)[0] == 0.0
    plain = common.make_model(RECIPE, seed=7)
    plain.load_state_dict(zero.consolidated_state_dict(tmp_path))
    assert common.max_difference(plain.state_dict(), saved)[0] == 0.0
    # Saving the same tag again writes the other version, switches the link, deletes the old one.
    engine.save_checkpoint(tmp_path, tag="global_step2", client_state={"epoch": 3})
    assert fresh.load_checkpoint(tmp_path, tag="global_step2")[1] == {"epoch": 3}
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [".global_step2.B", ".global_step3.partial", "global_step2", "latest"], names


def test_checkpoint_of_another_model_is_refused(world_of_one: None, tmp_path: Path) -> None:
    make_engine(1).save_checkpoint(tmp_path, tag="t")
    model = common.make_model(Recipe(tied=False))
    other = zero.initialize(
        model=model, optimizer=common.make_optimizer(model, RECIPE), config={"train_batch_size": 8}
    )
    with pytest.raises(InvalidArgumentError, match="holds a different model"):
        other.load_checkpoint(tmp_path, tag="t")
    with pytest.raises(InvalidArgumentError, match="expected a complete checkpoint"):
        other.load_checkpoint(tmp_path, tag="missing")


def test_bad_arguments_are_refused_before_communicating(world_of_one: None) -> None:
    model = common.make_model(RECIPE)
    optimizer = common.make_optimizer(model, RECIPE)
    with pytest.raises(zero.ZeroConfigError, match="argument 'config' expected a dict"):
        zero.initialize(model=model, optimizer=optimizer)
    with pytest.raises(InvalidArgumentError, match="argument 'model' expected a torch.nn.Module"):
        zero.initialize(model="gpt", optimizer=optimizer, config={"train_batch_size": 8})
    with pytest.raises(zero.ZeroConfigError, match="expected a mesh with a 'dp' dim"):
        zero.initialize(
            model=model, optimizer=optimizer, config={"train_batch_size": 8}, mesh=init_mesh((1,), ("tp",))
        )
    model(*common.rank_batch(RECIPE, 0, 0, 0, 1)).backward()
    stepped = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    stepped.step()
    with pytest.raises(InvalidArgumentError, match="a fresh optimizer with no state"):
        zero.initialize(model=model, optimizer=stepped, config={"train_batch_size": 8})
    assert dist.is_initialized()


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_plain_loss_backward_is_refused_with_the_fix(world_of_one: None, stage: int) -> None:
    engine = make_engine(stage)
    loss = engine(*common.rank_batch(RECIPE, 0, 0, 0, 1))
    with pytest.raises(
        RuntimeError, match=r"outside engine.backward\(\); call engine.backward\(loss\) instead"
    ):
        loss.backward()
    with pytest.raises(RuntimeError, match=r"engine.step\(\) without engine.backward\(loss\)"):
        engine.step()
