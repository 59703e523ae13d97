"""torch.distributed's semantics on any commlayer backend, and bad input through the torch bridge.

Run inside the training worlds of ``tests.facade.torch_bridge_ranks`` (one spawn per backend); needs a
world of 3. Every rank contributes distinct values and every result is checked exactly.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as torch_dist

from commlayer import dist
from commlayer.core.errors import InvalidArgumentError
from commlayer.facade.torch_bridge.process_group import CommlayerProcessGroup


def run_all() -> None:
    rank, size = dist.get_rank(), dist.get_world_size()
    _coalesced(rank, size)
    _complex_tensors(rank, size)
    _object_p2p(rank)
    _receive_from_any_source(rank)
    _subgroup_helpers(rank)
    _group_handle(rank, size)
    _work_objects(rank, size)
    _monitored_barrier()
    _bad_input_through_the_bridge(rank)


def _coalesced(rank: int, size: int) -> None:
    a = torch.full((2,), float(rank + 1))
    b = torch.arange(6, dtype=torch.float32).view(2, 3).t() * (rank + 1)  # non-contiguous
    dist.all_reduce_coalesced([a, b])
    total = sum(range(1, size + 1))
    assert torch.equal(a, torch.full((2,), float(total))), a
    assert torch.equal(b, torch.arange(6, dtype=torch.float32).view(2, 3).t() * total), b
    outputs = [[torch.empty(2), torch.empty(3)] for _ in range(size)]
    work = dist.all_gather_coalesced(
        outputs, [torch.full((2,), rank * 1.0), torch.full((3,), rank * 10.0)], async_op=True
    )
    work.wait()
    for peer in range(size):
        assert torch.equal(outputs[peer][0], torch.full((2,), peer * 1.0)), outputs
        assert torch.equal(outputs[peer][1], torch.full((3,), peer * 10.0)), outputs


def _complex_tensors(rank: int, size: int) -> None:
    """torch's rule: complex tensors travel as their real view; reductions only SUM and AVG."""
    value = torch.tensor([1 + 2j, -3 + 0.5j], dtype=torch.complex64) * (rank + 1)
    base = torch.tensor([1 + 2j, -3 + 0.5j], dtype=torch.complex64)
    total = sum(range(1, size + 1))
    summed = value.clone()
    dist.all_reduce(summed)
    assert torch.equal(summed, base * total), summed
    averaged = value.clone().to(torch.complex128)
    dist.all_reduce(averaged, op=dist.ReduceOp.AVG)
    assert torch.allclose(averaged, base.to(torch.complex128) * total / size), averaged
    try:
        dist.all_reduce(value.clone(), op=dist.ReduceOp.MAX)
    except ValueError as error:
        assert "all_reduce: argument 'op'" in str(error) and "complex" in str(error), error
    else:
        raise AssertionError("MAX on a complex tensor was accepted")
    gathered = torch.empty(size * 2, dtype=torch.complex64)
    dist.all_gather_into_tensor(gathered, value)
    assert torch.equal(gathered, torch.cat([base * (peer + 1) for peer in range(size)])), gathered
    pieces = [torch.empty(2, dtype=torch.complex64) for _ in range(size)]
    dist.all_gather(pieces, value)
    assert all(torch.equal(pieces[peer], base * (peer + 1)) for peer in range(size)), pieces
    shared = value.clone()
    dist.broadcast(shared, src=1)
    assert torch.equal(shared, base * 2), shared
    received = torch.empty(1, dtype=torch.complex64)
    dist.scatter(received, [torch.tensor([peer * 1j]) for peer in range(size)] if rank == 0 else None, src=0)
    assert received.item() == rank * 1j, received
    if rank in (0, 1):
        message = torch.empty(2, dtype=torch.complex64)
        if rank == 0:
            dist.send(value, dst=1)
        else:
            dist.recv(message, src=0)
            assert torch.equal(message, base), message
    bridged = value.clone()
    torch_dist.all_reduce(bridged, group=dist.group.WORLD.torch_group)
    assert torch.equal(bridged, base * total), bridged


