"""One mismatch message on every backend: the same mismatched all_reduce (rank 1: 8 elements,
rank 0: 4) on gloo, shm, mpi and ccl gives every rank the same words, up to the check that
found it::

    all_reduce on group 'world': the ranks called different collectives: rank 1 called
    all_reduce(float32[8], op sum), peer rank 0 called all_reduce(float32[4], op sum); checked by ...

docs/guides/troubleshooting.md shows this format.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from commlayer.contract.registry import list_backends
from commlayer.testing import require_mpirun, run_world

pytestmark = pytest.mark.multirank

BACKENDS = ("gloo", "shm", "mpi", "ccl")
CALLS = {0: "all_reduce(float32[4], op sum)", 1: "all_reduce(float32[8], op sum)"}


def _messages(backend: str, folder: Path) -> dict[int, str]:
    folder.mkdir()
    launcher = "mpirun" if backend == "mpi" else "local"
    run_world(
        "tests.reliability.mismatch_format_ranks:main",
        2,
        backend=backend,
        launcher=launcher,
        args=[str(folder)],
    )
    return {rank: (folder / f"rank{rank}.txt").read_text(encoding="utf-8") for rank in (0, 1)}


def test_the_same_mismatch_reads_the_same_on_every_backend(tmp_path: Path) -> None:
    available = {info.name for info in list_backends() if info.availability}
    backends = [name for name in BACKENDS if name in available]
    if "mpi" in backends:
        require_mpirun()
    missing = sorted(set(BACKENDS) - set(backends))
    assert len(backends) >= 2, f"fewer than two of {BACKENDS} run here (missing: {missing})"
    found = {backend: _messages(backend, tmp_path / backend) for backend in backends}
    for backend, messages in found.items():
        for rank, message in messages.items():
            peer = 1 - rank
            expected = (
                f"all_reduce on group 'world': the ranks called different collectives: rank {rank} "
                f"called {CALLS[rank]}, peer rank {peer} called {CALLS[peer]}; checked by "
            )
            assert message.startswith(expected), (backend, rank, message)
    words = {
        backend: {rank: m.split("; checked by ")[0] for rank, m in messages.items()}
        for backend, messages in found.items()
    }
    assert len({repr(sorted(each.items())) for each in words.values()}) == 1, words
    if missing:
        pytest.skip(f"compared {backends}; not installed or not runnable here: {missing}")
