"""Uneven collectives: the size digest (pure logic), bad arguments (wiring, one rank) and mismatched
size lists raising on every rank of real worlds. Exact results on every backend at 2-4 ranks come
from the conformance suite, which every backend's tests run (commlayer.testing.conformance)."""

from __future__ import annotations

import pytest
import torch

from commlayer.facade.ops.uneven import size_digest
from commlayer.testing import mpirun_unavailable_reason, run_world
from commlayer.testing.conformance.uneven_checks import part_sizes

RANKS = "tests.facade.uneven_collectives_ranks"


def test_equal_size_lists_give_equal_digests() -> None:
    assert size_digest("all_gather_v", [1, 2], torch.float32) == size_digest(
        "all_gather_v", [1, 2], torch.float32
    )
    assert 0 <= size_digest("all_gather_v", [1, 2], torch.float32) < 1 << 62


@pytest.mark.parametrize(
    "other",
    [
        ("all_gather_v", [2, 1], torch.float32),
        ("all_gather_v", [1, 2], torch.int32),
        ("reduce_scatter_v", [1, 2], torch.float32),
    ],
)
def test_any_difference_changes_the_digest(other: tuple) -> None:
    assert size_digest("all_gather_v", [1, 2], torch.float32) != size_digest(*other)


def test_conformance_parts_differ_and_one_is_empty() -> None:
    assert part_sizes(4) == [2, 0, 8, 4]
    assert len(set(part_sizes(4))) == 4


@pytest.mark.multirank
@pytest.mark.parametrize("backend", ["gloo", "shm"])
def test_mismatched_sizes_raise_on_every_rank(backend: str) -> None:
    run_world(f"{RANKS}:mismatched_sizes", 3, backend=backend, timeout=120)


@pytest.mark.multirank
@pytest.mark.mpi
def test_mismatched_sizes_raise_on_every_rank_on_mpi() -> None:
    reason = mpirun_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    run_world(f"{RANKS}:mismatched_sizes", 3, backend="mpi", launcher="mpirun", timeout=120)


@pytest.mark.multirank
@pytest.mark.ccl
def test_mismatched_sizes_raise_on_every_rank_on_ccl() -> None:
    pytest.importorskip("commlayer.backends.ccl._C")
    run_world(f"{RANKS}:mismatched_sizes", 3, backend="ccl", timeout=120)
