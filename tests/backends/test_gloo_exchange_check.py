"""gloo's default check compares every pair's element count of an uneven all_to_all_single and
of a list all_to_all: a disagreeing pair raises CollectiveMismatchError on both ranks before any
data moves, and the next exchange is exact. Rank code: gloo_exchange_ranks.py."""

from __future__ import annotations

import pytest

from commlayer.testing import run_world


@pytest.mark.multirank
def test_uneven_exchanges_with_a_disagreeing_pair_raise_on_both_ranks() -> None:
    run_world("tests.backends.gloo_exchange_ranks:main", 2, backend="gloo", timeout=120)
