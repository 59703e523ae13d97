"""Two-level collectives for a group that spans hosts: shm on each host, gloo between host leaders.

The leader of a host is its lowest group rank. all_reduce reduces on each host, across leaders,
then broadcasts on each host; broadcast goes root's host, leaders, other hosts; all_gather gathers
on each host, across leaders (padded to the largest host), then broadcasts the whole output on each
host. barrier is host, leaders, host. The other native ops of :class:`ShmBackend` are built on
these; reduce_scatter and all-to-all use the generic fallbacks (gloo point-to-point).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as torch_dist
from torch import Tensor

from commlayer.backends.gloo import GlooBackend
from commlayer.backends.shm.backend import ShmBackend
from commlayer.backends.shm.native import DTYPE_CODES, OP_CODES
from commlayer.backends.shm.options import ShmOptions
from commlayer.backends.shm.segments import build_comm
from commlayer.contract.fallbacks import GenericCollectives
from commlayer.core.hosts import HostMap
from commlayer.core.types import GroupSpec, ReduceOp, Splits
from commlayer.core.work import CompletedWork, Work

__all__ = ["TwoLevelBackend"]

_TORCH_OPS = {op: getattr(torch_dist.ReduceOp, op.name) for op in ReduceOp if op is not ReduceOp.AVG}


class _Leaders:
    """A bare gloo ProcessGroup over the host leaders: only they build it, no world-wide call."""

    def __init__(self, store: Any, prefix: str, rank: int, size: int, timeout: timedelta) -> None:
        self.rank = rank
        self._pg = torch_dist.ProcessGroupGloo(torch_dist.PrefixStore(prefix, store), rank, size, timeout)

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp) -> None:
        options = torch_dist.AllreduceOptions()
        options.reduceOp = _TORCH_OPS[op]
        self._pg.allreduce([tensor], options).wait()

    def broadcast(self, tensor: torch.Tensor, root: int) -> None:
        options = torch_dist.BroadcastOptions()
        options.rootRank = root
        self._pg.broadcast([tensor], options).wait()

    def all_gather_into_tensor(self, output: torch.Tensor, tensor: torch.Tensor) -> None:
        outputs = list(output.view(-1, tensor.numel()).unbind(0))
        self._pg.allgather([outputs], [tensor]).wait()

    def barrier(self) -> None:
        self._pg.barrier().wait()


class TwoLevelBackend(ShmBackend):
    """``self._comm`` is this host's shm communicator; leaders also hold ``self._leaders``."""

    # Across hosts the leaders reduce with gloo, which cannot average: the facade sums and divides.
    capabilities = dataclasses.replace(ShmBackend.capabilities, native_avg=False)

    def __init__(
        self,
        spec: GroupSpec,
        companion: GlooBackend,
        comm: Any,
        options: ShmOptions,
        hosts: HostMap,
        leaders: _Leaders | None,
    ) -> None:
        super().__init__(spec, companion, comm, options, hosts)
        self._leaders = leaders
        self._host = hosts.host_of(spec.group_rank)

    @classmethod
    def build(
        cls, spec: GroupSpec, companion: GlooBackend, options: ShmOptions, hosts: HostMap, prefix: str
    ) -> TwoLevelBackend:
        host = hosts.host_of(spec.group_rank)
        comm = build_comm(spec, f"{prefix}/host{host}", hosts.hosts[host], hosts.pids, options)
        leaders = None
        if spec.group_rank in hosts.leaders:
            rank = hosts.leaders.index(spec.group_rank)
            leaders = _Leaders(spec.store, f"{prefix}/leaders/", rank, len(hosts.leaders), spec.timeout)
        return cls(spec, companion, comm, options, hosts, leaders)

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp, *, async_op: bool = True) -> Work:
        code = DTYPE_CODES[tensor.dtype]
        self._comm.all_reduce(tensor.data_ptr(), tensor.numel(), code, OP_CODES[op])
        if self._leaders is not None:
            self._leaders.all_reduce(tensor, op)
        self._comm.broadcast(tensor.data_ptr(), tensor.numel(), code, 0)
        return CompletedWork((tensor,))

    def broadcast(self, tensor: torch.Tensor, root: int, *, async_op: bool = True) -> Work:
        root_host = self.hosts.host_of(root)
        pointer, count, code = tensor.data_ptr(), tensor.numel(), DTYPE_CODES[tensor.dtype]
        if self._host == root_host:
            self._comm.broadcast(pointer, count, code, self.hosts.hosts[root_host].index(root))
        if self._leaders is not None:
            self._leaders.broadcast(tensor, root_host)
        if self._host != root_host:
            self._comm.broadcast(pointer, count, code, 0)
        return CompletedWork((tensor,))

    def all_gather_into_tensor(
        self, output: torch.Tensor, tensor: torch.Tensor, *, async_op: bool = True
    ) -> Work:
        count, code = tensor.numel(), DTYPE_CODES[tensor.dtype]
        widest = max(len(ranks) for ranks in self.hosts.hosts)
        on_host = tensor.new_zeros(widest * count)
        self._comm.all_gather(on_host.data_ptr(), tensor.data_ptr(), count, code)
        if self._leaders is not None:
            everywhere = tensor.new_empty((len(self.hosts.hosts), widest, count))
            self._leaders.all_gather_into_tensor(everywhere, on_host)
            rows = output.view(self.size, count)
            for host, ranks in enumerate(self.hosts.hosts):
                rows[list(ranks)] = everywhere[host, : len(ranks)]
        self._comm.broadcast(output.data_ptr(), output.numel(), code, 0)
        return CompletedWork((output,))

    def barrier(self, *, async_op: bool = True) -> Work:
        self._comm.barrier()
        if self._leaders is not None:
            self._leaders.barrier()
        self._comm.barrier()
        return CompletedWork()

    def reduce_scatter_tensor(
        self, output: torch.Tensor, tensor: torch.Tensor, op: ReduceOp, *, async_op: bool = True
    ) -> Work:
        return GenericCollectives.reduce_scatter_tensor(self, output, tensor, op)

    def all_to_all_single(
        self, output: Tensor, tensor: Tensor, out_splits: Splits, in_splits: Splits, *, async_op: bool = True
    ) -> Work:
        return GenericCollectives.all_to_all_single(self, output, tensor, out_splits, in_splits)

    def all_to_all(
        self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], *, async_op: bool = True
    ) -> Work:
        return GenericCollectives.all_to_all(self, outputs, inputs)

    def shutdown(self) -> None:
        self._leaders = None
        super().shutdown()


ShmBackend.build_multi_host = TwoLevelBackend.build
