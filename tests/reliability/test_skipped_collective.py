"""A rank that skips a collective is named by the ranks that wait for it, on every backend.

Without debug mode, the ranks whose collective timed out ask their peers, through the store, for
the last collective each entered on the group (commlayer/facade/monitor/progress.py): the CommTimeoutError
then says which rank did not call it. shm's own wait names the rank it waited for. On mpi the
survivors wait for the skipping rank in the mismatch check's exchange, outside MPI, so they raise
the same catchable error before anything ends the job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from commlayer.testing import require_mpirun
from commlayer.testing.mpi import mpirun_plan
from tests.reliability.forked_worlds import ROOT, forked_records

pytestmark = pytest.mark.multirank


@pytest.mark.parametrize("backend", ["gloo", "shm", pytest.param("ccl", marks=pytest.mark.ccl)])
def test_the_skipping_rank_is_named(backend: str) -> None:
    records, output = forked_records("tests.reliability.skip_ranks", backend)
    assert set(records) == {0, 1}, output
    for rank, record in records.items():
        assert record["outcome"] == "error" and "CommTimeoutError" in record["bases"], record
        assert "all_reduce" in record["message"] and f"rank {rank}" in record["message"], record
        assert "rank 2 did not" in record["message"], record


@pytest.mark.mpi
@pytest.mark.parametrize("op", ["all_reduce", "barrier"])
def test_mpi_survivors_catch_the_timeout_naming_the_skipping_rank(op: str, tmp_path: Path) -> None:
    require_mpirun()
    env = {
        key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE", "MASTER_PORT")
    }
    env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", COMMLAYER_TRACE_DIR=str(tmp_path / "trace"))
    plan = mpirun_plan(3, env)
    command = [*plan.argv, sys.executable, "-m", "tests.reliability.skip_ranks", "mpi", op, str(tmp_path)]
    done = subprocess.run(
        command, env=dict(plan.env), capture_output=True, text=True, timeout=120, check=False
    )
    output = f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    assert all((tmp_path / f"rank{rank}.json").exists() for rank in range(2)), output
    records = {rank: json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)}
    for rank, record in records.items():
        assert record["outcome"] == "error" and "CommTimeoutError" in record["bases"], (record, output)
        assert op in record["message"] and f"rank {rank}" in record["message"], record
        assert f"rank 2 did not call {op}" in record["message"], record
    assert "MPI cannot cancel a started blocking call" not in output, output  # no watchdog abort
