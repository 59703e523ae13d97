"""torch.profiler shows each collective once, named and shaped as torch's, on every backend.

One world per backend runs the same calls on raw torch.distributed (gloo) and on commlayer, each
under a profiler, and compares the events and the results.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from commlayer.testing import require_mpirun, run_world

pytestmark = pytest.mark.multirank

TARGET = "tests.observability.profiler_ranks:main"


@pytest.mark.parametrize("backend", ["gloo", "shm", "ccl"])
def test_profiler_events_match_torch(backend: str, tmp_path: Path) -> None:
    run_world(TARGET, 2, backend=backend, timeout=120, args=[str(tmp_path / "store")])


@pytest.mark.mpi
def test_profiler_events_match_torch_on_mpi(tmp_path: Path) -> None:
    require_mpirun()
    run_world(TARGET, 2, backend="mpi", launcher="mpirun", timeout=120, args=[str(tmp_path / "store")])
