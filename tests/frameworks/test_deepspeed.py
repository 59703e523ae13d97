"""DeepSpeed ZeRO-2 and ZeRO-3 on commlayer (``init_distributed(dist_backend="commlayer")``): the
final loss equals the same run on torch's gloo, 2 ranks on shm (local launch) and on mpi (mpirun)."""

from __future__ import annotations

import pytest

from commlayer.testing import require_mpirun, run_world
from tests.frameworks.launchers import free_port

pytestmark = [pytest.mark.frameworks, pytest.mark.multirank]
pytest.importorskip("deepspeed")


def test_zero2_and_zero3_on_shm_equal_gloo() -> None:
    run_world(
        "tests.frameworks.deepspeed_ranks:main",
        2,
        backend=None,
        timeout=300,
        env={"COMMLAYER_BACKEND": "shm"},
    )


@pytest.mark.mpi
def test_zero2_and_zero3_on_mpi_under_mpirun_equal_gloo() -> None:
    require_mpirun()
    job = {"COMMLAYER_BACKEND": "mpi", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    run_world(
        "tests.frameworks.deepspeed_ranks:main", 2, backend=None, timeout=300, launcher="mpirun", env=job
    )
