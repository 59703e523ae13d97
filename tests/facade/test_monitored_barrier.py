"""monitored_barrier against torch's own gloo on the same calls in the same world of 3: with the
peers alive but absent and wait_all_ranks=True, both raise torch's type naming every missing
rank (``[Rank 0]: Ranks 1, 2 failed to pass monitoredBarrier in 1000 ms``); once the peers have
exited, both raise what gloo raises (a RuntimeError, "Connection closed by peer"), never a
PeerFailureError, with and without wait_all_ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

from commlayer.testing import run_world

pytestmark = pytest.mark.multirank


@pytest.mark.parametrize("backend", ["gloo", "shm"])
def test_exited_peers_are_reported_as_torch_reports_them(backend: str, tmp_path: Path) -> None:
    run_world(
        "tests.facade.monitored_barrier_ranks:main",
        3,
        backend=None,
        timeout=120,
        args=[backend, str(tmp_path / "store")],
    )
