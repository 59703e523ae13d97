"""Rank bodies for tests/backends/test_mpi.py: what the mpi backend adds beyond the compatibility suite.

Run under mpirun by the harness::

    run_world("tests.backends.mpi_ranks:main", 3, backend="mpi", launcher="mpirun", args=["compat"])
    run_world("tests.backends.mpi_ranks:gloo_through_mpi_discovery", 3, backend=None, launcher="mpirun")

Every rank and element gets a distinct value (rank * 1000 + index) and every result is checked
exactly. The subgroup used below, in a world of 3, is global ranks [2, 0] (sorted to (0, 2)), so
group rank 1 is global rank 2 and global rank 1 is the non-member.
"""

from __future__ import annotations

import itertools
import os
from datetime import timedelta
from typing import Any

import torch

from commlayer import dist
from commlayer.backends.mpi import MpiOptions
from commlayer.backends.mpi import native_fast_paths as _native
from commlayer.backends.mpi.options import MODES
from commlayer.core.errors import (
    BackendUnavailableError,
    CollectiveMismatchError,
    CommTimeoutError,
    InvalidArgumentError,
)
from commlayer.core.rendezvous import discover
from commlayer.testing import conformance

from .mpi_fast_path_ranks import (
    check_c_and_python_launchers_interoperate,
    check_mixed_ops_stress,
    fast_path_kind,
)
from .mpi_speculation_ranks import check_speculating_ranks_complete_and_raise

_TIMEOUT_TAG = 11
_ANY_SOURCE_TAG = 12


def main(*options: str) -> None:
    """Checks on the mpi backend; with "compat", the compatibility suite too (run it with
    COMMLAYER_MPI_MODE=requests to hold the non-default request path to the suite as well)."""
    backend = dist.group.WORLD.primary_backend
    assert dist.get_backend() == "mpi" and backend.name == "mpi", dist.get_backend()
    assert backend.library, "the backend reports its MPI library"
    check_tag_range_is_validated()
    check_planned_ops_run_the_fused_launchers_and_are_recorded()
    check_every_mode_gives_exact_results_sync_and_async()
    check_wait_with_timeout_then_completion()
    check_untimed_wait_ends_at_the_group_timeout()
    check_futures_and_many_ops_in_flight()
    check_sixteen_bit_floats_over_a_large_buffer()
    check_sixteen_bit_floats_over_a_few_elements()
    check_receive_from_any_source_in_a_subgroup()
    check_host_staging_plumbing()
    check_discovery_layout()
    check_signatures_meet_in_shared_memory()
    check_speculating_ranks_complete_and_raise()
    check_c_and_python_launchers_interoperate()
    check_mixed_ops_stress()
    check_destroy_then_initialise_again()
    if "compat" in options:
        conformance.main()


def check_planned_ops_run_the_fused_launchers_and_are_recorded() -> None:
    """Ordered mode's planned ops run backends/mpi/fast_paths.py's fast paths (the other modes the
    facade's): exact results, sync and async, and each call in the flight recorder with its op,
    shape, dtype, root and completed state."""
    from commlayer.facade.calls import dispatch
    from commlayer.facade.groups.group import resolve_group

    rank, size = dist.get_rank(), dist.get_world_size()
    base = torch.arange(6, dtype=torch.float64)
    tensor = base + 1000 * rank
    dist.all_reduce(tensor)
    assert torch.equal(tensor, base * size + 1000 * sum(range(size))), tensor
    pending = dist.broadcast(tensor := base + 1000 * rank, src=size - 1, async_op=True)
    gathered = torch.zeros(6 * size, dtype=torch.float64)
    dist.all_gather_into_tensor(gathered, base + 1000 * rank)
    pending.wait()
    assert torch.equal(tensor, base + 1000 * (size - 1)), tensor
    assert torch.equal(gathered, torch.cat([base + 1000 * peer for peer in range(size)])), gathered
    fast_paths = {fast_path_kind(plan.run) for key, plan in dispatch.plans.items() if key[0] == "all_reduce"}
    backend = dist.group.WORLD.primary_backend
    ordered = backend.options.mode == "ordered"  # else the facade's fast_path
    # One host, the extension built: the C fast path (csrc/mpi) serves ordered mode's plain calls.
    native = _native.native_enabled()
    one_host = backend._check is None or backend._check.shared is not None
    expected_kind = ("C" if native and one_host else "Python") if ordered else "facade"
    assert fast_paths == {expected_kind}, (fast_paths, expected_kind)
    collectives = [
        entry for entry in resolve_group("check", None).recorder.snapshot() if ":" not in entry["op"]
    ]
    entries = collectives[-3:]
    seen = [(entry["op"], entry["shape"], entry["dtype"], entry["root"], entry["state"]) for entry in entries]
    completed = "completed"
    expected = [
        ("all_reduce", [6], "float64", -1, completed),
        ("broadcast", [6], "float64", size - 1, completed),
        ("all_gather_into_tensor", [6 * size], "float64", -1, completed),
    ]
    assert seen == expected, seen


