"""Rank bodies of the uneven-collective tests (tests/facade/test_uneven_collectives.py)."""

from __future__ import annotations

import torch

from commlayer import dist
from commlayer.core.errors import CollectiveMismatchError


def mismatched_sizes() -> None:
    """The last rank passes other sizes: every rank raises, and the group works afterwards."""
    rank, size = dist.get_rank(), dist.get_world_size()
    sizes = [rank_ + 1 for rank_ in range(size)]
    if rank == size - 1:
        sizes[0] += 1  # this rank believes rank 0 sends one more element
    mine = torch.full((sizes[rank],), float(rank))
    outputs = [torch.full((n,), -1.0) for n in sizes]
    _expect_mismatch(lambda: dist.all_gather_v(outputs, mine))
    assert all(bool((output == -1).all()) for output in outputs), "outputs were written"
    chunks = [torch.ones(n) for n in sizes]
    _expect_mismatch(lambda: dist.reduce_scatter_v(torch.zeros(sizes[rank]), chunks))
    flat = torch.zeros(sum(sizes))
    _expect_mismatch(lambda: dist.all_gather_into_tensor(flat, mine, sizes=sizes))
    agreed = [r + 1 for r in range(size)]
    gathered = [torch.empty(n) for n in agreed]
    dist.all_gather_v(gathered, torch.full((agreed[rank],), float(rank)))
    for peer, part in enumerate(gathered):
        assert torch.equal(part, torch.full((agreed[peer],), float(peer))), (peer, part)


def _expect_mismatch(call) -> None:  # type: ignore[no-untyped-def]
    try:
        call()
    except CollectiveMismatchError as error:
        assert "different sizes" in str(error), error
        return
    raise AssertionError(f"rank {dist.get_rank()}: no CollectiveMismatchError")
