"""The slot keeper of `commlayer run --ft` (tier 2: the real keeper on tiny torch-free members).

Each member here is a `python -c` program that counts its starts in a file, so a test sees what
the keeper restarted, with which environment, and what it said.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from commlayer.launch.slot_keeper import backoff_seconds, keeper_command

# Appends "RANK,SLOT_RESTART" to the file argv[1], then exits with argv[2] until the file holds
# argv[3] lines (then 0); argv[4], when given, is written to the keeper's channel first.
MEMBER = """
import os, sys
with open(sys.argv[1], "a") as starts:
    starts.write(os.environ.get("RANK", "") + "," + os.environ["COMMLAYER_FT_SLOT_RESTART"] + "\\n")
if len(sys.argv) > 4:
    os.write(int(os.environ["COMMLAYER_FT_CHANNEL"]), sys.argv[4].encode() + b"\\n")
done = len(open(sys.argv[1]).read().splitlines()) >= int(sys.argv[3])
sys.exit(0 if done else int(sys.argv[2]))
"""


def _keep(
    tmp_path: Path, max_restarts: int, code: int, succeed_at: int, *word: str
) -> tuple[int, str, list[str]]:
    starts = tmp_path / "starts"
    member = (sys.executable, "-c", MEMBER, str(starts), str(code), str(succeed_at), *word)
    done = subprocess.run(
        keeper_command(member, max_restarts),
        env={**os.environ, "RANK": "3"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode, done.stderr, starts.read_text().splitlines()


def test_backoff_doubles_from_half_a_second_up_to_8s() -> None:
    assert [backoff_seconds(restart) for restart in range(1, 7)] == [0.5, 1, 2, 4, 8, 8]


def test_a_failing_member_restarts_in_its_slot_until_it_succeeds(tmp_path: Path) -> None:
    code, stderr, starts = _keep(tmp_path, 3, 1, 3)
    assert code == 0, stderr
    assert starts == ["3,0", "3,1", "3,2"]  # the same slot (RANK) each time, its restart counted
    assert stderr.splitlines() == [
        "commlayer run: rank 3 exited with code 1; restarting it in its slot in 0.5s (restart 1 of 3)",
        "commlayer run: rank 3 exited with code 1; restarting it in its slot in 1s (restart 2 of 3)",
    ]


def test_spent_restarts_end_the_keeper_with_the_members_status(tmp_path: Path) -> None:
    code, stderr, starts = _keep(tmp_path, 1, 3, 99)
    assert code == 3 and len(starts) == 2, stderr
    assert stderr.splitlines()[-1] == (
        "commlayer run: rank 3 gave up after 1 restart in its slot: it exited with code 3"
    )


def test_a_member_that_says_its_job_is_lost_is_not_restarted(tmp_path: Path) -> None:
    code, stderr, starts = _keep(tmp_path, 3, 1, 99, "lost")
    assert code == 1 and len(starts) == 1, stderr
    lost = "no live member holds some shard of the state"
    assert stderr.splitlines() == [
        f"commlayer run: rank 3 gave up after 0 restarts in its slot ({lost}): it exited with code 1"
    ]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_group_ends_member_and_keeper_without_a_restart(
    tmp_path: Path, signum: signal.Signals
) -> None:
    ready = tmp_path / "ready"
    member = (
        sys.executable,
        "-c",
        f"import pathlib, time; pathlib.Path({str(ready)!r}).touch(); time.sleep(60)",
    )
    keeper = subprocess.Popen(
        keeper_command(member, 3), stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    os.killpg(keeper.pid, signum)  # what the launcher's supervisor does
    _, stderr = keeper.communicate(timeout=10)
    assert keeper.returncode == 128 + signum and "restarting" not in stderr, stderr
