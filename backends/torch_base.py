"""Shared base of the backends that run on a ``torch.distributed`` ProcessGroup (gloo, nccl, hccl).

The world is torch's default process group and each subgroup is a ``torch.distributed.new_group``,
so ``group.torch_group`` is a real ProcessGroup that DDP and FSDP accept.
"""

from __future__ import annotations

import atexit
import functools
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, ClassVar

import torch
import torch.distributed as torch_dist
from torch import Tensor

from commlayer.backends.torch_fast_paths import TORCH_OPS as _TORCH_OPS
from commlayer.backends.torch_fast_paths import fused_plan, options
from commlayer.backends.torch_fast_paths import wrap as _wrap
from commlayer.contract.backend import Backend
from commlayer.contract.fallbacks import P2PRequest
from commlayer.contract.fast_paths import FastPath
from commlayer.contract.takeover import torch_own
from commlayer.core.flight_recorder import Recording
from commlayer.core.types import Availability, GroupSpec, ReduceOp, Splits
from commlayer.core.work import TorchWork, Work, WorkList

__all__ = ["TorchBackend"]

# The hot ops call the ProcessGroup's methods directly: the facade has already checked everything
# torch's Python wrappers would. Their options objects are built once here and only read after.
_MODES = (True, False)
_ALLREDUCE_OPTIONS = {
    (op, mode): options(torch_dist.AllreduceOptions, mode, reduceOp=_TORCH_OPS[op])
    for op in ReduceOp
    for mode in _MODES
}
_REDUCE_SCATTER_OPTIONS = {
    (op, mode): options(torch_dist.ReduceScatterOptions, mode, reduceOp=_TORCH_OPS[op])
    for op in ReduceOp
    for mode in _MODES
}
_ALLGATHER_OPTIONS = {mode: options(torch_dist.distributed_c10d.AllgatherOptions, mode) for mode in _MODES}


# Shut-down torch ProcessGroups stay referenced here until the next init or interpreter exit.
# Why: a gloo ProcessGroup's destructor joins its worker threads, and a worker may still be
# releasing the Python tensors of the op that just finished, which needs the GIL. When the last
# reference dies inside a destructor that holds the GIL (DDP's Reducer, if the model outlives
# destroy_process_group) the two threads wait for each other forever. Released from plain Python
# code, long after their last op, the groups are destroyed with the GIL free and idle workers.
_retired_process_groups: list[Any] = []
atexit.register(_retired_process_groups.clear)


@functools.cache
def _broadcast_options(root: int, async_op: bool) -> Any:
    # rootRank is a group rank: the ProcessGroup counts its own members.
    return options(torch_dist.BroadcastOptions, async_op, rootRank=root)


