"""The ops timed by torch_vs_commlayer.py: one call each of raw torch, commlayer and the bare
ProcessGroup method (the floor both wrappers sit on), on identical buffers.

Sizes are nccl-tests' S (``commlayer.core.metrics``): the whole buffer for all_reduce, broadcast
and send/recv, the full gathered (pre-scatter) buffer for all_gather / reduce_scatter, and all one
rank sends for all_to_all_single. send/recv pairs ranks (0 -> 1, 2 -> 3): even ranks send.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.distributed as torch_dist

from commlayer import dist

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all_single", "send_recv")
Call = Callable[[], object]


class Trio(NamedTuple):
    raw: Call
    commlayer: Call
    bare: Call | None  # None where the op needs a real peer (multi-rank runs do not time it)
    nbytes: int  # S


def element_count(op: str, nbytes: int, world: int) -> int:
    """float32 elements of the per-rank buffer for a message of about ``nbytes``."""
    numel = max(1, nbytes // 4)
    if op in ("all_gather", "reduce_scatter"):
        return max(1, numel // world)
    if op == "all_to_all_single":
        return max(world, numel - numel % world)
    return numel


def trio(op: str, nbytes: int, world: int, rank: int, device: torch.device, async_op: bool) -> Trio:
    numel = element_count(op, nbytes, world)
    small = torch.ones(numel, device=device)
    large = torch.ones(numel * world, device=device)
    pg = torch_dist.group.WORLD
    if op == "all_reduce":
        options = _options(torch_dist.AllreduceOptions, async_op)
        return _trio(
            lambda: torch_dist.all_reduce(small, async_op=async_op),
            lambda: dist.all_reduce(small, async_op=async_op),
            lambda: pg.allreduce([small], options),
            numel * 4,
            async_op,
        )
    if op == "broadcast":
        options = _options(torch_dist.BroadcastOptions, async_op)
        return _trio(
            lambda: torch_dist.broadcast(small, 0, async_op=async_op),
            lambda: dist.broadcast(small, 0, async_op=async_op),
            lambda: pg.broadcast([small], options),
            numel * 4,
            async_op,
        )
    if op == "all_gather":
        options = _options(torch_dist.distributed_c10d.AllgatherOptions, async_op)
        return _trio(
            lambda: torch_dist.all_gather_into_tensor(large, small, async_op=async_op),
            lambda: dist.all_gather_into_tensor(large, small, async_op=async_op),
            lambda: pg._allgather_base(large, small, options),
            numel * world * 4,
            async_op,
        )
    if op == "reduce_scatter":
        options = _options(torch_dist.ReduceScatterOptions, async_op)
        return _trio(
            lambda: torch_dist.reduce_scatter_tensor(small, large, async_op=async_op),
            lambda: dist.reduce_scatter_tensor(small, large, async_op=async_op),
            lambda: pg._reduce_scatter_base(small, large, options),
            numel * world * 4,
            async_op,
        )
    if op == "all_to_all_single":
        output, options = torch.empty_like(small), _options(torch_dist.AllToAllOptions, async_op)
        return _trio(
            lambda: torch_dist.all_to_all_single(output, small, async_op=async_op),
            lambda: dist.all_to_all_single(output, small, async_op=async_op),
            lambda: pg.alltoall_base(output, small, [], [], options),
            numel * 4,
            async_op,
        )
    if op == "send_recv":  # pairs: even ranks send to the next rank, which receives
        return _send_recv(small, rank % 2 == 0, rank + 1 if rank % 2 == 0 else rank - 1, async_op)
    return _send_recv(small, op == "send", 1 - rank, async_op)  # the stand-in's "send", "recv"


def _send_recv(tensor: torch.Tensor, sender: bool, peer: int, async_op: bool) -> Trio:
    pg = torch_dist.group.WORLD
    if sender:
        raw: Call = lambda: torch_dist.isend(tensor, peer).wait()
        ours: Call = lambda: dist.isend(tensor, peer).wait()
        synchronous = (lambda: torch_dist.send(tensor, peer)), (lambda: dist.send(tensor, peer))
        bare: Call = lambda: pg.send([tensor], peer, 0).wait()
    else:
        raw = lambda: torch_dist.irecv(tensor, peer).wait()
        ours = lambda: dist.irecv(tensor, peer).wait()
        synchronous = (lambda: torch_dist.recv(tensor, peer)), (lambda: dist.recv(tensor, peer))
        bare = lambda: pg.recv([tensor], peer, 0).wait()
    if not async_op:
        raw, ours = synchronous
    return Trio(raw, ours, bare, tensor.numel() * 4)


def _trio(raw: Call, ours: Call, bare_call: Callable[[], Any], nbytes: int, async_op: bool) -> Trio:
    """``bare`` waits for a synchronous op, as both wrappers do; an async one is only started."""
    if async_op:
        return Trio(raw, ours, bare_call, nbytes)

    def bare() -> None:
        work = bare_call()
        if work is not None:
            work.wait()

    return Trio(raw, ours, bare, nbytes)


def _options(kind: Any, async_op: bool) -> Any:
    options = kind()
    if hasattr(options, "asyncOp"):
        options.asyncOp = async_op
    return options
