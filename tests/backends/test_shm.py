"""The shm backend in real multi-process worlds: compatibility suite at 2, 3, 4 ranks, size paths,
stress, mixed async_op, two-level across simulated hosts (local and under mpirun), rank death."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from commlayer.core.ports import free_port
from commlayer.testing import require_mpirun, run_world
from commlayer.testing.fork_server import warm_command

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.multirank


@pytest.mark.parametrize(
    "world_size", [2, pytest.param(3, marks=pytest.mark.slow), pytest.param(4, marks=pytest.mark.slow)]
)
def test_compatibility_suite_on_shm(world_size: int) -> None:
    run_world("commlayer.testing.conformance:main", world_size, backend="shm", timeout=240)


@pytest.mark.slow
def test_size_paths_stress_mixed_async_op_and_no_segment_left() -> None:
    """Every native op across each path switch; 1500 random mixed ops; async_op disagreeing."""
    run_world("tests.backends.shm_ranks:everything", 3, backend="shm", timeout=300, args=["1500"])


def test_ranks_placed_on_one_cpu_spread_out() -> None:
    run_world("tests.backends.shm_ranks:placement", 2, backend=None, timeout=120)  # and forked_child_exit


@pytest.mark.slow
def test_two_level_across_simulated_hosts() -> None:
    run_world("tests.backends.shm_ranks:two_level", 4, backend=None, timeout=240, args=["2"])


@pytest.mark.slow
@pytest.mark.mpi
def test_two_level_under_mpirun() -> None:
    require_mpirun()
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    run_world(
        "tests.backends.shm_ranks:two_level",
        3,
        backend=None,
        timeout=240,
        launcher="mpirun",
        env=env,
        args=["2"],
    )


@pytest.mark.parametrize("world_size", [2, 3])
def test_killed_rank_gives_every_survivor_a_clear_error_and_leaves_no_segment(world_size: int) -> None:
    timeout_s = 20.0
    before = _our_segments()
    outputs = _run_death_world(world_size, victim=world_size - 1, timeout_s=timeout_s)
    survivors = [line for out in outputs for line in out.splitlines() if line.startswith("SURVIVOR")]
    assert len(survivors) == world_size - 1, outputs
    for line in survivors:
        _, _, seconds, message = line.split(" ", 3)
        assert "shm group 'world'" in message or "group 'world'" in message, line
        assert float(seconds) < timeout_s, line
    assert _our_segments() - before == set(), "segments left in /dev/shm"


def _our_segments() -> set[str]:
    return {entry.name for entry in Path("/dev/shm").iterdir() if entry.name.startswith("commlayer-")}


def _run_death_world(world_size: int, victim: int, timeout_s: float) -> list[str]:
    port = str(free_port())
    command = [sys.executable, "-m", "tests.backends.shm_death_ranks", str(victim), str(timeout_s)]
    processes = []
    for rank in range(world_size):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "PYTHONPATH": str(REPO),
        }
        processes.append(
            subprocess.Popen(
                warm_command(command, env),
                env=env,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    deadline = time.monotonic() + timeout_s + 60
    outputs = []
    try:
        for process in processes:
            out, _ = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
            outputs.append(out)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return outputs


@pytest.mark.slow
def test_thread_sanitizer_finds_no_race_in_the_communicator(tmp_path: Path) -> None:
    """csrc/shm/race_check.cpp runs every op with one thread per rank over shared memory under TSan."""
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("no g++ to build the ThreadSanitizer check")
    source = REPO / "csrc" / "shm"
    binary = tmp_path / "race_check"
    sources = [str(source / name) for name in ("race_check.cpp", "comm.cpp", "kernels.cpp", "placement.cpp")]
    flags = ["-std=c++17", "-O1", "-g", "-fsanitize=thread", "-pthread"]
    subprocess.run([compiler, *flags, *sources, "-o", str(binary)], check=True, timeout=300)
    for ranks in (2, 3, 4):
        finished = subprocess.run(
            [str(binary), str(ranks), "400"], check=False, capture_output=True, text=True, timeout=300
        )
        report = finished.stdout + finished.stderr
        assert finished.returncode == 0 and "ThreadSanitizer" not in report, report[-4000:]
        assert f"400 ops on {ranks} ranks: all results exact" in report, report
