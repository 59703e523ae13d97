"""Rank-side checks of the mpi backend's C fast path (csrc/mpi/fast_paths.cpp), run inside
tests/backends/mpi_ranks.py's world: the C fast_path and the Python one it stands in for must be
interchangeable rank by rank, because they share the mismatch check's sequence and slots."""

from __future__ import annotations

import os
import random
from typing import Any

import torch

from commlayer import dist
from commlayer.backends.mpi import MpiOptions
from commlayer.backends.mpi import native_fast_paths as _native
from commlayer.contract.fast_paths import C_FAST_PATHS_ENV
from commlayer.core.errors import CollectiveMismatchError
from commlayer.facade.calls import dispatch


def check_c_and_python_launchers_interoperate() -> None:
    """Rank 0 plans with the Python fast paths, every other rank with the C ones, on one group:
    the five planned ops give exact results (sync, async, and a non-contiguous input staged by the
    facade), and a count mismatch raises CollectiveMismatchError on every rank with the data
    untouched, the group usable afterwards."""
    if _native._extension is None:
        return  # a tree laid out without building: only the Python fast_paths exist
    _check_the_launcher_finds_the_loaded_library()
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(list(range(world)))
    saved = os.environ.get(C_FAST_PATHS_ENV)
    os.environ[C_FAST_PATHS_ENV] = "0" if rank == 0 else "1"
    try:
        _run_every_planned_op(group, rank, world)
        _mismatch_raises_everywhere(group, rank, world)
    finally:
        if saved is None:
            del os.environ[C_FAST_PATHS_ENV]
        else:
            os.environ[C_FAST_PATHS_ENV] = saved
    kinds = {fast_path_kind(plan.run) for key, plan in dispatch.plans.items() if key[1] is group}
    ordered = group.primary_backend.options.mode == "ordered"  # other modes: the facade's fast_paths
    expected = ("Python" if rank == 0 else "C") if ordered else "facade"
    assert kinds == {expected}, (rank, kinds)
    dist.destroy_process_group(group)


def _check_the_launcher_finds_the_loaded_library() -> None:
    """Every MPI function the fast paths call, from the one library mpi4py loaded, and the handle
    ABI of that library: ints for MPICH's (Intel MPI), pointers for Open MPI's."""
    mpi = dist.group.WORLD.primary_backend._mpi
    functions = _native._library_functions()
    assert functions is not None and all(functions.values()), functions
    expected = 8 if mpi.Get_library_version().startswith("Open MPI") else 4
    assert _native._handle_size(mpi) == expected, (_native._handle_size(mpi), mpi.Get_library_version())


def fast_path_kind(run: Any) -> str:
    """ "C" (csrc/mpi), "Python" (backends/mpi/fast_paths.py) or "facade": which fast path a plan runs."""
    if getattr(run, "__name__", "") == "mpi_fast_path":
        return "C"
    return "Python" if (run.__module__ or "").endswith("mpi.fast_paths") else "facade"


