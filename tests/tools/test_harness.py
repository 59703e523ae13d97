"""commlayer.testing.run_world: tier 1 (argument checks, mpirun plans, results files) and tier 3
(real worlds: success, a raising rank, a timeout, a hard exit, an early exit, mpirun with each MPI).

Rank bodies live in tests/tools/harness_ranks.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from commlayer.core.shm_files import release_dead_regions, release_stale_regions
from commlayer.testing import MpirunError, mpirun_plan, require_mpirun, run_world
from commlayer.testing.results import ResultsDir

TARGETS = "tests.tools.harness_ranks"
OPENMPI = {"COMMLAYER_MPI": "openmpi"}


def failure_of(target: str, world_size: int, **options: object) -> str:
    with pytest.raises(AssertionError) as caught:
        run_world(f"{TARGETS}:{target}", world_size, **options)
    return str(caught.value)


def still_running(message: str) -> set[int]:
    found = re.search(r"with ranks? ([\d, ]+) still running", message)
    assert found is not None, message
    return {int(rank) for rank in found.group(1).split(", ")}


# ---- tier 1 ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "complaint"),
    [
        ((f"{TARGETS}.check_environment", 2), "argument 'target' expected 'package.module:function'"),
        ((f"{TARGETS}:check_environment", 0), "argument 'world_size' expected an integer >= 1, received 0"),
        ((f"{TARGETS}:check_environment", 2, {"launcher": "ssh"}), "argument 'launcher' expected one of"),
        (
            (f"{TARGETS}:check_environment", 2, {"timeout": 0}),
            "argument 'timeout' expected a positive number",
        ),
        (
            (f"{TARGETS}:check_environment", 2, {"args": "3"}),
            "argument 'args' expected a sequence of strings",
        ),
    ],
)
def test_bad_arguments_fail_before_spawning(arguments: tuple, complaint: str) -> None:
    positional, options = (arguments[:2], arguments[2] if len(arguments) > 2 else {})
    with pytest.raises(ValueError, match=re.escape(f"run_world: {complaint}")):
        run_world(*positional, **options)


def test_vanished_ranks_are_the_started_unfinished_and_gone(tmp_path: Path) -> None:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    results = ResultsDir(tmp_path)
    results.mark_started(0, os.getpid())  # alive, unfinished
    results.mark_started(1, int(gone.stdout))  # gone, unfinished: vanished
    results.mark_started(2, int(gone.stdout))  # gone but finished
    results.mark_done(2)
    results.mark_started(3, int(gone.stdout))  # gone after raising
    results.write_traceback(3, "Traceback ...\nValueError: x\n")
    assert results.vanished() == [1]
    assert results.tracebacks() == {3: "Traceback ...\nValueError: x\n"}
    assert results.done() == {2}


def test_openmpi_plan_pairs_its_launcher_with_its_library() -> None:
    require_mpirun()
    plan = mpirun_plan(3, {**os.environ, **OPENMPI})
    assert plan.flavor == "openmpi"
    assert plan.argv[1:] == ("-n", "3", "--oversubscribe", "--bind-to", "none", "--tag-output")
    assert plan.env["MPI4PY_LIBMPI"].endswith("libmpi.so.40")


@pytest.mark.parametrize(
    ("env", "complaint"),
    [
        ({"COMMLAYER_MPI": "lam"}, "COMMLAYER_MPI: expected one of"),
        ({"COMMLAYER_MPIRUN": "/nonexistent/mpirun"}, "COMMLAYER_MPIRUN: expected an executable mpirun"),
        ({**OPENMPI, "COMMLAYER_MPIRUN": "mpiexec.hydra"}, "the ranks load openmpi but"),
        (
            {"COMMLAYER_MPI": "intel-mpi", "MPI4PY_LIBMPI": str(Path(sys.prefix) / "lib" / "libmpi.so.40")},
            "but mpi4py loads openmpi",
        ),
    ],
)
def test_mismatched_or_missing_mpi_is_refused(env: dict[str, str], complaint: str) -> None:
    require_mpirun()
    with pytest.raises(MpirunError, match=re.escape(complaint)):
        mpirun_plan(2, {**os.environ, **env})


# ---- tier 3: local worlds ----------------------------------------------------------------------


@pytest.mark.multirank
def test_default_backend_world_gets_args_env_and_an_initialised_facade() -> None:
    run_world(
        f"{TARGETS}:check_environment",
        3,
        args=["3", "--flag", "two words"],
        env={"COMMLAYER_TEST_MARKER": "from-env-argument"},
    )


@pytest.mark.multirank
def test_backend_none_leaves_init_to_the_function() -> None:
    run_world(f"{TARGETS}:torch_collectives", 2, backend=None)


@pytest.mark.multirank
def test_raising_rank_shows_its_traceback_and_the_others_are_stopped() -> None:
    message = failure_of("raise_on", 3, backend=None, args=["1"])
    assert "failed: rank 1 raised; the harness stopped rank 0, rank 2" in message
    assert "---- rank 1 traceback ----" in message
    assert 'raise ValueError(f"deliberate failure on rank {failing_rank}")' in message
    assert "ValueError: deliberate failure on rank 1" in message
    for rank in (0, 2):
        assert f"---- rank {rank} output (exit code -15, stopped by the harness)" in message


@pytest.mark.multirank
def test_timeout_names_the_ranks_still_running() -> None:
    message = failure_of("sleep_on", 2, backend=None, args=["1"], timeout=5)
    assert "failed: timed out after 5s with rank" in message
    assert 1 in still_running(message)  # rank 0 too if the machine was too busy to start it in time
    assert "---- rank 1 output (exit code -15, stopped by the harness)" in message


@pytest.mark.multirank
def test_hard_exit_is_reported_without_a_traceback() -> None:
    message = failure_of("hard_exit_on", 2, backend=None, args=["0", "7"])
    assert (
        "failed: rank 0 exited with code 7 before its target returned, without a Python traceback "
        "(os._exit, a crash or a signal); the harness stopped rank 1"
    ) in message
    assert "---- rank 0 output (exit code 7)" in message
    assert "traceback ----" not in message


@pytest.mark.multirank
def test_exit_zero_before_the_target_returns_is_a_failure() -> None:
    message = failure_of("hard_exit_on", 2, backend=None, args=["1", "0"])
    assert (
        "failed: rank 1 exited with code 0 before its target returned, without a Python traceback" in message
    )
    assert "the harness stopped rank 0" in message


# ---- tier 3: mpirun worlds ---------------------------------------------------------------------


@pytest.mark.multirank
@pytest.mark.mpi
@pytest.mark.parametrize("env", [{}, OPENMPI], ids=["default-mpi", "openmpi"])
def test_mpirun_world_is_one_mpi_world(env: dict[str, str]) -> None:
    require_mpirun()
    run_world(f"{TARGETS}:mpi_world", 3, launcher="mpirun", env=env)


@pytest.mark.multirank
@pytest.mark.mpi
def test_mpirun_raising_rank_stops_the_job() -> None:
    # Intel MPI's Hydra would wait for the blocked ranks forever; the harness notices the traceback.
    require_mpirun()
    message = failure_of("raise_on", 3, backend=None, launcher="mpirun", args=["2"])
    assert "failed: rank 2 raised" in message
    assert "ValueError: deliberate failure on rank 2" in message
    assert "---- mpirun output (exit code" in message


@pytest.mark.multirank
@pytest.mark.mpi
def test_mpirun_hard_exit_is_noticed() -> None:
    require_mpirun()
    message = failure_of("hard_exit_on", 2, backend=None, launcher="mpirun", args=["1", "9"])
    assert "failed: rank 1 exited before its target returned, without a Python traceback" in message


def _regions(folder: Path) -> tuple[str, str, str, str]:
    """Entries of a /dev/shm stand-in: an exited process's new region and its old one (modified
    in 1970), this process's region, and a file that is no libfabric region."""
    exited, old, mine, other = "4194999:0:0", "4194998:0:0", f"{os.getpid()}:0:0", "sm_segment.vm.0"
    for name in (exited, old, mine, other):
        (folder / name).write_bytes(b"")
    os.utime(folder / old, (1.0, 1.0))
    return exited, old, mine, other


def test_release_dead_regions_removes_every_region_of_an_exited_process_of_this_user(tmp_path: Path) -> None:
    exited, old, mine, other = _regions(tmp_path)
    if os.getuid() == 0:  # another user's region stays, whatever its process
        (tmp_path / "4194997:0:0").write_bytes(b"")
        os.chown(tmp_path / "4194997:0:0", 4242, -1)
    removed = release_dead_regions(directory=tmp_path)
    assert sorted(removed) == sorted([tmp_path / exited, tmp_path / old])
    assert {mine, other} <= {entry.name for entry in tmp_path.iterdir()}


def test_release_stale_regions_removes_only_new_regions_of_exited_processes(tmp_path: Path) -> None:
    exited, old, mine, other = _regions(tmp_path)
    removed = release_stale_regions(created_after=10.0, directory=tmp_path)
    assert removed == [tmp_path / exited]
    assert sorted(entry.name for entry in tmp_path.iterdir()) == sorted([old, mine, other])