class TorchBackend(Backend):
    """A communicator over one torch ProcessGroup; subclasses name the torch backend.

    Ops take the facade's ``async_op``; only the hot ops use it. They never see AVG unless the
    subclass declares ``Capabilities.native_avg`` (the facade sums and divides otherwise).
    """

    torch_backend: ClassVar[str]
    #: Ops the torch library lacks for this backend; they use the generic fallbacks instead.
    generic_ops: ClassVar[frozenset[str]] = frozenset()
    # torch's dispatcher and ProcessGroup record each call's profiler events themselves.
    records_profiler_events: ClassVar[bool] = True

    def __init__(self, spec: GroupSpec, process_group: Any) -> None:
        super().__init__(spec)
        self._pg = process_group

    @classmethod
    def is_available(cls) -> Availability:
        if not torch_dist.is_available():
            return Availability.no("this torch build has no torch.distributed")
        if not torch_dist.is_backend_available(cls.torch_backend):
            return Availability.no(f"this torch build has no '{cls.torch_backend}' support")
        return Availability.yes()

    @classmethod
    def create_world(cls, spec: GroupSpec) -> TorchBackend:
        _retired_process_groups.clear()
        if torch_dist.is_initialized():
            # Another torch backend owns the default group (e.g. "cpu:gloo,cuda:nccl").
            return cls(spec, cls._torch_new_group(spec))
        with torch_own():
            torch_dist.init_process_group(
                backend=cls.torch_backend,
                store=spec.store,
                rank=spec.global_rank,
                world_size=spec.size,
                timeout=spec.timeout,
            )
        return cls(spec, torch_dist.group.WORLD)

    def new_group(self, spec: GroupSpec) -> TorchBackend | None:
        # Called on the world communicator: a world rank is its group rank (a shrunk world's
        # ranks differ from torch's own, which the mapping keeps).
        torch_ranks = [torch_dist.get_global_rank(self._pg, rank) for rank in spec.ranks]
        process_group = self._torch_new_group(spec, torch_ranks)
        return type(self)(spec, process_group) if spec.is_member else None

    def shrink(self, survivors: tuple[int, ...], spec: GroupSpec) -> TorchBackend:
        """A torch group over the survivors, synchronised by them alone through torch's store."""
        torch_ranks = [torch_dist.get_global_rank(self._pg, rank) for rank in survivors]
        return type(self)(spec, self._torch_new_group(replace(spec, members_only=True), torch_ranks))

    @classmethod
    def _torch_new_group(cls, spec: GroupSpec, torch_ranks: list[int] | None = None) -> Any:
        # Members only: torch synchronises just them (its group name then comes from their ranks).
        with torch_own():
            return torch_dist.new_group(
                ranks=list(spec.ranks) if torch_ranks is None else torch_ranks,
                timeout=spec.timeout,
                backend=cls.torch_backend,
                use_local_synchronization=spec.members_only,
            )

    def shutdown(self) -> None:
        _retired_process_groups.append(self._pg)
        if self._pg is torch_dist.group.WORLD and torch_dist.is_initialized():
            torch_dist.destroy_process_group()

    @property
    def torch_group(self) -> Any:
        return self._pg

    def recorded_plan(self, op: str, fixed: tuple[Any, ...], recording: Recording) -> FastPath | None:
        """Fast paths for the hot ops, each entering its calls in the flight recorder.

        ``plan`` stays the contract's default (None): without a recording (debug mode, where each
        collective is verified across ranks first anyway) the facade's generic fast path serves.
        """
        if op in self.generic_ops:
            return None
        return fused_plan(self._pg, op, fixed, recording)

    def _global(self, group_rank: int) -> int:
        """torch's global rank of ``group_rank`` (not the facade's, once the world shrank)."""
        return torch_dist.get_global_rank(self._pg, group_rank)

    # --- core ----------------------------------------------------------------------------

    # With asyncOp False, torch's NCCL may run the op on the caller's stream and hand back no
    # Work at all: the op is then already ordered before anything the caller enqueues next.

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp, *, async_op: bool = True) -> Work:
        return _wrap(self._pg.allreduce([tensor], _ALLREDUCE_OPTIONS[op, async_op]), (tensor,))

    def all_gather_into_tensor(
        self, output: torch.Tensor, tensor: torch.Tensor, *, async_op: bool = True
    ) -> Work:
        return _wrap(self._pg._allgather_base(output, tensor, _ALLGATHER_OPTIONS[async_op]), (output,))

    def broadcast(self, tensor: torch.Tensor, root: int, *, async_op: bool = True) -> Work:
        return _wrap(self._pg.broadcast([tensor], _broadcast_options(root, async_op)), (tensor,))

    def barrier(self, *, async_op: bool = True) -> Work:
        return TorchWork(torch_dist.barrier(self._pg, async_op=True))

    def send(self, tensor: torch.Tensor, dst: int, tag: int, *, async_op: bool = True) -> Work:
        return _wrap(self._pg.send([tensor], dst, tag), ())

    def recv(self, tensor: torch.Tensor, src: int, tag: int, *, async_op: bool = True) -> Work:
        return _wrap(self._pg.recv([tensor], src, tag), (tensor,))

    # --- native versions of the fallbacks -------------------------------------------------

    def reduce(self, tensor: torch.Tensor, root: int, op: ReduceOp, *, async_op: bool = True) -> Work:
        if "reduce" in self.generic_ops:
            return super().reduce(tensor, root, op, async_op=async_op)
        work = torch_dist.reduce(tensor, self._global(root), _TORCH_OPS[op], self._pg, async_op=True)
        return TorchWork(work, [tensor])

    def all_gather(
        self, outputs: Sequence[torch.Tensor], tensor: torch.Tensor, *, async_op: bool = True
    ) -> Work:
        if "all_gather" in self.generic_ops:
            return super().all_gather(outputs, tensor, async_op=async_op)
        work = torch_dist.all_gather(list(outputs), tensor, self._pg, async_op=True)
        return TorchWork(work, list(outputs))

    def reduce_scatter_tensor(
        self, output: torch.Tensor, tensor: torch.Tensor, op: ReduceOp, *, async_op: bool = True
    ) -> Work:
        if "reduce_scatter_tensor" in self.generic_ops:
            return super().reduce_scatter_tensor(output, tensor, op, async_op=async_op)
        options = _REDUCE_SCATTER_OPTIONS[op, async_op]
        return _wrap(self._pg._reduce_scatter_base(output, tensor, options), (output,))

    def reduce_scatter(
        self, output: torch.Tensor, inputs: Sequence[torch.Tensor], op: ReduceOp, *, async_op: bool = True
    ) -> Work:
        if "reduce_scatter" in self.generic_ops:
            return super().reduce_scatter(output, inputs, op, async_op=async_op)
        work = torch_dist.reduce_scatter(output, list(inputs), _TORCH_OPS[op], self._pg, async_op=True)
        return TorchWork(work, [output])

    def all_to_all_single(
        self, output: Tensor, tensor: Tensor, out_splits: Splits, in_splits: Splits, *, async_op: bool = True
    ) -> Work:
        if "all_to_all_single" in self.generic_ops:
            return super().all_to_all_single(output, tensor, out_splits, in_splits, async_op=async_op)
        splits = (_as_list(out_splits), _as_list(in_splits))
        work = torch_dist.all_to_all_single(output, tensor, *splits, group=self._pg, async_op=True)
        return TorchWork(work, [output])

    def all_to_all(
        self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], *, async_op: bool = True
    ) -> Work:
        if "all_to_all" in self.generic_ops:
            return super().all_to_all(outputs, inputs, async_op=async_op)
        work = torch_dist.all_to_all(list(outputs), list(inputs), self._pg, async_op=True)
        return TorchWork(work, list(outputs))

    def gather(
        self, tensor: Tensor, outputs: Sequence[Tensor] | None, root: int, *, async_op: bool = True
    ) -> Work:
        if "gather" in self.generic_ops:
            return super().gather(tensor, outputs, root, async_op=async_op)
        gather_list = list(outputs) if outputs is not None else None
        work = torch_dist.gather(tensor, gather_list, self._global(root), self._pg, async_op=True)
        return TorchWork(work, gather_list or [])

    def scatter(
        self, output: Tensor, inputs: Sequence[Tensor] | None, root: int, *, async_op: bool = True
    ) -> Work:
        if "scatter" in self.generic_ops:
            return super().scatter(output, inputs, root, async_op=async_op)
        scatter_list = list(inputs) if inputs is not None else None
        work = torch_dist.scatter(output, scatter_list, self._global(root), self._pg, async_op=True)
        return TorchWork(work, [output])

    def batch_p2p(self, requests: Sequence[P2PRequest], *, async_op: bool = True) -> list[Work]:
        ops = [
            torch_dist.P2POp(
                torch_dist.isend if r.kind == "send" else torch_dist.irecv,
                r.tensor,
                self._global(r.peer),
                self._pg,
                r.tag,
            )
            for r in requests
        ]
        works = [TorchWork(work) for work in torch_dist.batch_isend_irecv(ops)]
        # NCCL coalesces a batch into one work; every request then completes with it.
        return works if len(works) == len(requests) else [WorkList(works)] * len(requests)

    def recv_any(self, tensor: torch.Tensor, tag: int, *, async_op: bool = True) -> Work:
        return TorchWork(torch_dist.irecv(tensor, None, self._pg, tag), [tensor])


def _as_list(splits: Sequence[int] | None) -> list[int] | None:
    return list(splits) if splits else None
