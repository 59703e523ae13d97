"""NCCL through torch.distributed: the default CUDA backend."""

from __future__ import annotations

import torch

from commlayer.types import Availability, Capabilities, ReduceOp

from ._torch import TorchBackend

__all__ = ["NcclBackend"]


class NcclBackend(TorchBackend):
    name = "nccl"
    torch_backend = "nccl"
    # NCCL has no bitwise reductions; torch refuses BAND/BOR/BXOR on it, so we declare them absent.
    capabilities = Capabilities(
        devices=frozenset({"cuda"}),
        reduce_ops=frozenset({ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX}),
        native_avg=True,
    )

    @classmethod
    def is_available(cls) -> Availability:
        if not torch.cuda.is_available():
            return Availability.no("no CUDA device is visible (torch.cuda.is_available() is False)")
        return super().is_available()

    def object_device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device())
