"""The host reference the kernels must equal bitwise: a float reduction in rank order 0..n-1.

Each element is widened to float32, combined rank by rank from rank 0's value, divided by the
group size for AVG, and rounded back to the tensor's dtype once -- exactly the kernels' steps.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from commlayer.core.types import ReduceOp

__all__ = ["fixed_order_reduce", "reference_all_reduce", "reference_reduce_scatter"]

_COMBINE = {
    ReduceOp.SUM: torch.add,
    ReduceOp.AVG: torch.add,
    ReduceOp.PRODUCT: torch.mul,
    ReduceOp.MIN: torch.fmin,
    ReduceOp.MAX: torch.fmax,
}


def fixed_order_reduce(inputs: Sequence[torch.Tensor], op: ReduceOp) -> torch.Tensor:
    """``op`` over ``inputs`` (one tensor per rank, in rank order), on the host, in float32.

    Args:
        inputs: every rank's tensor, equal shapes and dtypes.
        op: SUM, AVG, PRODUCT, MIN or MAX.

    Returns:
        A CPU tensor of the inputs' dtype and shape.
    """
    if op not in _COMBINE:
        raise ValueError(
            f"fixed_order_reduce: argument 'op' expected one of {sorted(o.name for o in _COMBINE)}, received {op}"
        )
    combine = _COMBINE[op]
    acc = inputs[0].detach().to("cpu", torch.float32)
    for tensor in inputs[1:]:
        acc = combine(acc, tensor.detach().to("cpu", torch.float32))
    if op is ReduceOp.AVG:
        acc = acc / torch.tensor(float(len(inputs)), dtype=torch.float32)
    return acc.to(inputs[0].dtype)


def reference_all_reduce(inputs: Sequence[torch.Tensor], op: ReduceOp) -> torch.Tensor:
    """What every rank's tensor holds after ``all_reduce(op)``."""
    return fixed_order_reduce(inputs, op)


def reference_reduce_scatter(inputs: Sequence[torch.Tensor], op: ReduceOp, rank: int) -> torch.Tensor:
    """What ``rank``'s output holds after ``reduce_scatter_tensor(op)`` of the ranks' ``inputs``."""
    chunk = inputs[0].numel() // len(inputs)
    return fixed_order_reduce([t.reshape(-1)[rank * chunk : (rank + 1) * chunk] for t in inputs], op)