def check_tag_range_is_validated() -> None:
    rank, peer = dist.get_rank(), (dist.get_rank() + 1) % dist.get_world_size()
    upper = dist.group.WORLD.primary_backend._tag_upper_bound
    for tag in (-1, upper + 1):
        try:
            dist.isend(torch.ones(2), dst=peer, tag=tag)
        except InvalidArgumentError as error:
            expected = f"send: argument 'tag' expected an int in [0, {upper}] (MPI's tag range), received {tag} (rank {rank})"
            assert str(error) == expected, str(error)
        else:
            raise AssertionError(f"send with tag {tag} was accepted")


def check_every_mode_gives_exact_results_sync_and_async() -> None:
    """Options reach the group's communicator; every mode gives exact results, sync and async.

    Sync ops complete inside the call in every mode (blocking call, or request waited for in
    place); async ones are queued blocking calls (ordered) or requests. That ordered and requests
    modes tolerate ranks disagreeing on async_op is check_ranks_may_disagree_on_async_op.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = {mode: dist.new_group(list(range(world)), pg_options=MpiOptions(mode)) for mode in MODES}
    inherited = dist.new_group(list(range(world)))  # no options: the world's
    assert {mode: group.primary_backend.options for mode, group in groups.items()} == {
        mode: MpiOptions(mode) for mode in MODES
    }
    assert inherited.primary_backend.options == dist.group.WORLD.primary_backend.options
    expected = sum(_distinct(peer, 4, torch.int32) for peer in range(world))
    async_kind = {"ordered": "OrderedWork", "requests": "MpiWork", "blocking": "MpiWork"}
    for mode, group in groups.items():
        for async_op, kind in ((False, "CompletedWork"), (True, async_kind[mode])):
            tensor = _distinct(rank, 4, torch.int32)
            work = group.primary_backend.all_reduce(tensor, dist.ReduceOp.SUM, async_op=async_op)
            assert type(work).__name__ == kind, (mode, async_op, work)
            assert work.wait() and torch.equal(tensor, expected), tensor
    for mode in ("ordered", "requests"):
        check_ranks_may_disagree_on_async_op(groups[mode])
    for group in (*groups.values(), inherited):
        dist.destroy_process_group(group)
    check_a_destroyed_group_is_refused(inherited)


def check_a_destroyed_group_is_refused(group: Any) -> None:
    """Its communicator is freed: ops raise a typed error naming op, group and rank (they raised
    AttributeError: 'NoneType' object has no attribute 'Allreduce')."""
    rank = dist.get_rank()
    calls = {
        "all_reduce": lambda: dist.all_reduce(torch.ones(2), group=group, async_op=True),
        "broadcast": lambda: dist.broadcast(torch.ones(2), src=0, group=group),
        "barrier": lambda: dist.barrier(group=group),
    }
    for op, call in calls.items():
        try:
            call()
        except InvalidArgumentError as error:
            for words in (f"{op}: argument 'group'", f"group '{group.name}', destroyed", f"(rank {rank})"):
                assert words in str(error), (words, str(error))
        else:
            raise AssertionError(f"{op} on a destroyed group did not raise")


def check_ranks_may_disagree_on_async_op(group: Any) -> None:
    """torch allows one rank to run a collective async while the others run it sync; MPI matches
    no blocking collective with a non-blocking one, so ordered and requests modes must not hang."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = rank == world - 1
    summed, root_value = _distinct(rank, 5, torch.float32), _distinct(rank, 3, torch.int64)
    gathered = torch.zeros(3 * world, dtype=torch.int64)
    works = [
        dist.all_reduce(summed, group=group, async_op=mine),
        dist.broadcast(root_value, src=0, group=group, async_op=mine),
        dist.all_gather_into_tensor(
            gathered, _distinct(rank, 3, torch.int64), group=group, async_op=not mine
        ),
    ]
    for work in works:
        assert work is None or work.wait()
    assert torch.equal(summed, sum(_distinct(peer, 5, torch.float32) for peer in range(world))), summed
    assert torch.equal(root_value, _distinct(0, 3, torch.int64)), root_value
    assert torch.equal(gathered, torch.cat([_distinct(peer, 3, torch.int64) for peer in range(world)])), (
        gathered
    )


