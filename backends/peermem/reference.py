"""The host references the kernels must equal bitwise, and the bound for NCCL's own order.

A reduction: each element is widened to float32, combined rank by rank from rank 0's value,
divided by the group size for AVG, and rounded back to the tensor's dtype once -- exactly the
kernels' steps. :func:`fused_reference` repeats the fused all-reduce + residual + RMSNorm kernel's
float operations in its order. NCCL reduces in an order of its own and rounds to the dtype after
every step; :func:`rounding_bound` is how far that may lie from the rank-order reference.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from commlayer.core.types import ReduceOp

__all__ = [
    "FUSED_THREADS",
    "fixed_order_reduce",
    "fused_reference",
    "reference_all_reduce",
    "reference_reduce_scatter",
    "rounding_bound",
    "within_bound",
]

#: Threads per block of the fused kernel (csrc/peermem/common.cuh THREADS): its summation order.
FUSED_THREADS = 512

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


def rounding_bound(inputs: Sequence[torch.Tensor], op: ReduceOp) -> torch.Tensor:
    """Per element, how far a reduction of ``inputs`` in any order, rounded to the dtype after every
    step, may lie from :func:`fixed_order_reduce` (float64, on the host).

    Every partial sum is at most ``sum |x|``, and each step's rounding is at most the dtype's unit
    roundoff ``u`` of it: ``n * u * sum |x|`` for SUM (and AVG, divided by n; NCCL scales each
    input by 1/n first), ``n * u * |product|`` for PRODUCT, nothing for MIN and MAX; plus the
    reference's own rounding, ``u * |reference|``, and the dtype's smallest normal for underflow.
    """
    dtype = inputs[0].dtype
    info = torch.finfo(dtype)
    unit = info.eps / 2
    count = len(inputs)
    wide = [t.detach().to("cpu", torch.float64) for t in inputs]
    if op in (ReduceOp.MIN, ReduceOp.MAX):
        return torch.zeros_like(wide[0])
    if op is ReduceOp.PRODUCT:
        magnitude = torch.stack(wide).abs().prod(0)
    else:
        magnitude = torch.stack(wide).abs().sum(0) / (count if op is ReduceOp.AVG else 1)
    reference = fixed_order_reduce(inputs, op).to(torch.float64).abs()
    return count * unit * magnitude + unit * reference + info.tiny


def within_bound(got: torch.Tensor, inputs: Sequence[torch.Tensor], op: ReduceOp) -> tuple[bool, float]:
    """Whether ``got`` lies within :func:`rounding_bound` of the reference everywhere, and the
    largest ``|got - reference| / bound`` (at most 1 when it does)."""
    want = fixed_order_reduce(inputs, op).to(torch.float64)
    diff = (got.detach().to("cpu", torch.float64) - want).abs()
    ratio = torch.where(diff == 0, 0.0, diff / rounding_bound(inputs, op)).nan_to_num(nan=float("inf"))
    worst = float(ratio.max()) if ratio.numel() else 0.0
    return worst <= 1.0, worst


def _butterfly(values: torch.Tensor) -> torch.Tensor:
    """Lane 0 of a warp's xor-butterfly sum over the last dim (32 lanes), float32 steps."""
    lanes = torch.arange(32)
    for offset in (16, 8, 4, 2, 1):
        values = values + values[..., lanes ^ offset]
    return values[..., 0]


def fused_reference(
    partials: Sequence[torch.Tensor], residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(normed, residual_out)`` of the fused all-reduce + residual + RMSNorm, as the kernel
    computes them (csrc/peermem/fused_norm.cuh), bitwise.

    Args:
        partials: every rank's partial ``[rows, hidden]`` (the all-reduce's inputs), in rank order.
        residual: ``[rows, hidden]``, the same dtype.
        weight: ``[hidden]``.
        eps: added to the mean square.
    """
    dtype = residual.dtype
    rows, hidden = residual.shape
    per_unit = 16 // residual.element_size()
    units = hidden // per_unit
    reduced = fixed_order_reduce([p.reshape(rows, hidden) for p in partials], ReduceOp.SUM)
    residual_out = (residual.detach().cpu().float() + reduced.float()).to(dtype)
    values = residual_out.float()
    squares = (values * values).view(rows, units, per_unit)
    sums = torch.zeros(rows, FUSED_THREADS, dtype=torch.float32)
    for first in range(0, units, FUSED_THREADS):
        chunk = squares[:, first : first + FUSED_THREADS]
        for element in range(per_unit):
            sums[:, : chunk.shape[1]] = sums[:, : chunk.shape[1]] + chunk[:, :, element]
    per_warp = _butterfly(sums.view(rows, FUSED_THREADS // 32, 32))
    lanes = torch.zeros(rows, 32, dtype=torch.float32)
    lanes[:, : per_warp.shape[1]] = per_warp
    total = _butterfly(lanes)
    mean = total / torch.tensor(float(hidden), dtype=torch.float32)
    scale = torch.tensor(1.0, dtype=torch.float32) / torch.sqrt(mean + torch.tensor(eps, dtype=torch.float32))
    normed = (values * scale[:, None] * weight.detach().cpu().float()).to(dtype)
    return normed, residual_out
