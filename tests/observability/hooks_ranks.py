"""Rank bodies of the hook tests (tests/observability/test_hooks.py)."""

from __future__ import annotations

import torch

from commlayer import dist, hooks
from commlayer.core.types import ReduceOp
from commlayer.facade.calls import dispatch
from commlayer.mesh import init_mesh


def every_check() -> None:
    """One world for the typed calls and the content-hash hook."""
    typed_calls()
    diverging_replica()


def typed_calls() -> None:
    """Every hook sees each op's typed arguments; group hooks see only their group; handles remove."""
    rank, size = dist.get_rank(), dist.get_world_size()
    pre: list[hooks.CollectiveCall] = []
    post: list[hooks.CollectiveCall] = []
    pair = dist.new_group([0, 1])
    handles = [hooks.register_pre_hook(pre.append), hooks.register_post_hook(post.append)]
    tensor = torch.arange(4, dtype=torch.float64) + rank
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)  # planned path
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)  # the stored plan, hooked
    dist.broadcast(tensor, src=size - 1)
    outputs = [torch.empty(4, dtype=torch.float64) for _ in range(size)]
    work = dist.all_gather(outputs, tensor, async_op=True)  # launch path, async
    assert [call.op for call in post][-1] == "broadcast", post
    work.wait()
    names = [call.op for call in pre]
    assert names == ["all_reduce", "all_reduce", "broadcast", "all_gather"], names
    assert [call.op for call in post] == names, post
    first = pre[0]
    assert first.reduce_op == ReduceOp.MAX and first.dtype == torch.float64 and first.count == 4, first
    assert first.nbytes == 32 and first.root is None and first.rank == rank and not first.async_op
    assert first.group_name == "world" and [call.seq for call in pre] == [0, 1, 2, 3], pre
    assert pre[2].root == size - 1 and (pre[2].inputs == () if rank != size - 1 else len(pre[2].inputs) == 1)
    assert pre[3].async_op and pre[3].count == 4 and len(pre[3].tensors) == size, pre[3]
    for handle in handles:
        handle.remove()
    assert dispatch._observer is None
    dist.all_reduce(tensor)
    assert len(pre) == 4, pre
    _group_hooks(pair, rank)
    _recorder_and_logger(rank)


def _group_hooks(pair: object, rank: int) -> None:
    seen: list[str] = []
    if rank in (0, 1):
        with pair.register_pre_hook(lambda call: seen.append(f"{call.op}@{call.group_name}")):  # type: ignore[attr-defined]
            dist.all_reduce(torch.ones(2))  # world: not hooked
            dist.all_reduce(torch.ones(2), group=pair)
            dist.send(torch.ones(1), dst=1 - rank, group=pair) if rank == 0 else dist.recv(
                torch.ones(1), src=0, group=pair
            )
        assert seen == [f"all_reduce@{pair.name}", f"{'send' if rank == 0 else 'recv'}@{pair.name}"], seen  # type: ignore[attr-defined]
    else:
        dist.all_reduce(torch.ones(2))
    assert dispatch._observer is None


def _recorder_and_logger(rank: int) -> None:
    with hooks.flight_recorder(ops=["all_reduce"]) as recorder, hooks.comms_logger():
        dist.all_reduce(torch.ones(3))
        dist.barrier()
        dist.all_reduce(torch.ones(5), async_op=True).wait()
    entries = recorder.to_json()[0]["entries"]
    assert [(entry["op"], entry["state"]) for entry in entries] == [("all_reduce", "completed")] * 2, entries
    stats = dist.comms_logger.stats()
    assert stats["all_reduce"][12]["count"] == 1 and stats["all_reduce"][20]["count"] == 1, stats
    assert dispatch._observer is None


def diverging_replica() -> None:
    """4 data-parallel replicas fed the same batch, but rank 2's differs: the hook names rank 2."""
    rank = dist.get_rank()
    mesh = init_mesh((4,), ("dp",))
    replicas = mesh["dp"].group
    torch.manual_seed(0)
    weight = torch.randn(8, 4)
    batch = torch.randn(16, 8)
    if rank == 2:
        batch = batch.clone()
        batch[3, 1] += 1e-3  # one element of one sample differs
    with hooks.content_hash(replicas, ops=["all_reduce"], on_divergence="log") as logged:
        dist.all_reduce(weight.clone())  # identical on every rank: no divergence
        dist.all_reduce(batch @ weight, group=replicas)
    assert len(logged.divergences) == 1 and logged.divergences[0].diverging == (2,), logged.divergences
    assert logged.checked == 2
    hook = hooks.content_hash(replicas)
    try:
        dist.all_reduce((batch @ weight).sum(0))
    except hooks.ContentDivergenceError as error:
        assert error.diverging == (2,), error
        assert "global rank(s) [2] differ" in str(error) and f"(rank {rank})" in str(error), str(error)
        assert "rank(s) [0, 1, 3]" in str(error), str(error)
    else:
        raise AssertionError(f"rank {rank}: the diverging replica was not reported")
    finally:
        hook.remove()
    same = torch.ones(3)
    dist.all_reduce(same)  # the group still works: the refused call never reached the backend
    assert torch.equal(same, torch.full((3,), 4.0)), same
