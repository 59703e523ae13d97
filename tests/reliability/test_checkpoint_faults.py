"""Checkpoints that cannot be lost: a kill inside either rename window of a save, and damaged,
truncated or missing shards, each failing with the file and the rank named."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from commlayer import zero
from commlayer.core.errors import CheckpointError
from commlayer.testing.fork_server import warm_command
from tests.zero import zero_model as common
from tests.zero.test_zero_engine import RECIPE, make_engine

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def saved(world_of_one: None, tmp_path: Path) -> Path:
    engine = make_engine(2)
    common.train(engine, RECIPE, 0, 1, range(1))
    engine.save_checkpoint(tmp_path, tag="t")
    return tmp_path


def test_a_flipped_block_in_a_shard_fails_naming_the_file_and_rank(saved: Path) -> None:
    shard = saved / "t" / "rank_0.pt"
    data = bytearray(shard.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4096] = bytes(byte ^ 0xFF for byte in data[middle : middle + 4096])
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"rank_0\.pt', written by rank 0, is damaged.*\(rank 0\)"):
        make_engine(2).load_checkpoint(saved, tag="t")


def test_a_truncated_or_missing_shard_fails_naming_the_file(saved: Path) -> None:
    shard = saved / "t" / "rank_0.pt"
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=r"rank_0\.pt.*is damaged"):
        zero.consolidated_state_dict(saved, tag="t")
    shard.unlink()
    with pytest.raises(CheckpointError, match=r"rank_0\.pt', written by rank 0, is missing"):
        zero.consolidated_state_dict(saved, tag="t")


@pytest.mark.parametrize("window, step", [("before_switch", 1), ("after_switch", 2)])
def test_a_kill_inside_a_save_leaves_a_loadable_checkpoint(
    window: str, step: int, world_of_one: None, tmp_path: Path
) -> None:
    """Killed before the link switch: the old version loads; after it: the new one does."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "tests.reliability.checkpoint_faults_ranks", str(tmp_path), window, "30"]
    # Warm-started (commlayer.testing.fork_server); its stand-in's SIGKILL kills the saver too.
    saver = subprocess.Popen(
        warm_command(command, env),
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        _await_pause(saver, tmp_path, window)
        saver.send_signal(signal.SIGKILL)
    finally:
        saver.kill()
        saver.wait()
    _, client = make_engine(2).load_checkpoint(tmp_path, tag="t")
    assert client == {"step": step}
    assert torch.isfinite(next(iter(zero.consolidated_state_dict(tmp_path, tag="t").values()))).all()


def _await_pause(saver: subprocess.Popen, directory: Path, window: str, limit_s: float = 120.0) -> None:
    """Wait until the second save sits in ``window`` (its new version complete, meta.json written)."""
    deadline = time.monotonic() + limit_s
    assert saver.stdout is not None
    for line in saver.stdout:
        if line.startswith("SAVING"):
            break
    new_version = directory / ".t.B" / "meta.json"
    while time.monotonic() < deadline:
        if window == "before_switch" and new_version.is_file():
            time.sleep(0.5)  # meta.json written: the saver is now in the pause before the switch
            return
        if window == "after_switch" and os.readlink(directory / "t") == ".t.B":
            return
        time.sleep(0.05)
    raise AssertionError(f"the saver never reached {window}")
