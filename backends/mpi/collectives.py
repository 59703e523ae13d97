"""The mpi backend's collectives: each one builds its MPI call (buffers, datatypes, reduction)
and hands it to the backend's ``_collective``, which runs it in the configured mode.

:class:`MpiCollectives` is mixed into :class:`~.backend.MpiBackend`, which holds the communicator
and the helpers these methods use (``_comm``, ``_message``, ``_signature``, ``_collective``,
``_via_host`` for CUDA tensors an MPI without CUDA support cannot read).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from commlayer.backends.mpi import layouts as _layouts
from commlayer.core.types import ReduceOp, Splits
from commlayer.core.work import Work

__all__ = ["MpiCollectives"]


class MpiCollectives:
    """The collective ops of :class:`~.backend.MpiBackend` (see the module docstring)."""

    # Supplied by MpiBackend.
    size: int
    rank: int
    _comm: Any
    _cuda_aware: bool
    _in_place: Any
    _reductions: Any
    _collective: Any
    _message: Any
    _signature: Any
    _via_host: Any

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp, *, async_op: bool = True) -> Work:
        if tensor.is_cuda and not self._cuda_aware:
            return self._via_host("all_reduce", tensor, op, async_op=async_op)
        message, mpi_op = self._message(tensor), self._reductions[op][tensor.dtype]
        calls = (self._comm.Allreduce, self._comm.Iallreduce)
        arguments = (self._in_place, message, mpi_op)
        signature = self._signature("all_reduce", tensor, tensor.numel(), reduce_op=op)
        return self._collective("all_reduce", async_op, calls, arguments, [tensor], (tensor,), signature)

    def all_gather_into_tensor(
        self, output: torch.Tensor, tensor: torch.Tensor, *, async_op: bool = True
    ) -> Work:
        if tensor.is_cuda and not self._cuda_aware:
            return self._via_host("all_gather_into_tensor", output, tensor, async_op=async_op)
        mine, gathered = self._message(tensor), self._message(output)
        calls = (self._comm.Allgather, self._comm.Iallgather)
        signature = self._signature("all_gather_into_tensor", tensor, tensor.numel())
        return self._collective(
            "all_gather_into_tensor", async_op, calls, (mine, gathered), [output], (tensor, output), signature
        )

    def broadcast(self, tensor: torch.Tensor, root: int, *, async_op: bool = True) -> Work:
        if tensor.is_cuda and not self._cuda_aware:
            return self._via_host("broadcast", tensor, root, async_op=async_op)
        message = self._message(tensor)
        calls = (self._comm.Bcast, self._comm.Ibcast)
        signature = self._signature("broadcast", tensor, tensor.numel(), root)
        return self._collective("broadcast", async_op, calls, (message, root), [tensor], (tensor,), signature)

    def barrier(self, *, async_op: bool = True) -> Work:
        calls = (self._comm.Barrier, self._comm.Ibarrier)
        return self._collective("barrier", async_op, calls, (), (), (), self._signature("barrier", None, 0))

    # --- native versions of the fallbacks -------------------------------------------------

    def reduce(self, tensor: torch.Tensor, root: int, op: ReduceOp, *, async_op: bool = True) -> Work:
        if tensor.is_cuda and not self._cuda_aware:
            return self._via_host("reduce", tensor, root, op, async_op=async_op)
        message, mpi_op = self._message(tensor), self._reductions[op][tensor.dtype]
        # The root reduces in place; the others only send (MPI ignores their receive buffer).
        send, receive = (self._in_place, message) if self.rank == root else (message, None)
        calls = (self._comm.Reduce, self._comm.Ireduce)
        arguments = (send, receive, mpi_op, root)
        signature = self._signature("reduce", tensor, tensor.numel(), root, op)
        return self._collective("reduce", async_op, calls, arguments, [tensor], (tensor,), signature)

    def all_gather(
        self, outputs: Sequence[torch.Tensor], tensor: torch.Tensor, *, async_op: bool = True
    ) -> Work:
        if tensor.is_cuda and not self._cuda_aware:
            return self._via_host("all_gather", outputs, tensor, async_op=async_op)
        landing = tensor.new_empty(self.size * tensor.numel())
        mine, gathered = self._message(tensor), self._message(landing)
        unpack = functools.partial(_layouts.unpack, landing, outputs)
        calls = (self._comm.Allgather, self._comm.Iallgather)
        keep_alive = (tensor, landing)
        signature = self._signature("all_gather", tensor, tensor.numel())
        return self._collective(
            "all_gather", async_op, calls, (mine, gathered), outputs, keep_alive, signature, unpack
        )

    def all_gather_v(
        self, outputs: Sequence[torch.Tensor], tensor: torch.Tensor, *, async_op: bool = True
    ) -> Work:
        if tensor.is_cuda and not self._cuda_aware:
            return self._via_host("all_gather_v", outputs, tensor, async_op=async_op)
        counts = [output.numel() for output in outputs]
        landing = tensor.new_empty(sum(counts))
        mine, gathered = self._message(tensor), self._message(landing, _layouts.layout(counts))
        unpack = functools.partial(_layouts.unpack, landing, outputs)
        calls = (self._comm.Allgatherv, self._comm.Iallgatherv)
        # The facade has already agreed the counts across ranks: only op and dtype are compared.
        signature = self._signature("all_gather_v", tensor, 0)
        return self._collective(
            "all_gather_v", async_op, calls, (mine, gathered), outputs, (tensor, landing), signature, unpack
        )

    def reduce_scatter_v(
        self, output: torch.Tensor, inputs: Sequence[torch.Tensor], op: ReduceOp, *, async_op: bool = True
    ) -> Work:
        if output.is_cuda and not self._cuda_aware:
            return self._via_host("reduce_scatter_v", output, inputs, op, async_op=async_op)
        packed = torch.cat([chunk.reshape(-1) for chunk in inputs])  # MPI reduces one contiguous buffer
        counts = [chunk.numel() for chunk in inputs]
        send, receive = self._message(packed), self._message(output)
        calls = (self._comm.Reduce_scatter, self._comm.Ireduce_scatter)
        arguments = (send, receive, counts, self._reductions[op][output.dtype])
        signature = self._signature("reduce_scatter_v", output, 0, reduce_op=op)
        return self._collective(
            "reduce_scatter_v", async_op, calls, arguments, [output], (packed, output), signature
        )

    def reduce_scatter(
        self, output: torch.Tensor, inputs: Sequence[torch.Tensor], op: ReduceOp, *, async_op: bool = True
    ) -> Work:
        packed = torch.cat([chunk.reshape(-1) for chunk in inputs])  # MPI reduces one contiguous buffer
        return self.reduce_scatter_tensor(output, packed, op, async_op=async_op)

    def reduce_scatter_tensor(
        self, output: torch.Tensor, tensor: torch.Tensor, op: ReduceOp, *, async_op: bool = True
    ) -> Work:
        if tensor.is_cuda and not self._cuda_aware:
            return self._via_host("reduce_scatter_tensor", output, tensor, op, async_op=async_op)
        send, receive = self._message(tensor), self._message(output)
        mpi_op = self._reductions[op][tensor.dtype]
        calls = (self._comm.Reduce_scatter_block, self._comm.Ireduce_scatter_block)
        arguments, keep_alive = (send, receive, mpi_op), (tensor, output)
        signature = self._signature("reduce_scatter_tensor", output, output.numel(), reduce_op=op)
        return self._collective(
            "reduce_scatter_tensor", async_op, calls, arguments, [output], keep_alive, signature
        )

    def all_to_all_single(
        self, output: Tensor, tensor: Tensor, out_splits: Splits, in_splits: Splits, *, async_op: bool = True
    ) -> Work:
        if tensor.is_cuda and not self._cuda_aware:
            return self._via_host(
                "all_to_all_single", output, tensor, out_splits, in_splits, async_op=async_op
            )
        # Uneven splits differ between ranks by design: only op and dtype are compared then.
        signature = self._signature("all_to_all_single", tensor, tensor.numel())
        if not out_splits and not in_splits:
            send, receive = self._message(tensor), self._message(output)
            calls = (self._comm.Alltoall, self._comm.Ialltoall)
        else:
            signature = self._signature("all_to_all_single", tensor, 0)
            send = self._message(tensor, _layouts.counts_and_displacements(tensor, in_splits, self.size))
            receive = self._message(output, _layouts.counts_and_displacements(output, out_splits, self.size))
            calls = (self._comm.Alltoallv, self._comm.Ialltoallv)
        return self._collective(
            "all_to_all_single", async_op, calls, (send, receive), [output], (tensor, output), signature
        )

    def all_to_all(
        self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], *, async_op: bool = True
    ) -> Work:
        if inputs[0].is_cuda and not self._cuda_aware:
            return self._via_host("all_to_all", outputs, inputs, async_op=async_op)
        # One packed buffer per side: MPI's vector all-to-all needs a single base address.
        packed = torch.cat([chunk.reshape(-1) for chunk in inputs])
        landing = packed.new_empty(sum(output.numel() for output in outputs))
        send = self._message(packed, _layouts.layout([chunk.numel() for chunk in inputs]))
        receive = self._message(landing, _layouts.layout([output.numel() for output in outputs]))
        unpack = functools.partial(_layouts.unpack, landing, outputs)
        calls = (self._comm.Alltoallv, self._comm.Ialltoallv)
        keep_alive = (packed, landing)
        signature = self._signature("all_to_all", packed, 0)
        return self._collective(
            "all_to_all", async_op, calls, (send, receive), outputs, keep_alive, signature, unpack
        )

    def gather(
        self, tensor: Tensor, outputs: Sequence[Tensor] | None, root: int, *, async_op: bool = True
    ) -> Work:
        if tensor.is_cuda and not self._cuda_aware:
            return self._via_host("gather", tensor, outputs, root, async_op=async_op)
        landing = tensor.new_empty(self.size * tensor.numel()) if outputs is not None else None
        receive = self._message(landing) if landing is not None else None
        unpack = functools.partial(_layouts.unpack, landing, outputs) if outputs is not None else None
        calls, arguments = (self._comm.Gather, self._comm.Igather), (self._message(tensor), receive, root)
        keep_alive = (tensor, landing)
        signature = self._signature("gather", tensor, tensor.numel(), root)
        return self._collective(
            "gather", async_op, calls, arguments, outputs or (), keep_alive, signature, unpack
        )

    def scatter(
        self, output: Tensor, inputs: Sequence[Tensor] | None, root: int, *, async_op: bool = True
    ) -> Work:
        if output.is_cuda and not self._cuda_aware:
            return self._via_host("scatter", output, inputs, root, async_op=async_op)
        packed = torch.cat([chunk.reshape(-1) for chunk in inputs]) if inputs is not None else None
        send = self._message(packed) if packed is not None else None
        calls, arguments = (self._comm.Scatter, self._comm.Iscatter), (send, self._message(output), root)
        signature = self._signature("scatter", output, output.numel(), root)
        return self._collective("scatter", async_op, calls, arguments, [output], (packed, output), signature)
