"""The tensor-parallel epilogue in one op: all_reduce, residual add and RMSNorm.

A row-parallel projection leaves each rank with a partial sum; the next layer needs
``rms_norm(residual + all_reduce(partial)) * weight`` and the new residual.
:func:`all_reduce_residual_rms_norm` computes both. On the peermem backend, for CUDA tensors of a
group on one host, one kernel does all of it (one-shot, then the add and the norm of each row in
the same kernel); elsewhere it runs ``dist.all_reduce`` and torch's ops.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from commlayer import dist
from commlayer.backends.peermem import PeermemBackend
from commlayer.core.errors import InvalidTypeError, invalid_argument
from commlayer.dist import ProcessGroup

__all__ = ["all_reduce_residual_rms_norm"]

_OP = "all_reduce_residual_rms_norm"


def all_reduce_residual_rms_norm(
    partial: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    group: ProcessGroup | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum ``partial`` over ``group``, add ``residual``, and RMS-normalise the rows.

    Args:
        partial: this rank's ``[..., hidden]`` share (the output of a row-parallel projection).
        residual: ``[..., hidden]``, the same shape and dtype.
        weight: the norm's ``[hidden]`` scale, the same dtype.
        eps: added to each row's mean square.
        group: the tensor-parallel group (default: the world; without a process group, the sum
            is over this process alone).

    Returns:
        ``(normed, new_residual)``: ``new_residual = residual + all_reduce(partial)`` and
        ``normed = new_residual * rsqrt(mean(new_residual ** 2) + eps) * weight``, both new tensors.

    On the peermem backend (one host, CUDA, float32/bfloat16/float16, rows whose bytes are a
    multiple of 16, the whole call within its staging region) the result is one kernel's, bitwise
    equal on every rank and to ``commlayer.backends.peermem.reference.fused_reference``; it can be
    captured in a CUDA graph. Elsewhere the all-reduce is the backend's and the rest is torch's.
    """
    rank = dist.get_rank() if dist.is_initialized() else None
    _check(partial, residual, weight, rank)
    if rank is None:  # one process: nothing to sum
        return _unfused(partial, residual, weight, eps, None)
    group = group if group is not None else dist.group.WORLD
    comm = _peer_comm(group, partial)
    if comm is not None:
        partial, residual, weight = partial.contiguous(), residual.contiguous(), weight.contiguous()
        normed, residual_out = torch.empty_like(partial), torch.empty_like(residual)
        if comm.fused_norm(partial, residual, weight, eps, normed, residual_out):
            return normed, residual_out
    return _unfused(partial, residual, weight, eps, group)


def _unfused(
    partial: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    group: ProcessGroup | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    if group is not None and group.size() > 1:
        partial = partial.clone()
        dist.all_reduce(partial, group=group)
    residual_out = residual + partial
    return F.rms_norm(residual_out, (residual_out.shape[-1],), weight, eps), residual_out


def _peer_comm(group: ProcessGroup, partial: torch.Tensor):
    if not partial.is_cuda:
        return None
    backend = group.backend_for("cuda")
    return backend.peer_comm if isinstance(backend, PeermemBackend) else None


def _check(partial: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, rank: int | None) -> None:
    for name, tensor in (("partial", partial), ("residual", residual), ("weight", weight)):
        if not isinstance(tensor, torch.Tensor):
            raise invalid_argument(_OP, name, "a torch.Tensor", type(tensor).__name__, rank, InvalidTypeError)
    if partial.dim() < 1 or residual.shape != partial.shape:
        raise invalid_argument(
            _OP, "residual", f"the shape of partial {tuple(partial.shape)}", tuple(residual.shape), rank
        )
    if weight.shape != partial.shape[-1:]:
        raise invalid_argument(_OP, "weight", f"shape {tuple(partial.shape[-1:])}", tuple(weight.shape), rank)
    for name, tensor in (("residual", residual), ("weight", weight)):
        if tensor.dtype != partial.dtype:
            raise invalid_argument(_OP, name, f"dtype {partial.dtype} (partial's)", tensor.dtype, rank)
        if tensor.device != partial.device:
            raise invalid_argument(_OP, name, f"device {partial.device} (partial's)", tensor.device, rank)
