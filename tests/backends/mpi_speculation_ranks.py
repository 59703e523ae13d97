"""Rank-side checks of the mpi check's speculation (backends/mpi/shared_signatures.py), run inside
tests/backends/mpi_ranks.py's world: ranks that enter a call before a late peer has published must
still end, with every rank raising the mismatch and no input touched, when that peer disagrees."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import torch

from commlayer import dist
from commlayer.backends.mpi import MpiOptions
from commlayer.backends.mpi import native_fast_paths as _native
from commlayer.core.errors import CollectiveMismatchError

_LATE_S = 0.2  # the disagreeing rank's delay: every other rank has entered its call by then
_SPECULATED = "after this rank had entered its call, before every peer had published"

# op -> (input elements, output elements) for ``n`` elements a rank in a world of ``w``
_SHAPES: dict[str, Callable[[int, int], tuple[int, int]]] = {
    "reduce_scatter_tensor": lambda n, w: (n * w, n),
    "all_gather_into_tensor": lambda n, w: (n, n * w),
    "all_to_all_single": lambda n, w: (n * w, n * w),
}


def check_speculating_ranks_complete_and_raise() -> None:
    """On an ordered group, the last rank arrives late with a different element count (synchronous,
    or asynchronous on the worker). The others have entered the call by then -- broadcast's root
    and the two-tensor ops' ranks through the C launcher's speculation, the rest waiting. Every
    rank raises CollectiveMismatchError; every input is untouched, and so is every output of a
    rank that did not speculate; a speculator's error says its output is undefined. The group
    gives exact results afterwards."""
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(list(range(world)), pg_options=MpiOptions("ordered"))
    speculation = _native.native_enabled() and group.primary_backend._check.shared is not None
    late = rank == world - 1
    for round_index, op in enumerate((*_SHAPES, "broadcast")):
        elements = 3 if late else 2
        async_op = late and round_index % 2 == 1
        speculates = speculation and not late and (op != "broadcast" or rank == 0)
        _check_one(op, group, rank, world, elements, late, async_op, speculates)
    _check_the_group_still_agrees(group, rank, world)
    _check_mismatches_among_agreeing_calls(group, rank, world)
    dist.destroy_process_group(group)


def _check_mismatches_among_agreeing_calls(group: Any, rank: int, world: int, steps: int = 300) -> None:
    """The four speculating ops and all_reduce in a random order, each rank late by a random few
    microseconds, and one step in five a random rank's count is off by one: every agreeing step
    gives exact results, every mismatched one raises on every rank, and the slots stay in step."""
    calls, delays = random.Random(2027), random.Random(11 + rank)
    for step in range(steps):
        op = calls.choice((*_SHAPES, "broadcast", "all_reduce"))
        odd_one = calls.randrange(world) if calls.random() < 0.2 else -1
        elements = 3 if rank == odd_one else 2
        deadline = time.perf_counter() + delays.random() * 2e-4
        while time.perf_counter() < deadline:
            pass
        try:
            result = _agreeing_call(op, group, rank, world, elements)
        except CollectiveMismatchError:
            assert odd_one >= 0, (step, op, rank)
            continue
        assert odd_one < 0, (step, op, rank, "a mismatched call returned")
        assert torch.equal(result, _expected(op, rank, world, elements)), (step, op, rank, result)


def _agreeing_call(op: str, group: Any, rank: int, world: int, elements: int) -> torch.Tensor:
    if op in ("broadcast", "all_reduce"):
        tensor = _distinct(rank, elements)
        if op == "broadcast":
            dist.broadcast(tensor, 0, group=group)
        else:
            dist.all_reduce(tensor, group=group)
        return tensor
    input_numel, output_numel = _SHAPES[op](elements, world)
    output = torch.zeros(output_numel, dtype=torch.float64)
    getattr(dist, op)(output, _distinct(rank, input_numel), group=group)
    return output


def _expected(op: str, rank: int, world: int, elements: int) -> torch.Tensor:
    if op == "broadcast":
        return _distinct(0, elements)
    if op == "all_reduce":
        return sum(_distinct(peer, elements) for peer in range(world))
    if op == "reduce_scatter_tensor":
        return sum(_distinct(peer, elements * world) for peer in range(world))[elements * rank :][:elements]
    if op == "all_gather_into_tensor":
        return torch.cat([_distinct(peer, elements) for peer in range(world)])
    return torch.cat(
        [_distinct(peer, elements * world)[elements * rank :][:elements] for peer in range(world)]
    )


def _check_one(
    op: str, group: Any, rank: int, world: int, elements: int, late: bool, async_op: bool, speculates: bool
) -> None:
    if op == "broadcast":
        tensor = _distinct(rank, elements)
        inputs, outputs, call = [tensor], [] if rank == 0 else [tensor], dist.broadcast
        arguments: tuple[Any, ...] = (tensor, 0)
    else:
        input_numel, output_numel = _SHAPES[op](elements, world)
        source, output = _distinct(rank, input_numel), torch.full((output_numel,), -1.0, dtype=torch.float64)
        inputs, outputs, arguments = [source], [output], (output, source)
        call = getattr(dist, op)
    before = [tensor.clone() for tensor in inputs + outputs]
    if late:
        time.sleep(_LATE_S)
    try:
        work = call(*arguments, group=group, async_op=async_op)
        assert work is None or work.wait()
    except CollectiveMismatchError as error:
        text = str(error)
        assert "peer rank" in text and f"collectives: rank {rank} called" in text, (op, text)
        assert (_SPECULATED in text) == speculates, (op, rank, speculates, text)
    else:
        raise AssertionError(f"rank {rank}: a mismatched {op} returned")
    kept = inputs if speculates else inputs + outputs
    for tensor, original in zip(kept, before, strict=False):
        assert torch.equal(tensor, original), (op, rank, tensor, original)


def _check_the_group_still_agrees(group: Any, rank: int, world: int) -> None:
    source = _distinct(rank, 2 * world)
    chunk = torch.zeros(2, dtype=torch.float64)
    dist.reduce_scatter_tensor(chunk, source, group=group)
    everyone = sum(_distinct(peer, 2 * world) for peer in range(world))
    assert torch.equal(chunk, everyone[2 * rank : 2 * rank + 2]), chunk
    tensor = _distinct(rank, 4)
    dist.broadcast(tensor, 0, group=group)
    assert torch.equal(tensor, _distinct(0, 4)), tensor


def _distinct(rank: int, numel: int) -> torch.Tensor:
    return (rank * 1000 + torch.arange(numel) + 1).to(torch.float64)
