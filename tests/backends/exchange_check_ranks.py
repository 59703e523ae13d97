"""Rank code of test_exchange_check: 2 ranks exchange uneven counts (all_to_all_single) and, on
gloo, tensor lists (gloo takes lists of one size per rank); a pair that disagrees on a count makes
both ranks raise before any data moves, and the group goes on."""

from __future__ import annotations

import torch

from commlayer import dist
from commlayer.core.errors import CollectiveMismatchError

#: SENDS[s][d]: elements rank s sends rank d in the matching all_to_all_single.
SENDS = ((1, 3), (2, 4))
#: Elements every rank sends every rank in the matching all_to_all.
LISTED = 2


def _chunk(sender: int, receiver: int, count: int) -> torch.Tensor:
    return torch.arange(count, dtype=torch.float32) + 100 * sender + 10 * receiver


def _single(rank: int, expected_from_0: int) -> torch.Tensor:
    source = torch.cat([_chunk(rank, peer, SENDS[rank][peer]) for peer in (0, 1)])
    receives = [expected_from_0 if rank == 1 else SENDS[0][rank], SENDS[1][rank]]
    output = torch.full((sum(receives),), -1.0)
    dist.all_to_all_single(output, source, output_split_sizes=receives, input_split_sizes=list(SENDS[rank]))
    return output


def _lists(rank: int, expected_from_0: int) -> list[torch.Tensor]:
    inputs = [_chunk(rank, peer, LISTED) for peer in (0, 1)]
    outputs = [torch.full((expected_from_0 if rank == 1 else LISTED,), -1.0) for _ in (0, 1)]
    dist.all_to_all(outputs, inputs)
    return outputs


def _one_rank_even(rank: int) -> None:
    """Rank 0 sends and receives 2 elements per rank (even), rank 1 keeps 5 for itself (uneven):
    a valid call whose ranks must still take one path."""
    sends = ((2, 2), (2, 5))[rank]
    source = torch.cat([_chunk(rank, peer, sends[peer]) for peer in (0, 1)])
    receives = [2, sends[1]]
    output = torch.full((sum(receives),), -1.0)
    dist.all_to_all_single(output, source, output_split_sizes=receives, input_split_sizes=list(sends))
    assert torch.equal(output, torch.cat([_chunk(0, rank, 2), _chunk(1, rank, receives[1])])), f"rank {rank}"


def _expected(rank: int, counts: tuple[int, int]) -> list[torch.Tensor]:
    return [_chunk(sender, rank, counts[sender]) for sender in (0, 1)]


def _refused(rank: int, exchange, name: str, sent_to_1: int) -> None:
    try:
        exchange(rank, sent_to_1 + 2)  # rank 1 expects two more elements from rank 0 than it gets
    except CollectiveMismatchError as error:
        expected = "expecting" if rank == 1 else "sending"
        assert f"{name} on group 'world'" in str(error) and expected in str(error), f"rank {rank}: {error}"
        assert "before any data moved" in str(error), f"rank {rank}: {error}"
    else:
        raise AssertionError(f"rank {rank}: a mismatched uneven {name} returned")


def main(lists: str) -> None:
    """``lists``: "1" to exchange tensor lists too."""
    rank = dist.get_rank()
    received = (SENDS[0][rank], SENDS[1][rank])
    for _ in range(2):
        _one_rank_even(rank)
        assert torch.equal(_single(rank, SENDS[0][1]), torch.cat(_expected(rank, received)))
        _refused(rank, _single, "all_to_all_single", SENDS[0][1])
        if lists == "1":
            assert all(map(torch.equal, _lists(rank, LISTED), _expected(rank, (LISTED, LISTED))))
            _refused(rank, _lists, "all_to_all", LISTED)
    dist.barrier()
