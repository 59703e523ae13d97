"""ccl-specific multi-rank checks, on top of the compatibility suite (run on ccl separately).

Run by tests/backends/test_ccl.py as ``run_world("tests.backends.ccl_ranks:main", n, backend="ccl")``.
Layout for a world of 4: ``low = new_group([0, 1])`` and ``high = new_group([1, 2, 3])`` overlap
on global rank 1, which holds two oneCCL communicators (two KVS servers) besides WORLD's.
"""

from __future__ import annotations

import torch

from commlayer import dist
from commlayer.core.errors import UnsupportedError
from commlayer.core.types import ReduceOp
from commlayer.testing.conformance import NUMERIC_DTYPES, assert_equal, reduced, values

# The contract, spelled out instead of read from the backend's declared capabilities,
# so a narrowed declaration cannot silently shrink what is tested.
REQUIRED_DTYPES = (*NUMERIC_DTYPES, torch.int8)
REQUIRED_OPS = (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT)


def main() -> None:
    backend = dist.group.WORLD.primary_backend
    assert backend.name == "ccl", f"expected the ccl backend, got {backend.name!r}"
    check_required_dtypes_and_ops()
    check_planned_ops_run_the_fused_launchers_and_are_recorded()
    check_many_async_ops_in_flight()
    check_future_and_then()
    check_overlapping_subgroups()
    check_subgroup_recreated()
    check_tags_are_refused()
    dist.barrier()


def check_required_dtypes_and_ops() -> None:
    world, me = dist.get_world_size(), dist.get_rank()
    ranks = list(range(world))
    for dtype in REQUIRED_DTYPES:
        for op in REQUIRED_OPS:
            if op is ReduceOp.AVG and not dtype.is_floating_point:
                continue
            tensor = _input(me, dtype, op)
            dist.all_reduce(tensor, op=op)
            expected = fold(ranks, dtype, op)
            assert_equal(tensor, expected, f"all_reduce {dtype} {op.name}", op)
            reduced_here = _input(me, dtype, op)
            dist.reduce(reduced_here, dst=world - 1, op=op)
            mine = expected if me == world - 1 else _input(me, dtype, op)
            assert_equal(reduced_here, mine, f"reduce {dtype} {op.name} (rank {me})", op)


def check_planned_ops_run_the_fused_launchers_and_are_recorded() -> None:
    """The planned ops run backends/ccl/fast_paths.py's fast paths: exact results, sync and async, an
    uneven all-to-all through the op method, and each call in the flight recorder with its op,
    shape, dtype, root and state."""
    from commlayer.facade.calls import dispatch
    from commlayer.facade.groups.group import resolve_group

    rank, size = dist.get_rank(), dist.get_world_size()
    base = torch.arange(6, dtype=torch.float64)
    summed = base + 1000 * rank
    dist.all_reduce(summed)
    pending = dist.broadcast(shout := base + 1000 * rank, src=size - 1, async_op=True)
    gathered = torch.zeros(6 * size, dtype=torch.float64)
    dist.all_gather_into_tensor(gathered, base + 1000 * rank)
    scattered = torch.zeros(3, dtype=torch.float64)
    dist.reduce_scatter_tensor(scattered, torch.arange(3.0 * size, dtype=torch.float64) + rank)
    uneven_in = torch.full((size + rank,), float(rank))  # one element to each peer, the rest to rank 0
    uneven_out = torch.zeros(size + (rank == 0) * sum(range(size)))
    splits_in = [1 + rank] + [1] * (size - 1)
    splits_out = [1 + peer for peer in range(size)] if rank == 0 else [1] * size
    dist.all_to_all_single(uneven_out, uneven_in, splits_out, splits_in)
    assert pending.wait() is True
    assert torch.equal(summed, base * size + 1000 * sum(range(size))), summed
    assert torch.equal(shout, base + 1000 * (size - 1)), shout
    assert torch.equal(gathered, torch.cat([base + 1000 * peer for peer in range(size)])), gathered
    expected_scatter = torch.arange(3.0 * size, dtype=torch.float64)[3 * rank : 3 * rank + 3] * size + sum(
        range(size)
    )
    assert torch.equal(scattered, expected_scatter), scattered
    expected_uneven = torch.cat([torch.full((n,), float(peer)) for peer, n in enumerate(splits_out)])
    assert torch.equal(uneven_out, expected_uneven), uneven_out
    planned = [  # this check's plans (float64; earlier checks planned AVG, which the facade emulates)
        plan.run for key, plan in dispatch.plans.items() if torch.float64 in key and ReduceOp.AVG not in key
    ]
    modules = {run.__module__ for run in planned}  # the recorder's fast_path, named after ccl's start
    assert modules == {"commlayer.backends.ccl.fast_paths"}, modules
    entries = [entry for entry in resolve_group("check", None).recorder.snapshot() if ":" not in entry["op"]]
    seen = [
        (entry["op"], entry["shape"], entry["dtype"], entry["root"], entry["state"]) for entry in entries[-5:]
    ]
    expected = [
        ("all_reduce", [6], "float64", -1, "completed"),
        ("broadcast", [6], "float64", size - 1, "completed"),
        ("all_gather_into_tensor", [6 * size], "float64", -1, "completed"),
        ("reduce_scatter_tensor", [3 * size], "float64", -1, "completed"),
        ("all_to_all_single", [size + rank], "float32", -1, "completed"),
    ]
    assert seen == expected, seen


