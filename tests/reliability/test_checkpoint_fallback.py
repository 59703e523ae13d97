"""A damaged newest checkpoint: resuming through ``latest`` loads the newest intact one, saying so;
asking for the damaged tag by name still fails naming the file."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from commlayer.core.errors import CheckpointError
from commlayer.zero.checkpoint import CheckpointFallbackWarning
from tests.zero import zero_model as common
from tests.zero.test_zero_engine import RECIPE, make_engine


def _damage(shard: Path) -> None:
    data = bytearray(shard.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(byte ^ 0xFF for byte in data[middle : middle + 64])
    shard.write_bytes(bytes(data))


def test_a_damaged_newest_checkpoint_resumes_from_the_previous_one(
    world_of_one: None, tmp_path: Path
) -> None:
    engine = make_engine(2)
    common.train(engine, RECIPE, 0, 1, range(1))
    engine.save_checkpoint(tmp_path, tag="first")
    first = [value.clone() for value in engine.master.fragment_values]
    first_step = engine.global_steps
    time.sleep(0.01)  # distinct meta.json times even on a coarse clock
    common.train(engine, RECIPE, 0, 1, range(1, 2))
    engine.save_checkpoint(tmp_path, tag="second")
    assert (tmp_path / "latest").read_text() == "second"
    os.utime(tmp_path / "first" / "meta.json", (1, 1))  # older on disk, whatever the clock says
    _damage(tmp_path / "second" / "rank_0.pt")

    resumed = make_engine(2)
    with pytest.warns(
        CheckpointFallbackWarning, match=r"'second'.*is damaged.*resuming from 'first' \(step \d+\)"
    ):
        path, _ = resumed.load_checkpoint(tmp_path)
    assert Path(path).resolve() == (tmp_path / "first").resolve()
    assert resumed.global_steps == first_step
    for loaded, saved in zip(resumed.master.fragment_values, first):
        assert torch.equal(loaded, saved)

    with pytest.raises(CheckpointError, match=r"second.*rank_0\.pt', written by rank 0, is damaged"):
        make_engine(2).load_checkpoint(tmp_path, tag="second")


def test_no_intact_checkpoint_left_raises_the_newest_ones_damage(world_of_one: None, tmp_path: Path) -> None:
    engine = make_engine(2)
    common.train(engine, RECIPE, 0, 1, range(1))
    engine.save_checkpoint(tmp_path, tag="only")
    _damage(tmp_path / "only" / "rank_0.pt")
    with pytest.raises(CheckpointError, match=r"rank_0\.pt', written by rank 0, is damaged"):
        make_engine(2).load_checkpoint(tmp_path)
