"""Generic collectives built only on a backend's mandatory core.

Every backend inherits these, so every backend offers every facade op; a backend overrides one
when its library has a faster native version. All ranks here are group ranks and every tensor is
contiguous (the facade stages non-contiguous ones).

Point-to-point exchanges order each pair of peers the same way on both sides (the lower rank sends
first), so they cannot deadlock even on a library whose send blocks until the receive is posted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

import torch
from torch import Tensor

from commlayer.core.types import ReduceOp, Splits
from commlayer.core.work import CompletedWork, Work, WorkList

__all__ = ["FALLBACK_TAG", "CoreOps", "GenericCollectives", "P2PRequest"]

# Tag reserved for the messages fallbacks exchange; user tags stay below it in practice.
FALLBACK_TAG = 0x6C6D


class P2PRequest(NamedTuple):
    """One send or receive of a batch; ``peer`` is a group rank."""

    kind: str  # "send" | "recv"
    tensor: Tensor
    peer: int
    tag: int


class CoreOps(Protocol):
    """The part of :class:`~commlayer.contract.backend.Backend` the fallbacks build on (no import of it,
    so the contract module and this one do not import each other)."""

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    def all_reduce(self, tensor: Tensor, op: ReduceOp, *, async_op: bool) -> Work: ...

    def all_gather_into_tensor(self, output: Tensor, tensor: Tensor, *, async_op: bool) -> Work: ...

    def send(self, tensor: Tensor, dst: int, tag: int, *, async_op: bool) -> Work: ...

    def recv(self, tensor: Tensor, src: int, tag: int, *, async_op: bool) -> Work: ...

    def reduce_scatter_tensor(
        self, output: Tensor, tensor: Tensor, op: ReduceOp, *, async_op: bool
    ) -> Work: ...

    def all_to_all(self, outputs: Sequence[Tensor], inputs: Sequence[Tensor], *, async_op: bool) -> Work: ...


class GenericCollectives:
    """Mixin of fallbacks; ``self`` is a :class:`~commlayer.contract.backend.Backend`.

    Collective-built fallbacks pass the facade's ``async_op`` on; the ones built from sends and
    receives post them all asynchronously first, then hand back one Work over them.
    """

    def batch_p2p(self: CoreOps, requests: Sequence[P2PRequest], *, async_op: bool = True) -> list[Work]:
        """Post sends and receives as one batch.

        Posting them one by one is right for libraries whose send does not wait for the
        matching receive (gloo, MPI); NCCL's backend overrides this to group them.
        """
        return [
            self.send(r.tensor, r.peer, r.tag, async_op=True)
            if r.kind == "send"
            else self.recv(r.tensor, r.peer, r.tag, async_op=True)
            for r in requests
        ]

    def reduce(self: CoreOps, tensor: Tensor, root: int, op: ReduceOp, *, async_op: bool = True) -> Work:
        scratch = tensor.clone()
        work = self.all_reduce(scratch, op, async_op=async_op)
        if self.rank != root:
            return work
        return work.then(lambda: tensor.copy_(scratch))

    def all_gather(
        self: CoreOps, outputs: Sequence[Tensor], tensor: Tensor, *, async_op: bool = True
    ) -> Work:
        # Flat, as the contract promises all_gather_into_tensor's output (the facade passes 1-D).
        gathered = tensor.new_empty(self.size * tensor.numel())
        work = self.all_gather_into_tensor(gathered, tensor, async_op=async_op)

        def scatter_rows() -> None:
            for row, output in zip(gathered.view(self.size, -1), outputs):
                output.copy_(row.view_as(output))

        return work.then(scatter_rows)

    def all_gather_v(
        self: CoreOps, outputs: Sequence[Tensor], tensor: Tensor, *, async_op: bool = True
    ) -> Work:
        # Every rank pads its part to the largest one, so one even all-gather carries them all.
        widest = max(output.numel() for output in outputs)
        padded = tensor.new_zeros(widest)
        padded[: tensor.numel()].copy_(tensor.view(-1))
        gathered = tensor.new_empty(self.size * widest)
        work = self.all_gather_into_tensor(gathered, padded, async_op=async_op)

        def unpad_rows() -> None:
            for row, output in zip(gathered.view(self.size, widest), outputs):
                output.view(-1).copy_(row[: output.numel()])

        return work.then(unpad_rows)

    def reduce_scatter_v(
        self: CoreOps, output: Tensor, inputs: Sequence[Tensor], op: ReduceOp, *, async_op: bool = True
    ) -> Work:
        # Padding is reduced with the rest and then dropped, so it may hold any value (zeros).
        widest = max(chunk.numel() for chunk in inputs)
        padded = output.new_zeros(self.size, widest)
        for row, chunk in zip(padded, inputs):
            row[: chunk.numel()].copy_(chunk.view(-1))
        mine = output.new_empty(widest)
        work = self.reduce_scatter_tensor(mine, padded.view(-1), op, async_op=async_op)
        return work.then(lambda: output.view(-1).copy_(mine[: output.numel()]))

    def reduce_scatter_tensor(
        self: CoreOps, output: Tensor, tensor: Tensor, op: ReduceOp, *, async_op: bool = True
    ) -> Work:
        scratch = tensor.clone()
        work = self.all_reduce(scratch, op, async_op=async_op)
        count = output.numel()
        mine = scratch.view(-1)[self.rank * count : (self.rank + 1) * count]
        return work.then(lambda: output.copy_(mine.view_as(output)))

    def reduce_scatter(
        self: CoreOps, output: Tensor, inputs: Sequence[Tensor], op: ReduceOp, *, async_op: bool = True
    ) -> Work:
        flat = torch.cat([chunk.reshape(-1) for chunk in inputs])
        return self.reduce_scatter_tensor(output, flat, op, async_op=async_op)

    def all_to_all_single(
        self: CoreOps,
        output: Tensor,
        tensor: Tensor,
        out_splits: Splits,
        in_splits: Splits,
        *,
        async_op: bool = True,
    ) -> Work:
        outputs = _split_rows(output, out_splits, self.size)
        inputs = _split_rows(tensor, in_splits, self.size)
        return self.all_to_all(outputs, inputs, async_op=async_op)

    def all_to_all(
        self: CoreOps, outputs: Sequence[Tensor], inputs: Sequence[Tensor], *, async_op: bool = True
    ) -> Work:
        outputs[self.rank].copy_(inputs[self.rank])
        works: list[Work] = []
        for peer in range(self.size):
            if peer != self.rank:
                works += _exchange(self, peer, inputs[peer], outputs[peer])
        return WorkList(works)

    def gather(
        self: CoreOps, tensor: Tensor, outputs: Sequence[Tensor] | None, root: int, *, async_op: bool = True
    ) -> Work:
        if self.rank != root:
            return self.send(tensor, root, FALLBACK_TAG, async_op=async_op)
        assert outputs is not None
        outputs[root].copy_(tensor)
        peers = [peer for peer in range(self.size) if peer != root]
        return WorkList([self.recv(outputs[peer], peer, FALLBACK_TAG, async_op=True) for peer in peers])

    def scatter(
        self: CoreOps, output: Tensor, inputs: Sequence[Tensor] | None, root: int, *, async_op: bool = True
    ) -> Work:
        if self.rank != root:
            return self.recv(output, root, FALLBACK_TAG, async_op=async_op)
        assert inputs is not None
        output.copy_(inputs[root])
        peers = [peer for peer in range(self.size) if peer != root]
        sends = [self.send(inputs[peer].contiguous(), peer, FALLBACK_TAG, async_op=True) for peer in peers]
        return WorkList(sends)

    def all_reduce_coalesced(
        self: CoreOps, tensors: Sequence[torch.Tensor], op: ReduceOp, *, async_op: bool = True
    ) -> Work:
        """torch's coalesced all-reduce: the tensors (one dtype) packed into one all_reduce."""
        packed = torch.cat([tensor.reshape(-1) for tensor in tensors])
        work = self.all_reduce(packed, op, async_op=async_op)
        return work.then(lambda: _unpack(packed, tensors), result=list(tensors))

    def all_gather_coalesced(
        self: CoreOps,
        outputs: Sequence[Sequence[torch.Tensor]],
        inputs: Sequence[torch.Tensor],
        *,
        async_op: bool = True,
    ) -> Work:
        """torch's coalesced all-gather: ``outputs[r][i]`` receives group rank r's ``inputs[i]``,
        the inputs packed into one all_gather_into_tensor."""
        packed = torch.cat([tensor.reshape(-1) for tensor in inputs])
        gathered = packed.new_empty(self.size * packed.numel())
        work = self.all_gather_into_tensor(gathered, packed, async_op=async_op)
        rows = gathered.view(self.size, -1)
        unpack = lambda: [_unpack(row, tensors) for row, tensors in zip(rows, outputs)]
        return work.then(unpack, result=[tensor for row in outputs for tensor in row])


def _unpack(packed: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Copy consecutive pieces of the flat ``packed`` into ``tensors``."""
    offset = 0
    for tensor in tensors:
        tensor.copy_(packed[offset : offset + tensor.numel()].view_as(tensor))
        offset += tensor.numel()


def _split_rows(tensor: Tensor, splits: Sequence[int] | None, parts: int) -> list[Tensor]:
    """Split along dim 0 into ``parts`` chunks; contiguous input gives contiguous chunks."""
    if not splits:
        return list(tensor.chunk(parts)) if tensor.numel() else [tensor] * parts
    return list(torch.split(tensor, list(splits)))


def _exchange(backend: CoreOps, peer: int, outgoing: Tensor, incoming: Tensor) -> list[Work]:
    send = lambda: backend.send(outgoing.contiguous(), peer, FALLBACK_TAG, async_op=True)
    recv = lambda: backend.recv(incoming, peer, FALLBACK_TAG, async_op=True)
    steps = [send if outgoing.numel() else None, recv if incoming.numel() else None]
    steps = steps if backend.rank < peer else steps[::-1]
    return [step() for step in steps if step is not None] or [CompletedWork()]
