"""Buffer layouts of the mpi backend's vector collectives: packed landings and MPI count tables."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["counts_and_displacements", "layout", "unpack"]


def unpack(landing: torch.Tensor, outputs: Sequence[torch.Tensor]) -> None:
    """Copy consecutive slices of ``landing`` into ``outputs``."""
    offset = 0
    for output in outputs:
        output.view(-1).copy_(landing[offset : offset + output.numel()])
        offset += output.numel()


def layout(counts: list[int]) -> tuple[list[int], list[int]]:
    """``[2, 3, 1]`` -> ``([2, 3, 1], [0, 2, 5])``: element counts and where each block starts."""
    displacements, start = [], 0
    for count in counts:
        displacements.append(start)
        start += count
    return counts, displacements


def counts_and_displacements(
    tensor: torch.Tensor, splits: Sequence[int] | None, parts: int
) -> tuple[list[int], list[int]]:
    """Row splits along dim 0 (None: equal parts) as element counts and displacements."""
    rows = tensor.shape[0] if tensor.dim() else 1
    row_elements = tensor.numel() // rows if rows else 0
    row_splits = list(splits) if splits else [rows // parts] * parts
    return layout([split * row_elements for split in row_splits])