def check_wait_with_timeout_then_completion() -> None:
    """A receive whose sender has not sent yet times out, stays pending, then completes exactly."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        incoming = torch.zeros(5, dtype=torch.int64)
        work = dist.irecv(incoming, src=world - 1, tag=_TIMEOUT_TAG)
        try:
            work.wait(timeout=timedelta(milliseconds=50))
        except CommTimeoutError:
            pass
        else:
            raise AssertionError("wait() returned before the sender sent")
        assert not work.is_completed()
    dist.barrier()  # only now does the last rank send
    if rank == world - 1:
        dist.send(_distinct(rank, 5, torch.int64), dst=0, tag=_TIMEOUT_TAG)
    if rank == 0:
        assert work.wait() and work.is_completed()
        assert torch.equal(incoming, _distinct(world - 1, 5, torch.int64)), incoming


def check_untimed_wait_ends_at_the_group_timeout() -> None:
    """MPI waits have no deadline: an untimed wait in a group with a 1 s timeout must raise."""
    rank, world = dist.get_rank(), dist.get_world_size()
    quick = dist.new_group(list(range(world)), timeout=timedelta(seconds=1))
    if rank == 0:
        incoming = torch.zeros(3, dtype=torch.int64)
        work = dist.irecv(incoming, src=1, group=quick, tag=_TIMEOUT_TAG)
        try:
            work.wait()
        except CommTimeoutError as error:
            assert (
                "recv: the MPI operation did not complete within the group's timeout of 1 s (rank 0)"
                in str(error)
            ), str(error)
        else:
            raise AssertionError("an unmatched receive completed")
    dist.barrier()
    if rank == 1:
        dist.send(_distinct(1, 3, torch.int64), dst=0, group=quick, tag=_TIMEOUT_TAG)
    if rank == 0:
        assert work.wait() and torch.equal(incoming, _distinct(1, 3, torch.int64)), incoming
    dist.destroy_process_group(quick)


def check_futures_and_many_ops_in_flight() -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    tensors = [_distinct(rank, 7, torch.float64) + 10_000 * slot for slot in range(6)]
    works = [dist.all_reduce(tensor, async_op=True) for tensor in tensors]
    root_tensor = _distinct(rank, 3, torch.int32)
    works.append(dist.broadcast(root_tensor, src=world - 1, async_op=True))
    future = works[0].get_future()
    for work in reversed(works):
        assert work.wait()
    assert future.wait()[0] is tensors[0]
    for slot, tensor in enumerate(tensors):
        expected = sum(_distinct(peer, 7, torch.float64) + 10_000 * slot for peer in range(world))
        assert torch.equal(tensor, expected), (slot, tensor)
    assert torch.equal(root_tensor, _distinct(world - 1, 3, torch.int32))


def check_sixteen_bit_floats_over_a_large_buffer() -> None:
    """MPI splits a large reduction into pieces; each piece goes through the user-defined op."""
    rank, world = dist.get_rank(), dist.get_world_size()
    numel = 1 << 20
    for dtype in (torch.bfloat16, torch.float16):
        inputs = [((torch.arange(numel) + 3 * peer) % 50 + 1).to(dtype) for peer in range(world)]
        for op, combine in (
            (dist.ReduceOp.SUM, torch.add),
            (dist.ReduceOp.MAX, torch.maximum),
            (dist.ReduceOp.MIN, torch.minimum),
        ):
            tensor = inputs[rank].clone()
            dist.all_reduce(tensor, op=op)
            expected = inputs[0]
            for other in inputs[1:]:
                expected = combine(expected, other)
            assert torch.equal(tensor, expected), (
                f"{dtype} {op.name}: first mismatch at {(tensor != expected).nonzero()[:3].tolist()}"
            )


def check_sixteen_bit_floats_over_a_few_elements() -> None:
    """Open MPI calls the user-defined op with empty pieces when a reduction has fewer elements
    than ranks to spread them over (a bfloat16 reduce_scatter of one element per rank aborted the
    job): every mode, one to three elements per rank, exact results."""
    rank, world = dist.get_rank(), dist.get_world_size()
    for mode in MODES:
        group = dist.new_group(list(range(world)), pg_options=MpiOptions(mode))
        for dtype, per_rank in itertools.product((torch.bfloat16, torch.float16), (1, 2, 3)):
            inputs = [
                _distinct(peer, per_rank * world, torch.int64).remainder(64).to(dtype)
                for peer in range(world)
            ]
            total = sum(inputs[1:], inputs[0].clone())
            chunk = torch.zeros(per_rank, dtype=dtype)
            dist.reduce_scatter_tensor(chunk, inputs[rank].clone(), group=group)
            assert torch.equal(chunk, total[rank * per_rank : (rank + 1) * per_rank]), (mode, dtype, chunk)
            summed = inputs[rank].clone()
            dist.all_reduce(summed, group=group)
            assert torch.equal(summed, total), (mode, dtype, summed)
        dist.destroy_process_group(group)


def check_receive_from_any_source_in_a_subgroup() -> None:
    """Group rank 0 receives from any source; the reported sender is the global rank."""
    world = dist.get_world_size()
    members = sorted({world - 1, 0})
    group = dist.new_group([world - 1, 0])
    rank = dist.get_rank()
    if rank not in members:
        assert group is dist.GroupMember.NON_GROUP_MEMBER
        return
    if rank == members[0]:
        incoming = torch.zeros(4, dtype=torch.int64)
        sender = dist.recv(incoming, src=None, group=group, tag=_ANY_SOURCE_TAG)
        assert sender == members[-1], sender
        assert torch.equal(incoming, _distinct(members[-1], 4, torch.int64)), incoming
    else:
        dist.send(_distinct(rank, 4, torch.int64), dst=members[0], group=group, tag=_ANY_SOURCE_TAG)


def check_host_staging_plumbing() -> None:
    """The CUDA staging path (argument routing, copy-back, results) run on host tensors.

    Without a GPU here, the staged copies are the tensors themselves; tests/backends/mpi_cuda_ranks.py
    runs the real device path on a GPU machine.
    """
    backend = dist.group.WORLD.primary_backend
    rank, world = dist.get_rank(), dist.get_world_size()
    summed = _distinct(rank, 4, torch.float64)
    work = backend._via_host("all_reduce", summed, dist.ReduceOp.SUM, async_op=True)
    assert work.wait() and work.result() == [summed]
    assert torch.equal(summed, sum(_distinct(peer, 4, torch.float64) for peer in range(world))), summed
    root = world - 1
    slots = [torch.zeros(2, dtype=torch.int64) for _ in range(world)] if rank == root else None
    work = backend._via_host("gather", _distinct(rank, 2, torch.int64), slots, root, async_op=False)
    assert work.wait() and work.result() == (slots or [])
    if rank == root:
        assert all(torch.equal(slot, _distinct(peer, 2, torch.int64)) for peer, slot in enumerate(slots)), (
            slots
        )


def check_discovery_layout() -> None:
    """The MPI rendezvous, called directly: one host, so loopback and local rank = rank."""
    from commlayer.backends.mpi.discovery import exchange_master_address

    info = discover(os.environ)
    assert info is not None and info.source in ("openmpi", "intel-mpi", "mpich"), info
    found = exchange_master_address(info)
    assert (
        found.master_addr == "127.0.0.1" and isinstance(found.master_port, int) and found.master_port > 0
    ), found
    assert (found.local_rank, found.local_world_size) == (info.rank, info.world_size), found


def check_signatures_meet_in_shared_memory() -> None:
    """Every rank is on this host, so the default mismatch check exchanges signatures through the
    shared window, not an Allreduce: a count mismatch (synchronous) and a dtype mismatch (the last
    rank asynchronous, on ordered mode's worker) raise CollectiveMismatchError on every rank with
    the data untouched, and the checks stay in step afterwards."""
    rank, world = dist.get_rank(), dist.get_world_size()
    last = rank == world - 1
    assert dist.group.WORLD.primary_backend._check.shared is not None
    counted = _distinct(rank, 8 if last else 4, torch.float32)
    typed = _distinct(rank, 4, torch.int32 if last else torch.float32)
    for tensor, words in (
        (counted, "all_reduce(float32[8], op sum)"),
        (typed, "all_reduce(int32[4], op sum)"),
    ):
        before = tensor.clone()
        try:
            work = dist.all_reduce(tensor, async_op=last and tensor is typed)
            assert work is None or work.wait()
        except CollectiveMismatchError as error:
            assert words in str(error) and f"collectives: rank {rank} called" in str(error), str(error)
        else:
            raise AssertionError(f"rank {rank}: a mismatched all_reduce returned ({words})")
        assert torch.equal(tensor, before), tensor
    for _ in range(3):
        summed = _distinct(rank, 5, torch.float64)
        work = dist.all_reduce(summed, async_op=last)
        assert work is None or work.wait()
        assert torch.equal(summed, sum(_distinct(peer, 5, torch.float64) for peer in range(world))), summed


def check_destroy_then_initialise_again() -> None:
    """MPI stays initialised across destroy_process_group; a new world duplicates COMM_WORLD again."""
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.destroy_process_group()
    assert not dist.is_initialized()
    dist.init_process_group("mpi")
    tensor = _distinct(rank, 3, torch.int64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    assert torch.equal(tensor, _distinct(world - 1, 3, torch.int64)), tensor


def gloo_through_mpi_discovery() -> None:
    """mpirun starts the job, gloo runs it, and the rendezvous address comes over MPI."""
    assert "MASTER_ADDR" not in os.environ and "RANK" not in os.environ
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    info = discover(os.environ)
    assert info is not None and (rank, world) == (info.rank, info.world_size), (rank, world, info)
    assert dist.get_backend() == "gloo", dist.get_backend()
    tensor = _distinct(rank, 6, torch.float32)
    dist.all_reduce(tensor)
    assert torch.equal(tensor, sum(_distinct(peer, 6, torch.float32) for peer in range(world))), tensor
    gathered = torch.zeros(world * 3, dtype=torch.int64)
    dist.all_gather_into_tensor(gathered, _distinct(rank, 3, torch.int64))
    assert torch.equal(gathered, torch.cat([_distinct(peer, 3, torch.int64) for peer in range(world)])), (
        gathered
    )
    dist.destroy_process_group()


def _distinct(rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    return (rank * 1000 + torch.arange(numel) + 1).to(dtype)


def mpi_backend_without_mpirun() -> None:
    """Ranks from a non-MPI launcher: each is a world of one to MPI, so init must refuse and explain."""
    world = int(os.environ["WORLD_SIZE"])
    try:
        dist.init_process_group("mpi")
    except BackendUnavailableError as error:
        assert f"needs its {world} ranks started by an MPI launcher" in str(error), str(error)
        assert f"mpirun -n {world} python your_script.py" in str(error), str(error)
        assert f"(rank {os.environ['RANK']})" in str(error), str(error)
    else:
        raise AssertionError("init_process_group('mpi') succeeded without mpirun")
    assert not dist.is_initialized()
