"""The fork server behind run_world's local ranks: tier 1 (which commands it takes) and tier 3
(a forked rank is the process a cold start would have given, and dies with its stand-in).

Rank bodies live in tests/tools/fork_server_ranks.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from commlayer.core import settings
from commlayer.launch.supervise import pid_running
from commlayer.testing import run_world
from commlayer.testing.fork_server import warm_command

TARGETS = "tests.tools.fork_server_ranks"
REPO = Path(__file__).resolve().parents[2]


# ---- tier 1 ------------------------------------------------------------------------------------


def test_only_python_dash_m_commands_are_taken_and_the_switch_turns_it_off() -> None:
    command = (sys.executable, "-m", "commlayer.testing.worker", "pkg.mod:fn")
    off = {**os.environ, settings.TESTING_FORK_SERVER.name: "0"}
    assert warm_command(command, off) == command
    script = (sys.executable, "script.py")
    assert warm_command(script, os.environ) == script
    warm = warm_command(command, os.environ)
    assert warm[:3] == (sys.executable, "-S", "-E") and warm[-3:] == command[1:][-3:]


# ---- tier 3 ------------------------------------------------------------------------------------


@pytest.mark.multirank
def test_forked_ranks_have_their_own_environment_cwd_seed_and_stand_in() -> None:
    run_world(
        f"{TARGETS}:own_process_state",
        3,
        env={"FORK_SERVER_TEST_MARKER": "set"},
        args=[os.getcwd(), "FORK_SERVER_TEST_MARKER"],
        timeout=60,
    )


@pytest.mark.multirank
def test_a_killed_stand_in_takes_its_rank_with_it(tmp_path: Path) -> None:
    command = warm_command(
        (sys.executable, "-m", "commlayer.testing.worker", f"{TARGETS}:report_pid_then_sleep"),
        os.environ,
    )
    assert "-S" in command, "the fork server did not start"
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "PYTHONPATH": str(REPO)}
    env[settings.TESTING_RESULTS_DIR.name] = str(tmp_path)
    stand_in = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert stand_in.stdout is not None
    rank_pid = int(stand_in.stdout.readline())
    assert rank_pid != stand_in.pid and pid_running(rank_pid)
    stand_in.send_signal(signal.SIGKILL)
    assert stand_in.wait(timeout=10) == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while pid_running(rank_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_running(rank_pid), f"rank {rank_pid} outlived its stand-in"
