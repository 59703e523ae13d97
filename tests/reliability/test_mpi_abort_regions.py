"""A job that Intel MPI ends with MPI_Abort leaves no libfabric region in /dev/shm, not even the
one of the rank the launcher killed: the aborting rank removes those of every rank of its host.

The world is tests/test_faults.py's (two ranks under mpirun, the last one skipping a blocking
reduce_scatter_tensor that its peer entered speculatively, so the watchdog aborts); that harness removes the killed rank's regions itself, so here that removal only
records what it would have removed, which must be nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from commlayer.testing import require_mpirun
from tests.reliability import test_faults

pytestmark = [pytest.mark.multirank, pytest.mark.mpi]


def test_an_aborted_intel_mpi_job_leaves_no_region(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    require_mpirun()
    monkeypatch.setenv("COMMLAYER_MPI", "intel-mpi")
    left: list[str] = []

    def record_leftovers(pids: list[int]) -> None:
        wanted = {str(pid) for pid in pids}
        left.extend(entry.name for entry in Path("/dev/shm").iterdir() if entry.name.split(":")[0] in wanted)

    monkeypatch.setattr(test_faults, "release_regions_of", record_leftovers)
    outcome = test_faults.run_fault_world("mpi", "skip_speculated", tmp_path, launcher_kills=True)
    assert "ending the job with MPI_Abort" in outcome.output, outcome.output
    assert outcome.fault is not None, outcome.output
    assert left == [], f"regions of the killed rank left behind: {left}"
