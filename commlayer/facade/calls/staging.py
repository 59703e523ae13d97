"""Staging: contiguous stand-ins for strided tensors, and the results written back after the op.

Non-contiguous tensors are copied to contiguous buffers and copied back when the work completes,
because some libraries (torch 2.13's gloo among them) silently mis-handle strided memory;
backends therefore only ever see contiguous tensors. An AVG the backend ran as SUM is divided
here too, before any copy back.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["CopyBack", "contiguous", "copy_back_results", "divide_results"]

CopyBack = list  # list[tuple[original, contiguous buffer]]


def contiguous(tensor: torch.Tensor, copy_back: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """A contiguous stand-in for ``tensor``; outputs register a copy back into the original."""
    if tensor.is_contiguous():
        return tensor
    buffer = tensor.contiguous()
    copy_back.append((tensor, buffer))
    return buffer


def divide_results(tensors: Sequence[torch.Tensor], divisor: int) -> None:
    """Divide each of ``tensors`` by ``divisor`` in place: the facade's AVG after a SUM."""
    # Outside autograd, like the copy back: the facade's AVG writes a result, not a graph node.
    with torch.no_grad():
        for tensor in tensors:
            tensor.div_(divisor)


def copy_back_results(copy_back: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Copy each staged buffer into the caller's original tensor."""
    # Outside autograd, as torch writes collective results: a leaf that requires grad accepts it.
    with torch.no_grad():
        for original, buffer in copy_back:
            original.copy_(buffer)
