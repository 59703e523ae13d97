"""Fused launchers for the torch backends' hot ops (see ``Backend.plan``).

Each launcher calls the ProcessGroup's bound method with options built once, exactly as torch's
own Python wrapper would after its checks, which the facade has already made when it built the
plan. Profiled on a stand-in ProcessGroup (``benchmarks/torch_vs_commlayer.py --standin``), this
leaves one Python frame between the facade op and the C++ call, where torch's wrapper has its
decorator, its checks and its option building.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as torch_dist

from commlayer.types import ReduceOp
from commlayer.work import CompletedWork, TorchWork, Work

__all__ = ["fused_plan", "options", "wrap"]

Launcher = Callable[..., Work | None]

TORCH_OPS = {op: getattr(torch_dist.ReduceOp, op.name) for op in ReduceOp}


def options(kind: Any, async_op: bool, **fields: Any) -> Any:
    """A torch options object; never mutated once built, so one instance serves every call."""
    built = kind()
    for name, value in fields.items():
        setattr(built, name, value)
    if hasattr(built, "asyncOp"):  # torch >= 2.8: a blocking op may run on the caller's stream
        built.asyncOp = async_op
    return built


def wrap(torch_work: Any, results: tuple[torch.Tensor, ...]) -> Work:
    return CompletedWork(results) if torch_work is None else TorchWork(torch_work, results)


def fused_plan(process_group: Any, op: str, fixed: tuple[Any, ...]) -> Launcher | None:
    """The launcher of ``op`` on ``process_group`` with trailing arguments ``fixed``, if fused."""
    build = _BUILDERS.get(op)
    return None if build is None else build(process_group, *fixed)


def _listed(method: Callable[..., Any], sync_tail: tuple[Any, ...], async_tail: tuple[Any, ...]) -> Launcher:
    """For ``method([tensor], *tail)``: allreduce, broadcast."""

    def run(async_op: bool, tensor: torch.Tensor) -> Work | None:
        if async_op:
            work = method([tensor], *async_tail)  # an async op always returns a Work: no wrap()
            return TorchWork(work, (tensor,))
        work = method([tensor], *sync_tail)
        if work is not None:  # NCCL may run a blocking op on the caller's stream and return none
            work.wait()
        return None

    return run


def _paired(method: Callable[..., Any], sync_options: Any, async_options: Any) -> Launcher:
    """For ``method(output, input, options)``: _allgather_base, _reduce_scatter_base.

    Both get 1-D views: gloo splits the larger tensor along dim 0 and compares each piece's shape
    with the smaller one, so it refuses a stacked ``(n, *shape)`` output that NCCL accepts.
    """

    def run(async_op: bool, output: torch.Tensor, tensor: torch.Tensor) -> Work | None:
        flat_output = output if output.dim() == 1 else output.view(-1)
        if tensor.dim() != 1:
            tensor = tensor.view(-1)
        if async_op:
            return TorchWork(method(flat_output, tensor, async_options), (output,))
        work = method(flat_output, tensor, sync_options)
        if work is not None:
            work.wait()
        return None

    return run


def _all_reduce(process_group: Any, op: ReduceOp) -> Launcher:
    reduce_op = TORCH_OPS[op]
    sync_tail = (options(torch_dist.AllreduceOptions, False, reduceOp=reduce_op),)
    async_tail = (options(torch_dist.AllreduceOptions, True, reduceOp=reduce_op),)
    return _listed(process_group.allreduce, sync_tail, async_tail)


def _broadcast(process_group: Any, root: int) -> Launcher:
    # rootRank is a group rank: the ProcessGroup counts its own members.
    sync_tail = (options(torch_dist.BroadcastOptions, False, rootRank=root),)
    async_tail = (options(torch_dist.BroadcastOptions, True, rootRank=root),)
    return _listed(process_group.broadcast, sync_tail, async_tail)


def _send(process_group: Any, peer: int, tag: int) -> Launcher:
    return _point_to_point(process_group.send, peer, tag)


def _recv(process_group: Any, peer: int, tag: int) -> Launcher:
    return _point_to_point(process_group.recv, peer, tag)


def _point_to_point(method: Callable[..., Any], peer: int, tag: int) -> Launcher:
    """send and recv take no options and always return a Work: the leanest launcher of all."""

    def run(async_op: bool, tensor: torch.Tensor) -> Work | None:
        work = method([tensor], peer, tag)
        if async_op:
            return TorchWork(work, (tensor,))
        work.wait()
        return None

    return run


def _all_gather_into_tensor(process_group: Any) -> Launcher:
    kind = torch_dist.distributed_c10d.AllgatherOptions
    return _paired(process_group._allgather_base, options(kind, False), options(kind, True))


def _reduce_scatter_tensor(process_group: Any, op: ReduceOp) -> Launcher:
    kind, reduce_op = torch_dist.ReduceScatterOptions, TORCH_OPS[op]
    return _paired(
        process_group._reduce_scatter_base,
        options(kind, False, reduceOp=reduce_op),
        options(kind, True, reduceOp=reduce_op),
    )


def _all_to_all_single(process_group: Any) -> Launcher:
    method = process_group.alltoall_base
    sync_options = options(torch_dist.AllToAllOptions, False)
    async_options = options(torch_dist.AllToAllOptions, True)

    def run(
        async_op: bool,
        output: torch.Tensor,
        tensor: torch.Tensor,
        output_splits: list[int] | None,
        input_splits: list[int] | None,
    ) -> Work | None:
        splits = (output_splits or [], input_splits or [])  # torch's spelling of "equal splits"
        if async_op:
            return TorchWork(method(output, tensor, *splits, async_options), (output,))
        work = method(output, tensor, *splits, sync_options)
        if work is not None:
            work.wait()
        return None

    return run


_BUILDERS: dict[str, Callable[..., Launcher]] = {
    "all_reduce": _all_reduce,
    "broadcast": _broadcast,
    "send": _send,
    "recv": _recv,
    "all_gather_into_tensor": _all_gather_into_tensor,
    "reduce_scatter_tensor": _reduce_scatter_tensor,
    "all_to_all_single": _all_to_all_single,
}
