"""Rank code of test_torch_fidelity: bad inputs and edge inputs run on raw torch.distributed
(gloo) and on commlayer in the same world; the errors' types and leading words and the results
are compared.

The reference is torch's default group over a FileStore (``path``) beside the commlayer world;
on commlayer's gloo backend, which owns torch's default group, a torch gloo group of its own.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as torch_dist

from commlayer import dist
from commlayer.core.errors import CommTimeoutError


def main(path: str) -> None:
    rank, size = dist.get_rank(), dist.get_world_size()
    reference = torch_reference(path)
    _errors_worded_as_torch(reference, rank)
    _accepted_as_torch(reference, rank, size)
    _torch_groups_accepted(rank, size)
    _monitored_barrier_names_the_missing_rank(reference, rank)
    if reference is None:
        torch_dist.destroy_process_group()


def torch_reference(path: str) -> Any:
    """torch's own gloo beside the commlayer world: torch's default group over a FileStore at
    ``path`` (returned as None, the default), or on commlayer's gloo, which owns torch's default
    group, a torch gloo group of its own."""
    if torch_dist.is_initialized():
        return torch_dist.new_group(backend="gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch_dist.init_process_group("gloo", store=torch_dist.FileStore(path, size), rank=rank, world_size=size)
    return None


def raised(call: Callable[[], Any]) -> BaseException:
    try:
        call()
    except Exception as error:  # noqa: BLE001 - the error is what is compared
        return error
    raise AssertionError(f"{call} raised nothing")


def _same_error(case: str, ours: Callable[[], Any], theirs: Callable[[], Any], worded: bool = True) -> None:
    """Ours is an instance of torch's type and (``worded``) starts with torch's message."""
    expected, got = raised(theirs), raised(ours)
    assert isinstance(got, type(expected)), (case, type(got), type(expected), got, expected)
    assert not worded or str(got).startswith(str(expected)), (case, str(got), str(expected))


def _errors_worded_as_torch(reference: Any, rank: int) -> None:
    complex_tensor = torch.ones(2, dtype=torch.complex64)
    for op in ("MAX", "MIN", "PRODUCT"):
        _same_error(
            f"complex {op}",
            lambda op=op: dist.all_reduce(complex_tensor.clone(), op=getattr(dist.ReduceOp, op)),
            lambda op=op: torch_dist.all_reduce(
                complex_tensor.clone(), op=getattr(torch_dist.ReduceOp, op), group=reference
            ),
        )
    _same_error(
        "coalesced complex MAX",
        lambda: dist.all_reduce_coalesced([complex_tensor.clone()], op=dist.ReduceOp.MAX),
        lambda: torch_dist.all_reduce_coalesced(
            [complex_tensor.clone()], op=torch_dist.ReduceOp.MAX, group=reference
        ),
    )
    for output in ([], None):
        _same_error(
            f"scatter_object_list output {output!r}",
            lambda output=output: dist.scatter_object_list(output, [1, 2], src=0),
            lambda output=output: torch_dist.scatter_object_list(output, [1, 2], src=0, group=reference),
        )
    _same_error(
        "a list for a tensor",
        lambda: dist.all_reduce([1, 2]),
        lambda: torch_dist.all_reduce([1, 2], group=reference),
    )
    _same_error(
        "one split for two ranks",
        lambda: dist.all_to_all_single(torch.ones(4), torch.ones(4), [4], [4]),
        lambda: torch_dist.all_to_all_single(torch.ones(4), torch.ones(4), [4], [4], group=reference),
    )
    _same_error("rank out of range", lambda: dist.new_group([0, 9]), lambda: torch_dist.new_group([0, 9]))
    _same_error(  # torch's words are Python's about iterating an int: the type is what matters
        "broadcast_object_list of an int",
        lambda: dist.broadcast_object_list(5, src=0),
        lambda: torch_dist.broadcast_object_list(5, src=0, group=reference),
        worded=False,
    )
    _same_error(
        "send to self",
        lambda: dist.send(torch.ones(2), dst=rank),
        lambda: torch_dist.send(torch.ones(2), dst=rank, group=reference),
    )


def _accepted_as_torch(reference: Any, rank: int, size: int) -> None:
    def mixed() -> list[torch.Tensor]:
        return [
            torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64) * (rank + 1),
            torch.arange(3.0) + 10 * rank,
        ]

    ours, theirs = mixed(), mixed()
    dist.all_reduce_coalesced(ours)
    torch_dist.all_reduce_coalesced(theirs, group=reference)
    for got, expected in zip(ours, theirs):
        assert got.dtype == expected.dtype and torch.equal(got, expected), (got, expected)
    with warnings.catch_warnings():  # torch warns that a float is taken as seconds; so does commlayer
        warnings.simplefilter("ignore")
        torch_dist.monitored_barrier(group=reference, timeout=30.0)
        dist.monitored_barrier(timeout=30.0)
    _same_error(
        "monitored_barrier int timeout",
        lambda: dist.monitored_barrier(timeout=30),
        lambda: torch_dist.monitored_barrier(group=reference, timeout=30),
    )


def _torch_groups_accepted(rank: int, size: int) -> None:
    """A torch ProcessGroup behind a commlayer group stands for that group everywhere."""
    world = dist.group.WORLD
    torch_group = world.torch_group  # torch's own on gloo, the bridge elsewhere
    assert dist.get_backend(torch_group) == dist.get_backend()
    assert dist.get_rank(torch_group) == rank and dist.get_world_size(torch_group) == size
    tensor = torch.arange(4.0) + rank
    dist.all_reduce(tensor, group=torch_group)
    assert torch.equal(tensor, sum(torch.arange(4.0) + r for r in range(size))), tensor
    objects = [{"rank": rank}]
    dist.broadcast_object_list(objects, src=1, group=torch_group)
    assert objects == [{"rank": 1}], objects
    gathered: list[Any] = [None] * size
    dist.all_gather_object(gathered, rank * 10, group=torch_group)
    assert gathered == [r * 10 for r in range(size)], gathered
    dist.barrier(group=torch_group)


def _monitored_barrier_names_the_missing_rank(reference: Any, rank: int) -> None:
    """Rank 1 skips one monitored_barrier on a group of its own; rank 0 reports it as torch does."""
    torch_group = torch_dist.new_group(backend="gloo")
    group = dist.new_group([0, 1])
    if rank == 0:
        expected = raised(lambda: torch_dist.monitored_barrier(group=torch_group, timeout=0.5))
        got = raised(lambda: dist.monitored_barrier(group=group, timeout=0.5))
        assert isinstance(got, type(expected)) and isinstance(got, CommTimeoutError), (got, expected)
        prefix = str(expected).split("\n")[0]
        assert prefix == "[Rank 0]: Rank 1 failed to pass monitoredBarrier in 500 ms", prefix
        assert str(got).startswith(prefix), (str(got), prefix)
    dist.barrier()
