"""The flight-recorder watchdog dumps ranks blocked inside a collective: SIGUSR1 to a 3-rank
world in which rank 1 sleeps and ranks 0 and 2 wait in all_reduce gives three dumps within 2 s,
in one job folder, on every CPU backend, and ``trace analyze`` names the sleeping rank; in the same
world, the arrivals of a rank that sleeps before each call name it as the one furthest behind (the
rank code is in watchdog_ranks.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from commlayer.contract.registry import list_backends
from commlayer.testing import require_mpirun, run_world

pytestmark = pytest.mark.multirank

_AVAILABLE = {info.name for info in list_backends() if info.availability}


@pytest.mark.parametrize(
    "backend",
    [
        "gloo",
        "shm",
        pytest.param("ccl", marks=pytest.mark.ccl),
        pytest.param("mpi", marks=pytest.mark.mpi),
    ],
)
def test_sigusr1_dumps_blocked_ranks_and_arrivals_name_a_late_one(backend: str, tmp_path: Path) -> None:
    if backend not in _AVAILABLE:
        pytest.skip(f"backend {backend!r} is not available here")
    launcher = "mpirun" if backend == "mpi" else "local"
    if launcher == "mpirun":
        require_mpirun()
    env = {"COMMLAYER_TRACE_DIR": str(tmp_path), "COMMLAYER_JOB_ID": ""}
    target = "tests.observability.watchdog_ranks:blocked_then_late"
    run_world(target, 3, backend=backend, launcher=launcher, env=env, timeout=120)
    assert len([folder for folder in tmp_path.iterdir() if folder.is_dir()]) == 1, list(tmp_path.iterdir())
