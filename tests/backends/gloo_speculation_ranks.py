"""Rank code of test_gloo_speculation: gloo's blocking collectives entered before the last
rank's signature is published (speculation), with the last rank matching or not.

Ranks 0..n-2 call at once and speculate; rank n-1 calls 0.3 s later. Every case is run once with
matching calls (exact results everywhere) and once per kind of mismatch (every rank raises
CollectiveMismatchError, the late rank's tensors untouched); after each, one matching call with
distinct values proves the group still pairs its calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from commlayer import dist
from commlayer.core.errors import CollectiveMismatchError

LATE_S = 0.3
Call = Callable[[int, int, torch.dtype], tuple[torch.Tensor, torch.Tensor]]


def _values(rank: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    return (torch.arange(count) + 100 * rank + 1).to(dtype)


def _all_reduce(rank: int, count: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    tensor = _values(rank, count, dtype)
    dist.all_reduce(tensor)
    size = dist.get_world_size()
    return tensor, sum(_values(r, count, dtype) for r in range(size))


def _all_gather(rank: int, count: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    size = dist.get_world_size()
    output = torch.zeros(count * size, dtype=dtype)
    dist.all_gather_into_tensor(output, _values(rank, count, dtype))
    return output, torch.cat([_values(r, count, dtype) for r in range(size)])


def _reduce_scatter(rank: int, count: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    size = dist.get_world_size()
    output = torch.zeros(count, dtype=dtype)
    dist.reduce_scatter_tensor(output, _values(rank, count * size, dtype))
    total = sum(_values(r, count * size, dtype) for r in range(size))
    return output, total[rank * count : (rank + 1) * count]


def _all_to_all(rank: int, count: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    size = dist.get_world_size()
    output = torch.zeros(count * size, dtype=dtype)
    dist.all_to_all_single(output, _values(rank, count * size, dtype))
    chunks = [_values(r, count * size, dtype)[rank * count : (rank + 1) * count] for r in range(size)]
    return output, torch.cat(chunks)


def _broadcast(rank: int, count: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    root = dist.get_world_size() - 1  # the late rank: a root never speculates
    tensor = _values(rank, count, dtype)
    dist.broadcast(tensor, src=root)
    return tensor, _values(root, count, dtype)


CALLS: dict[str, Call] = {
    "all_reduce": _all_reduce,
    "all_gather_into_tensor": _all_gather,
    "reduce_scatter_tensor": _reduce_scatter,
    "all_to_all_single": _all_to_all,
    "broadcast": _broadcast,
}
# What the late rank calls instead: (count, dtype, op), None keeping the speculators'.
MISMATCHES = {
    "fewer elements": (2, None, None),
    "more elements": (9, None, None),
    "another dtype": (None, torch.int32, None),
    "another op": (None, None, "all_reduce"),
}


def _late(rank: int) -> bool:
    return rank == dist.get_world_size() - 1


def _matching(name: str, call: Call, rank: int) -> None:
    if _late(rank):
        time.sleep(LATE_S)
    got, expected = call(rank, 4, torch.float32)
    assert torch.equal(got, expected), f"rank {rank}: {name}: {got.tolist()} != {expected.tolist()}"


def _mismatched(name: str, call: Call, rank: int, kind: str) -> None:
    count, dtype, other = MISMATCHES[kind]
    late = _late(rank)
    if late and other == name:
        other = "broadcast"
    if late:
        time.sleep(LATE_S)
        call = CALLS[other] if other else call
    try:
        call(rank, count or 4 if late else 4, dtype or torch.float32 if late else torch.float32)
    except CollectiveMismatchError as error:
        ending = "before any data moved" if late else "after this rank's call ran"
        assert ending in str(error), f"rank {rank}: {name}, {kind}: {error}"
    else:
        raise AssertionError(f"rank {rank}: {name} with {kind} on the late rank returned")


def main() -> None:
    rank = dist.get_rank()
    for name, call in CALLS.items():
        call(rank, 4, torch.float32)  # the first call builds the plan the later ones speculate in
        _matching(name, call, rank)
        for kind in MISMATCHES:
            _mismatched(name, call, rank, kind)
            _matching(name, call, rank)
