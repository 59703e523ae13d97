"""A rank that skips a collective is named by the ranks that wait for it, on every backend.

Without debug mode, the ranks whose collective timed out ask their peers, through the store, for
the last collective each entered on the group (commlayer/facade/progress.py): the CommTimeoutError
then says which rank did not call it. shm's own wait names the rank it waited for.
"""

from __future__ import annotations

import pytest

from tests.reliability.forked_worlds import forked_records

pytestmark = pytest.mark.multirank


@pytest.mark.parametrize("backend", ["gloo", "shm", pytest.param("ccl", marks=pytest.mark.ccl)])
def test_the_skipping_rank_is_named(backend: str) -> None:
    records, output = forked_records("tests.reliability.skip_ranks", backend)
    assert set(records) == {0, 1}, output
    for rank, record in records.items():
        assert record["outcome"] == "error" and "CommTimeoutError" in record["bases"], record
        assert "all_reduce" in record["message"] and f"rank {rank}" in record["message"], record
        assert "rank 2 did not" in record["message"], record