def check_many_async_ops_in_flight() -> None:
    """Five ops posted before any wait, waited in reverse order; each result exact."""
    world, me = dist.get_world_size(), dist.get_rank()
    summed = [values(me, torch.float32, numel=1000 + k, salt=k) for k in range(3)]
    works = [dist.all_reduce(tensor, async_op=True) for tensor in summed]
    gathered = torch.zeros(world * 5, dtype=torch.int64)
    works.append(dist.all_gather_into_tensor(gathered, values(me, torch.int64, numel=5), async_op=True))
    shout = values(0, torch.float64, numel=7) if me == 0 else torch.zeros(7, dtype=torch.float64)
    works.append(dist.broadcast(shout, src=0, async_op=True))
    for work in reversed(works):
        assert work.wait() is True and work.is_completed()
    for k, tensor in enumerate(summed):
        expected = reduced(list(range(world)), torch.float32, ReduceOp.SUM, numel=1000 + k, salt=k)
        assert_equal(tensor, expected, f"in-flight all_reduce {k}")
    assert_equal(
        gathered, torch.cat([values(r, torch.int64, numel=5) for r in range(world)]), "in-flight all_gather"
    )
    assert_equal(shout, values(0, torch.float64, numel=7), "in-flight broadcast")


def check_future_and_then() -> None:
    world, me = dist.get_world_size(), dist.get_rank()
    tensor = values(me, torch.float64, numel=9)
    future = dist.all_reduce(tensor, op=dist.ReduceOp.MAX, async_op=True).get_future()
    (result,) = future.wait()
    assert_equal(result, reduced(list(range(world)), torch.float64, ReduceOp.MAX, numel=9), "future result")


def check_overlapping_subgroups() -> None:
    world, me = dist.get_world_size(), dist.get_rank()
    low_ranks, high_ranks = [0, 1], list(range(1, world))
    low, high = dist.new_group(low_ranks), dist.new_group(high_ranks)
    for ranks, group in ((low_ranks, low), (high_ranks, high)):
        tensor = values(me, torch.int32, numel=6)
        work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group, async_op=True)
        if me not in ranks:
            assert work is None, f"rank {me} is outside {ranks} but got {work!r}"
            assert_equal(tensor, values(me, torch.int32, numel=6), f"non-member tensor untouched {ranks}")
            continue
        work.wait()
        assert_equal(
            tensor, reduced(ranks, torch.int32, ReduceOp.SUM, numel=6), f"subgroup {ranks} all_reduce"
        )
    if me in high_ranks:
        root = high_ranks[-1]
        tensor = values(me, torch.bfloat16, numel=4)
        dist.broadcast(tensor, src=root, group=high)
        assert_equal(tensor, values(root, torch.bfloat16, numel=4), f"subgroup {high_ranks} broadcast")


def check_subgroup_recreated() -> None:
    """Destroying a subgroup and building it again gets a fresh KVS (fresh store keys)."""
    world, me = dist.get_world_size(), dist.get_rank()
    ranks = list(range(world - 1, -1, -2))[::-1]  # every other rank, ending with the last
    for attempt in range(2):
        group = dist.new_group(ranks)
        if me in ranks:
            tensor = values(me, torch.int64, numel=3, salt=attempt)
            dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=group)
            expected = reduced(ranks, torch.int64, ReduceOp.MIN, numel=3, salt=attempt)
            assert_equal(tensor, expected, f"recreated group {ranks} attempt {attempt}")
            dist.destroy_process_group(group)


def check_tags_are_refused() -> None:
    """oneCCL matches messages by peer alone: a tag would be ignored, so it is refused first."""
    rank, peer = dist.get_rank(), (dist.get_rank() + 1) % dist.get_world_size()
    try:
        dist.isend(torch.ones(2), peer, tag=3)
    except UnsupportedError as error:
        words = ("send", "'tag'", "matches messages by peer", "received 3", f"(rank {rank})")
        assert all(word in str(error) for word in words), error
    else:
        raise AssertionError("a tagged isend on ccl was not refused")


def _input(rank: int, dtype: torch.dtype, op: ReduceOp) -> torch.Tensor:
    if dtype is torch.int8:  # values() has no int8 layout; keep products and sums in range
        return ((rank + torch.arange(10)) % 3 + 1).to(torch.int8)
    return values(rank, dtype, op, numel=10)


def fold(ranks: list[int], dtype: torch.dtype, op: ReduceOp) -> torch.Tensor:
    if dtype is not torch.int8:
        return reduced(ranks, dtype, op, numel=10)
    inputs = torch.stack([_input(rank, dtype, op).to(torch.int64) for rank in ranks])
    combine = {
        ReduceOp.SUM: inputs.sum(0),
        ReduceOp.PRODUCT: inputs.prod(0),
        ReduceOp.MIN: inputs.min(0).values,
        ReduceOp.MAX: inputs.max(0).values,
    }
    return combine[op].to(torch.int8)
