"""A real ``torch.distributed.ProcessGroup`` whose ops run on a commlayer group.

torch accepts ProcessGroups written in Python: its C++ callers (DDP's Reducer, functional
collectives, compiled graphs) reach these methods through pybind's trampoline, exactly like
Python callers. Each method unpacks torch's option struct and calls the commlayer facade on the
wrapped group, so validation, staging of strided tensors, the comms logger and every backend (mpi,
ccl, hccl, plugins) come for free, and bad input raises the facade's error, naming the op::

    pg = CommlayerProcessGroup(dist.new_group([0, 2]), "commlayer:group1")
    DistributedDataParallel(model, process_group=pg)   # gradients all-reduced by commlayer
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as torch_dist

from commlayer.core.errors import invalid_argument
from commlayer.core.types import ReduceOp
from commlayer.core.work import Work, WorkList
from commlayer.facade.groups.group import ProcessGroup, world_or_none
from commlayer.facade.lifecycle.process_groups import destroy_process_group
from commlayer.facade.ops import in_place as planned
from commlayer.facade.ops import into_tensor as paired
from commlayer.facade.ops import p2p, rooted
from commlayer.facade.ops import tensor_lists as coll
from commlayer.facade.ops.coalesced import all_reduce_coalesced
from commlayer.facade.torch_bridge.work import BridgeWork, Completer, inline_futures

__all__ = ["CommlayerProcessGroup"]

_TORCH_SUM = torch_dist.ReduceOp.SUM
# torch's RedOpType (a hashable enum) -> commlayer's ReduceOp: one dict lookup per op.
_REDUCE_OPS = {
    getattr(torch_dist.ReduceOp.RedOpType, op.name): op
    for op in ReduceOp
    if hasattr(torch_dist.ReduceOp.RedOpType, op.name)
}


class CommlayerProcessGroup(torch_dist.ProcessGroup):
    """torch's ProcessGroup interface over commlayer group ``group``; ranks are group ranks."""

    #: True when torch's ``init_process_group("commlayer")`` created commlayer's world for it; torch's
    #: ``destroy_process_group`` then tears that world down too.
    owns_world = False
    #: True when torch's ``new_group(backend="commlayer")`` built commlayer's group for it (see
    #: ``commlayer.facade.torch_bridge.groups``); torch's ``destroy_process_group`` then tears that group down.
    owns_group = False

    def __init__(self, group: ProcessGroup, group_name: str) -> None:
        super().__init__(group.rank(), group.size())
        self.commlayer_group = group
        self._group_name = group_name
        self._group_desc = group_name
        self._completer = Completer(group_name, inline_futures(os.environ))

    # --- identity ---------------------------------------------------------------------------

    def getBackendName(self) -> str:
        return "commlayer"

    def getGroupName(self) -> str:
        return self._group_name

    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupDesc(self) -> str:
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    @property
    def group_name(self) -> str:
        return self._group_name

    @property
    def group_desc(self) -> str:
        return self._group_desc

    def shutdown(self) -> None:
        """Called by torch's destroy_process_group: ends the commlayer world or group torch started."""
        self._completer.close()
        if self.owns_world:
            self.owns_world = False
            _end_world()
        elif self.owns_group:
            self.owns_group = False
            _end_group(self.commlayer_group)

    def __repr__(self) -> str:
        return f"CommlayerProcessGroup({self._group_name!r}, over {self.commlayer_group!r})"

    def _get_backend(self, device: Any) -> Any:
        """torch's backend under this group's backend for ``device``, as torch asks for it.

        torch's ``init_process_group(device_id=...)`` (DeepSpeed passes one on CUDA) and FSDP2's
        buffer allocation read it: here it is that of the torch group the device's commlayer
        backend stands on (peermem's NCCL, shm's gloo companion, gloo or nccl themselves).

        Raises:
            RuntimeError: the device's backend stands on no torch group (mpi, ccl, plugins), as
                torch's own ProcessGroup raises for a device it has no backend for.
        """
        device = torch.device(device)
        backend = self.commlayer_group.backend_for(device.type)
        torch_group = None if backend is None else backend.torch_group
        if torch_group is None:
            served = backend.name if backend is not None else "no backend"
            raise RuntimeError(
                f"_get_backend: group {self._group_name!r} serves device type '{device.type}' with "
                f"{served}, which stands on no torch backend (rank {self.commlayer_group.global_rank})"
            )
        return torch_group._get_backend(device)

    # --- collectives ------------------------------------------------------------------------

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> BridgeWork:
        # DDP's op, once per bucket: the common case is written out here, without helper frames.
        if type(tensors) is list and len(tensors) == 1:
            tensor = tensors[0]
        else:
            tensor = self._single("all_reduce", "tensors", tensors)
        op = ReduceOp.SUM if opts is None or opts.reduceOp == _TORCH_SUM else _reduce_op(opts)
        bridged = BridgeWork()
        bridged._work = planned.all_reduce(tensor, op, self.commlayer_group, True)
        bridged._result = tensors
        bridged._completer = self._completer
        return bridged

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> BridgeWork:
        work = all_reduce_coalesced(tensors, _reduce_op(opts), self.commlayer_group, async_op=True)
        return self._bridged(work, tensors)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> BridgeWork:
        tensor = self._single("broadcast", "tensors", tensors)
        work = planned.broadcast(tensor, group=self.commlayer_group, async_op=True, group_src=_root(opts))
        return self._bridged(work, tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> BridgeWork:
        tensor = self._single("reduce", "tensors", tensors)
        work = rooted.reduce(
            tensor, op=_reduce_op(opts), group=self.commlayer_group, async_op=True, group_dst=_root(opts)
        )
        return self._bridged(work, tensors)

    def allgather(
        self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor], opts: Any = None
    ) -> BridgeWork:
        outputs = self._single("all_gather", "output_tensors", output_tensors)
        tensor = self._single("all_gather", "input_tensors", input_tensors)
        work = coll.all_gather(outputs, tensor, self.commlayer_group, async_op=True)
        return self._bridged(work, outputs)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> BridgeWork:
        source = _unaliased(input, output)
        work = paired.all_gather_into_tensor(output, source, self.commlayer_group, async_op=True)
        return self._bridged(work, [output])

    def allgather_into_tensor_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> BridgeWork:
        works = [
            paired.all_gather_into_tensor(
                output, _unaliased(tensor, output), self.commlayer_group, async_op=True
            )
            for output, tensor in zip(outputs, inputs)
        ]
        return self._bridged(WorkList(works, outputs), outputs)

    def reduce_scatter(
        self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any = None
    ) -> BridgeWork:
        output = self._single("reduce_scatter", "outputs", outputs)
        inputs = self._single("reduce_scatter", "input_lists", input_lists)
        work = coll.reduce_scatter(output, inputs, _reduce_op(opts), self.commlayer_group, async_op=True)
        return self._bridged(work, outputs)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> BridgeWork:
        source = _unaliased(input, output)
        work = paired.reduce_scatter_tensor(
            output, source, _reduce_op(opts), self.commlayer_group, async_op=True
        )
        return self._bridged(work, [output])

    def reduce_scatter_tensor_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> BridgeWork:
        op = _reduce_op(opts)
        works = [
            paired.reduce_scatter_tensor(
                output, _unaliased(tensor, output), op, self.commlayer_group, async_op=True
            )
            for output, tensor in zip(outputs, inputs)
        ]
        return self._bridged(WorkList(works, outputs), outputs)

    def alltoall_base(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> BridgeWork:
        work = paired.all_to_all_single(
            output,
            input,
            output_split_sizes or None,
            input_split_sizes or None,
            self.commlayer_group,
            async_op=True,
        )
        return self._bridged(work, [output])

    def alltoall(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> BridgeWork:
        work = coll.all_to_all(outputs, inputs, self.commlayer_group, async_op=True)
        return self._bridged(work, outputs)

    def gather(
        self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None
    ) -> BridgeWork:
        tensor = self._single("gather", "input_tensors", inputs)
        root = _root(opts)
        outputs = output_lists[0] if output_lists and root == self.commlayer_group.rank() else None
        work = rooted.gather(tensor, outputs, group=self.commlayer_group, async_op=True, group_dst=root)
        return self._bridged(work, outputs or [])

    def scatter(
        self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any = None
    ) -> BridgeWork:
        tensor = self._single("scatter", "output_tensors", outputs)
        root = _root(opts)
        inputs = input_lists[0] if input_lists and root == self.commlayer_group.rank() else None
        work = rooted.scatter(tensor, inputs, group=self.commlayer_group, async_op=True, group_src=root)
        return self._bridged(work, outputs)

    def barrier(self, opts: Any = None) -> BridgeWork:
        return self._bridged(coll.barrier(self.commlayer_group, async_op=True), [])

    # --- point to point: peers are group ranks ----------------------------------------------

    def send(self, tensors: list[torch.Tensor], dstRank: int, tag: int = 0) -> BridgeWork:
        tensor = self._single("send", "tensors", tensors)
        return self._bridged(
            p2p.isend(tensor, group=self.commlayer_group, tag=tag, group_dst=dstRank), tensors
        )

    def recv(self, tensors: list[torch.Tensor], srcRank: int, tag: int = 0) -> BridgeWork:
        tensor = self._single("recv", "tensors", tensors)
        return self._bridged(
            p2p.irecv(tensor, group=self.commlayer_group, tag=tag, group_src=srcRank), tensors
        )

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> BridgeWork:
        tensor = self._single("recv", "tensors", tensors)
        return self._bridged(p2p.irecv(tensor, group=self.commlayer_group, tag=tag), tensors)

    # torch 2.13's Python wrappers call these names; C++ callers use the ones above.
    all_gather_single = _allgather_base
    all_gather_single_coalesced = allgather_into_tensor_coalesced
    reduce_scatter_single = _reduce_scatter_base
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced
    all_to_all_single = alltoall_base

    def _bridged(self, work: Work, result: list[torch.Tensor]) -> BridgeWork:
        """BridgeWork.over, inlined: one frame less on every op."""
        bridged = BridgeWork()
        bridged._work = work
        bridged._result = result
        bridged._completer = self._completer
        return bridged

    def _single(self, op: str, arg: str, values: Any) -> Any:
        """torch passes one-element lists (its multi-device form); commlayer takes the element."""
        if isinstance(values, (list, tuple)) and len(values) == 1:
            return values[0]
        received = f"{len(values)} entries" if isinstance(values, (list, tuple)) else type(values).__name__
        raise invalid_argument(
            op, arg, "a list of exactly one entry", received, self.commlayer_group.global_rank
        )


def _end_world() -> None:
    world = world_or_none()
    if world is not None:
        for group in (world.default_group, *world.groups.values()):
            group.bridge = None  # torch is already dropping them: nothing to unregister
        destroy_process_group()


def _end_group(group: ProcessGroup) -> None:
    world = world_or_none()
    if world is not None and world.groups.get(group.group_name) is group:  # not already torn down
        group.bridge = None  # torch is already dropping it: nothing to unregister
        destroy_process_group(group)


def _reduce_op(opts: Any) -> Any:
    """commlayer's ReduceOp for torch's; anything else goes on to the facade, which names it."""
    if opts is None:
        return ReduceOp.SUM
    torch_op = opts.reduceOp
    if torch_op == _TORCH_SUM:  # one pybind comparison: cheaper than reading the op's type
        return ReduceOp.SUM
    return _REDUCE_OPS.get(torch_op.op, torch_op.op)


def _unaliased(source: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    """``source``, copied when it shares memory with ``output``.

    FSDP2 gathers in place (its input is a slice of the output), which torch's NCCL allows but MPI
    forbids ("buffers must not be aliased"); a copy of one shard keeps every backend correct.
    """
    if source.untyped_storage().data_ptr() == output.untyped_storage().data_ptr():
        return source.clone()
    return source


def _root(opts: Any) -> int:
    return 0 if opts is None else int(opts.rootRank)
