"""A rank that skips a collective is named by the ranks that wait for it, on every backend.

Without debug mode, the ranks whose collective timed out ask their peers, through the store, for
the last collective each entered on the group (commlayer/facade/progress.py): the CommTimeoutError
then says which rank did not call it. shm's own wait names the rank it waited for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multirank

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("backend", ["gloo", "shm", pytest.param("ccl", marks=pytest.mark.ccl)])
def test_the_skipping_rank_is_named(backend: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "COMMLAYER_DEBUG"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-m", "tests.reliability.skip_ranks", backend],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    records = {record["rank"]: record for record in map(json.loads, lines)}
    assert set(records) == {0, 1}, f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    for rank, record in records.items():
        assert record["outcome"] == "error" and "CommTimeoutError" in record["bases"], record
        assert "all_reduce" in record["message"] and f"rank {rank}" in record["message"], record
        assert "rank 2 did not" in record["message"], record
