"""Checkpoints of a fault-tolerant job (tier 2: a one-member job on a HashStore, real files)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as torch_dist

from commlayer.core.errors import CheckpointError
from commlayer.ft import FaultToleranceOptions, FaultTolerantDataParallel, Manager
from commlayer.ft.checkpoint import complete_steps, newest_shard, read_parameters, write_shard


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))


@pytest.fixture
def engines() -> Iterator[list[FaultTolerantDataParallel]]:
    made: list[FaultTolerantDataParallel] = []
    yield made
    for engine in made:
        engine.manager.close()


def _engine(
    made: list[FaultTolerantDataParallel], model: torch.nn.Module | None = None
) -> FaultTolerantDataParallel:
    manager = Manager(FaultToleranceOptions(replicas=1), store=torch_dist.HashStore(), member=0)
    engine = FaultTolerantDataParallel(
        model or _model(), lambda ps: torch.optim.AdamW(ps, lr=0.1), manager, stage=1
    )
    made.append(engine)
    return engine


def _train(engine: FaultTolerantDataParallel, steps: int, directory: Path) -> None:
    while engine.step < steps:
        engine.train_step(lambda module, step: module(torch.full((2, 3), float(step))).pow(2).mean())
        if engine.step % 2 == 0:
            engine.save_checkpoint(directory)


def test_a_checkpoint_resumes_an_engine_and_assembles_the_model_without_a_group(
    tmp_path: Path, engines: list[FaultTolerantDataParallel]
) -> None:
    trained = _engine(engines)
    _train(trained, 6, tmp_path)
    assert [step for step, _ in complete_steps(tmp_path, 1)] == [6, 4]  # the 2 newest are kept
    step, parameters = read_parameters(tmp_path)
    assert step == 6
    for name, param in trained.module.named_parameters():
        assert torch.equal(parameters[name], param.detach()), name
    resumed = _engine(engines)
    assert resumed.load_checkpoint(tmp_path) == 6 and resumed.step == 6
    assert torch.equal(resumed.master.detach(), trained.master.detach())
    assert (
        resumed.optimizer.state_dict()["state"][0]["step"]
        == trained.optimizer.state_dict()["state"][0]["step"]
    )
    _train(resumed, 7, tmp_path)  # the gathered parameters are the checkpoint's, then one step more
    _train(trained, 7, tmp_path)
    assert torch.equal(resumed.flat, trained.flat)


def test_an_incomplete_newest_step_and_an_unreadable_shard_fall_back_to_an_older_one(tmp_path: Path) -> None:
    payload = {"names": [["w", [2]]], "master": torch.ones(2), "optimizer": {}}
    write_shard(tmp_path, 2, 0, 1, payload)
    write_shard(tmp_path, 4, 0, 2, payload)  # shard 1 of 2 never written: not a checkpoint
    assert read_parameters(tmp_path)[0] == 2
    write_shard(tmp_path, 6, 0, 1, payload)
    (tmp_path / "step_00000006" / "shard0-of-1.pt").write_bytes(b"damaged")
    with pytest.warns(UserWarning, match="unreadable"):
        found = newest_shard(tmp_path, 0, 1, torch.device("cpu"))
    assert found is not None and found[0] == 2


def test_a_joining_member_takes_no_checkpoint_and_another_models_is_refused(
    tmp_path: Path, engines: list[FaultTolerantDataParallel]
) -> None:
    _train(_engine(engines), 2, tmp_path)
    joining = _engine(engines)
    joining._step = -1  # what a member that starts after the job began holds
    assert joining.load_checkpoint(tmp_path) is None
    other = _engine(engines, torch.nn.Linear(3, 2))
    with pytest.raises(
        CheckpointError, match=r"expected this model's 2 parameters, received a checkpoint of 4"
    ):
        other.load_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="holds no complete checkpoint"):
        read_parameters(tmp_path / "empty")
