"""shrink_group: torch's checks on its arguments, and training that goes on after a rank died.

The multi-rank test forks an unsupervised 3-rank world per backend (tests/reliability/
shrink_ranks.py): rank 1 is SIGKILLed, ranks 0 and 2 catch the PeerFailureError, shrink the
world around the dead rank and check exact collectives (sync, async, broadcast, all-gather,
barrier, a new subgroup) on the renumbered world of two.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from commlayer import dist
from commlayer.errors import InvalidArgumentError

ROOT = Path(__file__).resolve().parents[2]


def test_arguments_are_checked_like_torchs(world_of_one: None) -> None:
    with pytest.raises(TypeError, match="'ranks_to_exclude' expected a list of ints, received '1'"):
        dist.shrink_group("1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"received \[\] \(an empty list\) \(rank 0\)"):
        dist.shrink_group([])
    with pytest.raises(ValueError, match=r"received \[5\] \(ranks out of range for a group of 1\)"):
        dist.shrink_group([5])
    with pytest.raises(ValueError, match=r"received \[0\] \(every rank of the group\)"):
        dist.shrink_group([0])
    with pytest.raises(InvalidArgumentError, match="'shrink_flags' expected SHRINK_DEFAULT"):
        dist.shrink_group([0], shrink_flags=7)
    assert dist.get_world_size() == 1  # nothing changed


@pytest.mark.multirank
@pytest.mark.parametrize("backend", ["gloo", "shm", pytest.param("ccl", marks=pytest.mark.ccl)])
def test_survivors_shrink_the_world_and_train_on(backend: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "COMMLAYER_DEBUG"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-m", "tests.reliability.shrink_ranks", backend],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    records = {record["rank"]: record for record in map(json.loads, _json_lines(done.stdout))}
    assert set(records) == {0, 2}, f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    for rank, new_rank in ((0, 0), (2, 1)):
        record = records[rank]
        assert "error" not in record, record["error"]
        assert record["failed_rank"] == 1 and record["checked"], record
        assert (record["rank_after"], record["size_after"], record["code"]) == (new_rank, 2, 0), record


def _json_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("{")]
