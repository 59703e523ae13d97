"""Tier 3 for ZeRO: real multi-rank training on gloo, checked against single-process training.

One world of 4 then one world of 2 (each runs many checks, see tests/zero/zero_training_ranks.py);
the world of 2 resumes the checkpoints the world of 4 wrote.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from commlayer.testing import require_mpirun, run_world


@pytest.mark.multirank
def test_stages_match_single_process_and_checkpoints_reshard_from_4_to_2(tmp_path: Path) -> None:
    run_world(
        "tests.zero.zero_training_ranks:world4",
        world_size=4,
        backend="gloo",
        timeout=300,
        args=[str(tmp_path)],
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".stage2.A",  # the version directories the tags link to (commlayer.zero.versions)
        ".stage3.A",
        "latest",
        "stage2",
        "stage3",
        "uninterrupted_stage2.pt",
        "uninterrupted_stage3.pt",
    ]
    files = ["common.pt", "meta.json", "rank_0.pt", "rank_1.pt", "rank_2.pt", "rank_3.pt"]
    checksums = [f"{name}.sha256" for name in files if name.endswith(".pt")]
    assert sorted(p.name for p in (tmp_path / "stage3").iterdir()) == sorted(files + checksums)
    run_world(
        "tests.zero.zero_training_ranks:world2",
        world_size=2,
        backend="gloo",
        timeout=300,
        args=[str(tmp_path)],
    )


@pytest.mark.multirank
@pytest.mark.mpi
def test_stages_match_single_process_on_the_mpi_backend() -> None:
    require_mpirun()
    run_world(
        "tests.zero.zero_training_mpi_ranks:main", world_size=2, backend="mpi", launcher="mpirun", timeout=300
    )
