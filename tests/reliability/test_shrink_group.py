"""shrink_group: torch's checks on its arguments, and training that goes on after a rank died.

The multi-rank test forks an unsupervised 3-rank world per backend (tests/reliability/
shrink_ranks.py): rank 1 is SIGKILLed, ranks 0 and 2 catch the PeerFailureError, shrink the
world around the dead rank and check exact collectives (sync, async, broadcast, all-gather,
barrier, a new subgroup) and torch's DDP rebuilt over the bridge on the renumbered world of two.
"""

from __future__ import annotations

import pytest

from commlayer import dist
from commlayer.core.errors import InvalidArgumentError
from tests.reliability.forked_worlds import forked_records


def test_arguments_are_checked_like_torchs(world_of_one: None) -> None:
    with pytest.raises(TypeError, match="'ranks_to_exclude' expected a list of ints, received '1'"):
        dist.shrink_group("1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"received \[\] \(an empty list\) \(rank 0\)"):
        dist.shrink_group([])
    with pytest.raises(ValueError, match=r"received \[5\] \(ranks out of range for a group of 1\)"):
        dist.shrink_group([5])
    with pytest.raises(ValueError, match=r"received \[0\] \(every rank of the group\)"):
        dist.shrink_group([0])
    with pytest.raises(InvalidArgumentError, match="'shrink_flags' expected SHRINK_DEFAULT"):
        dist.shrink_group([0], shrink_flags=7)
    assert dist.get_world_size() == 1  # nothing changed


@pytest.mark.multirank
@pytest.mark.parametrize("backend", ["gloo", "shm", pytest.param("ccl", marks=pytest.mark.ccl)])
def test_survivors_shrink_the_world_and_train_on(backend: str) -> None:
    records, output = forked_records("tests.reliability.shrink_ranks", backend)
    assert set(records) == {0, 2}, output
    for rank, new_rank in ((0, 0), (2, 1)):
        record = records[rank]
        assert "error" not in record, record["error"]
        assert record["failed_rank"] == 1 and record["checked"] and record["ddp_steps"] == 3, record
        assert (record["rank_after"], record["size_after"], record["code"]) == (new_rank, 2, 0), record