def _object_p2p(rank: int) -> None:
    if rank == 0:
        dist.send_object_list([{"from": 0}, [1, 2, 3], "x" * 1000], dst=2)
    elif rank == 2:
        received: list = [None, None, None]
        sender = dist.recv_object_list(received, src=0)
        assert sender == 0 and received == [{"from": 0}, [1, 2, 3], "x" * 1000], (sender, received)


def _receive_from_any_source(rank: int) -> None:
    """recv(src=None) names the sender, and its Work answers torch's _source_rank()."""
    if not dist.group.WORLD.primary_backend.capabilities.recv_any_source:
        return
    if rank == 2:
        dist.send(torch.tensor([7.0]), dst=0)
        dist.send(torch.tensor([8.0]), dst=0)
    elif rank == 0:
        message = torch.empty(1)
        work = dist.irecv(message)
        work.wait()
        assert work._source_rank() == 2 and message.item() == 7.0, (work._source_rank(), message)
        assert dist.recv(message) == 2 and message.item() == 8.0, message


def _subgroup_helpers(rank: int) -> None:
    mine, groups = dist.new_subgroups_by_enumeration([[0, 2], [1]])
    assert len(groups) == 2 and mine.ranks == ((0, 2) if rank != 1 else (1,)), (mine, groups)
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=mine)
    assert t.item() == (2.0 if rank != 1 else 1.0), t
    split = dist.split_group(split_ranks=[[1, 2]])
    assert (split is None) == (rank == 0), split
    count = dist.get_pg_count()
    assert count >= 4, count
    assert dist.get_backend_config().startswith(f"cpu:{dist.get_backend()}"), dist.get_backend_config()


def _group_handle(rank: int, size: int) -> None:
    world = dist.group.WORLD
    assert (world.rank(), world.size(), world.name()) == (rank, size, dist.get_backend()), world
    t = torch.tensor([float(rank + 1)])
    world.allreduce([t]).wait()  # torch's ProcessGroup method, answered through the torch group
    assert t.item() == size * (size + 1) / 2, t


def _work_objects(rank: int, size: int) -> None:
    t = torch.tensor([rank + 1.0])
    work = dist.all_reduce(t, async_op=True)
    future = work.get_future()
    assert work.wait() and work.is_completed() and work.exception() is None
    assert torch.equal(future.wait()[0], torch.tensor([size * (size + 1) / 2])), future.value()
    assert work.result()[0] is t or torch.equal(work.result()[0], t)
    pg = dist.group.WORLD.torch_group
    bridged = torch_dist.all_reduce(t, group=pg, async_op=True)
    assert bridged.wait() and bridged.is_completed(), bridged


def _monitored_barrier() -> None:
    dist.monitored_barrier(timeout=timedelta(seconds=60), wait_all_ranks=True)
    dist.group.WORLD.monitored_barrier(timedelta(seconds=60))


def _bad_input_through_the_bridge(rank: int) -> None:
    """torch's API on a bridged group raises commlayer's clear errors before communicating."""
    pg = dist.group.WORLD.torch_group
    if not isinstance(pg, CommlayerProcessGroup):
        return  # torch's own gloo group: torch's errors, not the bridge's
    try:
        torch_dist.all_gather_into_tensor(torch.empty(5), torch.ones(2), group=pg)
    except InvalidArgumentError as error:
        assert "all_gather_into_tensor: argument 'output_tensor'" in str(error), error
        assert f"(rank {rank})" in str(error), error
    else:
        raise AssertionError("a wrongly sized output went through the bridge")
    try:
        torch_dist.all_reduce(torch.ones(2, dtype=torch.int32), op=torch_dist.ReduceOp.AVG, group=pg)
    except ValueError as error:
        assert "all_reduce: argument 'op'" in str(error) and "AVG" in str(error), error
    else:
        raise AssertionError("AVG on int32 went through the bridge")
    dist.barrier()  # nobody communicated above: the world is still in step