def _distinct(rank: int, numel: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return (rank * 1000 + torch.arange(numel) + 1).to(dtype)


def _run_every_planned_op(group: Any, rank: int, world: int) -> None:
    everyone = [_distinct(peer, 2 * world) for peer in range(world)]
    for async_op in (False, True, False):
        summed = _distinct(rank, 2 * world)
        _done(dist.all_reduce(summed, group=group, async_op=async_op))
        assert torch.equal(summed, sum(everyone)), summed
        sent = _distinct(rank, 5, torch.int32)
        _done(dist.broadcast(sent, src=world - 1, group=group, async_op=async_op))
        assert torch.equal(sent, _distinct(world - 1, 5, torch.int32)), sent
        strided = _distinct(rank, 6, torch.int64)[::2]  # staged contiguous by the facade
        gathered = torch.zeros(3 * world, dtype=torch.int64)
        _done(dist.all_gather_into_tensor(gathered, strided, group=group, async_op=async_op))
        assert torch.equal(gathered, torch.cat([_distinct(p, 6, torch.int64)[::2] for p in range(world)]))
        chunk = torch.zeros(2, dtype=torch.float64)
        _done(dist.reduce_scatter_tensor(chunk, _distinct(rank, 2 * world), group=group, async_op=async_op))
        assert torch.equal(chunk, sum(everyone)[2 * rank : 2 * rank + 2]), chunk
        exchanged = torch.zeros(2 * world, dtype=torch.float64)
        _done(dist.all_to_all_single(exchanged, _distinct(rank, 2 * world), group=group, async_op=async_op))
        expected = torch.cat([everyone[peer][2 * rank : 2 * rank + 2] for peer in range(world)])
        assert torch.equal(exchanged, expected), exchanged


def _mismatch_raises_everywhere(group: Any, rank: int, world: int) -> None:
    tensor = _distinct(rank, 8 if rank == world - 1 else 4)
    before = tensor.clone()
    try:
        dist.all_reduce(tensor, group=group)
    except CollectiveMismatchError as error:
        text = str(error)
        assert "[8], op sum)" in text and f"collectives: rank {rank} called" in text, text
    else:
        raise AssertionError(f"rank {rank}: a mismatched all_reduce returned")
    assert torch.equal(tensor, before), tensor
    summed = _distinct(rank, 4)
    dist.all_reduce(summed, group=group)
    assert torch.equal(summed, sum(_distinct(peer, 4) for peer in range(world))), summed


def _done(work: Any) -> None:
    assert work is None or work.wait()


def check_mixed_ops_stress(steps: int = 600) -> None:
    """The five planned ops in a random order, sizes and dtypes (the same on every rank), each
    rank choosing async_op on its own, waits batched: every result exact. On an ordered group,
    so the C fast_path, the Python fast_path and the worker share one communicator and one check
    sequence. (A longer run of this found the 16-bit reduction bug of
    check_sixteen_bit_floats_over_a_few_elements.)"""
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(list(range(world)), pg_options=MpiOptions("ordered"))
    calls, choices = random.Random(2026), random.Random(7 + rank)
    pending: list[tuple[Any, torch.Tensor, torch.Tensor]] = []
    for step in range(steps):
        op = calls.choice(sorted(_STRESS_OPS))
        numel = calls.choice((1, 2, 3, 8, 64, 1000, 4096, 20000)) * world
        dtype = calls.choice((torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16))
        pending.append(_STRESS_OPS[op](group, rank, world, numel, dtype, step, choices.random() < 0.4))
        if len(pending) > 8 or choices.random() < 0.3:
            _check_all(pending, rank)
    _check_all(pending, rank)
    dist.destroy_process_group(group)


def _stress_values(rank: int, numel: int, step: int) -> torch.Tensor:
    return (torch.arange(numel, dtype=torch.int64) * 7 + rank * 1000 + step) % 97  # exact in every dtype


def _stress_all_reduce(
    group: Any, rank: int, world: int, numel: int, dtype: torch.dtype, step: int, async_op: bool
):
    tensor = _stress_values(rank, numel, step).to(dtype)
    expected = sum(_stress_values(peer, numel, step) for peer in range(world))
    return dist.all_reduce(tensor, group=group, async_op=async_op), tensor, expected


def _stress_broadcast(
    group: Any, rank: int, world: int, numel: int, dtype: torch.dtype, step: int, async_op: bool
):
    tensor, root = _stress_values(rank, numel, step).to(dtype), step % world
    return (
        dist.broadcast(tensor, src=root, group=group, async_op=async_op),
        tensor,
        _stress_values(root, numel, step),
    )


def _stress_all_gather(
    group: Any, rank: int, world: int, numel: int, dtype: torch.dtype, step: int, async_op: bool
):
    output = torch.zeros(numel * world, dtype=dtype)
    expected = torch.cat([_stress_values(peer, numel, step) for peer in range(world)])
    work = dist.all_gather_into_tensor(
        output, _stress_values(rank, numel, step).to(dtype), group=group, async_op=async_op
    )
    return work, output, expected


def _stress_reduce_scatter(
    group: Any, rank: int, world: int, numel: int, dtype: torch.dtype, step: int, async_op: bool
):
    chunk, share = torch.zeros(numel // world, dtype=dtype), numel // world
    total = sum(_stress_values(peer, numel, step) for peer in range(world))
    work = dist.reduce_scatter_tensor(
        chunk, _stress_values(rank, numel, step).to(dtype), group=group, async_op=async_op
    )
    return work, chunk, total[rank * share : (rank + 1) * share]


def _stress_all_to_all(
    group: Any, rank: int, world: int, numel: int, dtype: torch.dtype, step: int, async_op: bool
):
    output, share = torch.zeros(numel, dtype=dtype), numel // world
    expected = torch.cat(
        [_stress_values(peer, numel, step)[rank * share : (rank + 1) * share] for peer in range(world)]
    )
    work = dist.all_to_all_single(
        output, _stress_values(rank, numel, step).to(dtype), group=group, async_op=async_op
    )
    return work, output, expected


_STRESS_OPS = {
    "all_reduce": _stress_all_reduce,
    "broadcast": _stress_broadcast,
    "all_gather": _stress_all_gather,
    "reduce_scatter": _stress_reduce_scatter,
    "all_to_all": _stress_all_to_all,
}


def _check_all(pending: list[tuple[Any, torch.Tensor, torch.Tensor]], rank: int) -> None:
    for work, result, expected in pending:
        _done(work)
        assert torch.equal(result, expected.to(result.dtype)), (rank, result.dtype, result[:4], expected[:4])
    pending.clear()
