"""Bad launch environments are named at once on every rank, and a rendezvous that times out
lets its process exit promptly.

A world of 3 where one rank's RANK is beyond WORLD_SIZE: that rank raises RendezvousEnvError (a
ValueError and a DistError) naming the variable; the two good ranks raise RendezvousError naming
it too, long before their init timeout (30 s). A lone rank whose store never comes raises
CommTimeoutError at its timeout and its process ends soon after.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from commlayer.core.ports import free_port
from commlayer.testing.fork_server import warm_command

pytestmark = pytest.mark.multirank

ROOT = Path(__file__).resolve().parents[2]
INIT_TIMEOUT_S = 30.0
# Far below the init timeout the good ranks used to wait out; the figures are printed.
NAMED_WITHIN_S = 10.0


def _start(rank: str, port: int, out: Path, timeout_s: float) -> subprocess.Popen[bytes]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("COMMLAYER_DEBUG",))}
    env.update(
        PYTHONPATH=str(ROOT),
        RANK=rank,
        WORLD_SIZE="3",
        LOCAL_RANK="0",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    command = [sys.executable, "-m", "tests.reliability.launch_errors_ranks", str(out), str(timeout_s)]
    return subprocess.Popen(
        warm_command(command, env), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


def _finish(process: subprocess.Popen[bytes], out: Path) -> dict[str, Any]:
    output = process.communicate(timeout=90)[0].decode(errors="replace")
    assert out.exists(), output[-3000:]
    return json.loads(out.read_text())


def test_a_bad_rank_variable_is_named_on_every_rank(tmp_path: Path) -> None:
    port = free_port()
    ranks = {"0": tmp_path / "rank0.json", "1": tmp_path / "rank1.json", "7": tmp_path / "bad.json"}
    processes = {rank: _start(rank, port, out, INIT_TIMEOUT_S) for rank, out in ranks.items()}
    records = {rank: _finish(processes[rank], out) for rank, out in ranks.items()}
    bad = records["7"]
    assert bad["type"] == "RendezvousEnvError", bad
    assert {"ValueError", "DistError"} <= set(bad["bases"]), bad
    assert "RANK: expected a rank below WORLD_SIZE=3, received '7'" in bad["message"], bad
    for rank in ("0", "1"):
        record = records[rank]
        assert record["type"] == "RendezvousError" and "DistError" in record["bases"], record
        assert "a rank of this job cannot start" in record["message"], record
        assert "RANK: expected a rank below WORLD_SIZE=3, received '7'" in record["message"], record
        assert f"(rank {rank})" in record["message"], record
        assert record["init_s"] < NAMED_WITHIN_S, record
    print(
        f"\nbad RANK: named by the good ranks after {records['0']['init_s']} s and {records['1']['init_s']} s"
    )


def test_a_rendezvous_timeout_exits_promptly(tmp_path: Path) -> None:
    out = tmp_path / "lone.json"
    process = _start("1", free_port(), out, 2.0)  # nobody hosts the store
    record = _finish(process, out)
    lingered = time.time() - record["t_recorded"]
    assert record["type"] == "CommTimeoutError", record
    assert "did not answer within the timeout" in record["message"], record
    # At most one short connection attempt outlives the timeout (it was two whole timeouts).
    assert lingered < 10.0, (lingered, record)
    print(
        f"\nrendezvous timeout: init raised after {record['init_s']} s, the process ended {lingered:.1f} s later"
    )
