"""A third-party commlayer backend that communicates through the rendezvous store alone.

It is slow by design and exists to prove the plugin contract: implement the six core ops, and
every other facade op (reduce_scatter, all_to_all, gather, ...) comes from commlayer's generic
fallbacks. Each rank publishes its bytes under a key unique to (group, op sequence, rank) and
reads its peers' keys; ``store.get`` blocks until a key exists, bounded by the store's timeout.
"""

from __future__ import annotations

import itertools
from functools import reduce

import torch

from commlayer import Availability, Backend, Capabilities, GroupSpec, ReduceOp
from commlayer.core.work import CompletedWork, Work

_COMBINE = {ReduceOp.SUM: torch.add, ReduceOp.MIN: torch.minimum, ReduceOp.MAX: torch.maximum}


class StoreBackend(Backend):
    name = "storecomm"
    capabilities = Capabilities(
        devices=frozenset({"cpu"}),
        dtypes=frozenset({torch.float32, torch.float64, torch.int64, torch.uint8}),  # uint8: object helpers
        reduce_ops=frozenset(_COMBINE) | {ReduceOp.AVG},  # AVG: the facade sums, then divides
    )

    def __init__(self, spec: GroupSpec) -> None:
        super().__init__(spec)
        self._sequence = itertools.count()
        self._p2p_sequence: dict[tuple[int, int, int], itertools.count] = {}

    @classmethod
    def is_available(cls) -> Availability:
        return Availability.yes()

    @classmethod
    def create_world(cls, spec: GroupSpec) -> StoreBackend:
        return cls(spec)

    def new_group(self, spec: GroupSpec) -> StoreBackend | None:
        return type(self)(spec) if spec.is_member else None

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp, *, async_op: bool) -> Work:
        tensor.copy_(reduce(_COMBINE[op], self._exchange(tensor)))
        return CompletedWork([tensor])

    def all_gather_into_tensor(self, output: torch.Tensor, tensor: torch.Tensor, *, async_op: bool) -> Work:
        torch.cat(self._exchange(tensor), out=output)
        return CompletedWork([output])

    def broadcast(self, tensor: torch.Tensor, root: int, *, async_op: bool) -> Work:
        tensor.copy_(self._exchange(tensor)[root])
        return CompletedWork([tensor])

    def barrier(self, *, async_op: bool) -> Work:
        self._exchange(torch.zeros(1))
        return CompletedWork()

    def send(self, tensor: torch.Tensor, dst: int, tag: int, *, async_op: bool) -> Work:
        self.spec.store.set(self._p2p_key(self.rank, dst, tag), _to_bytes(tensor))
        return CompletedWork()

    def recv(self, tensor: torch.Tensor, src: int, tag: int, *, async_op: bool) -> Work:
        data = self.spec.store.get(self._p2p_key(src, self.rank, tag))
        tensor.copy_(_from_bytes(data, tensor))
        return CompletedWork([tensor])

    def _exchange(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        prefix = f"storecomm/{self.spec.name}/{next(self._sequence)}"
        self.spec.store.set(f"{prefix}/{self.rank}", _to_bytes(tensor))
        return [_from_bytes(self.spec.store.get(f"{prefix}/{peer}"), tensor) for peer in range(self.size)]

    def _p2p_key(self, src: int, dst: int, tag: int) -> str:
        counter = self._p2p_sequence.setdefault((src, dst, tag), itertools.count())
        return f"storecomm/{self.spec.name}/p2p/{src}-{dst}/{tag}/{next(counter)}"


def _to_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().view(torch.uint8).numpy().tobytes()


def _from_bytes(data: bytes, like: torch.Tensor) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=like.dtype).view(like.shape)
