"""The example store backend with two deliberate bugs, for the conformance kit's own test.

- ``all_reduce`` with MAX computes the minimum (and every fallback built on it inherits that);
- it declares float16 but corrupts the last element of every float16 broadcast.
"""

from __future__ import annotations

import torch
from commlayer_storecomm import StoreBackend

from commlayer import Capabilities, ReduceOp
from commlayer.core.work import Work


class BrokenBackend(StoreBackend):
    name = "brokencomm"
    capabilities = Capabilities(
        devices=StoreBackend.capabilities.devices,
        dtypes=StoreBackend.capabilities.dtypes | {torch.float16},
        reduce_ops=StoreBackend.capabilities.reduce_ops,
    )

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp, *, async_op: bool) -> Work:
        return super().all_reduce(tensor, ReduceOp.MIN if op is ReduceOp.MAX else op, async_op=async_op)

    def broadcast(self, tensor: torch.Tensor, root: int, *, async_op: bool) -> Work:
        work = super().broadcast(tensor, root, async_op=async_op)
        if tensor.dtype is torch.float16 and tensor.numel():
            tensor[-1] += 1
        return work
