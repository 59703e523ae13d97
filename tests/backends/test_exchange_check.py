"""The default check of an uneven exchange: every pair's element count of an uneven
all_to_all_single (gloo, and shm through its gloo companion) and of a list all_to_all (gloo) is
compared before any data moves; a disagreeing pair raises CollectiveMismatchError on both ranks,
and the next exchange is exact. A valid call whose ranks list even splits on one rank and uneven
on the other is exact too: every rank takes one path whatever its own splits. Rank code:
exchange_check_ranks.py."""

from __future__ import annotations

import pytest

from commlayer.testing import run_world


@pytest.mark.multirank
@pytest.mark.parametrize(("backend", "lists"), [("gloo", "1"), ("shm", "0")])
def test_uneven_exchanges_with_a_disagreeing_pair_raise_on_both_ranks(backend: str, lists: str) -> None:
    run_world("tests.backends.exchange_check_ranks:main", 2, backend=backend, args=[lists], timeout=120)
