"""The all_to_all kernel's split table: where each chunk starts and how long it is, in bytes.

A rank knows only its own splits: what it sends to each peer and what it receives from each. The
kernel takes both as byte offsets and lengths, ``MAX_RANKS`` entries each, padded with zeros.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import torch

__all__ = ["byte_splits", "packed_splits"]

MAX_RANKS = 8
_SPLITS = struct.Struct(f"<{4 * MAX_RANKS}Q")


def packed_splits(
    source: torch.Tensor,
    output: torch.Tensor,
    input_splits: Sequence[int] | None,
    output_splits: Sequence[int] | None,
    world: int,
) -> bytes:
    """:func:`byte_splits` as the kernel reads them."""
    return _SPLITS.pack(*byte_splits(source, output, input_splits, output_splits, world))


def byte_splits(
    source: torch.Tensor,
    output: torch.Tensor,
    input_splits: Sequence[int] | None,
    output_splits: Sequence[int] | None,
    world: int,
) -> list[int]:
    """send offsets, send lengths, receive offsets, receive lengths in bytes, MAX_RANKS each (padded)."""
    sends = _offsets(source, input_splits, world)
    receives = _offsets(output, output_splits, world)
    pad = [0] * (MAX_RANKS - world)
    return [*sends[0], *pad, *sends[1], *pad, *receives[0], *pad, *receives[1], *pad]


def _offsets(tensor: torch.Tensor, splits: Sequence[int] | None, world: int) -> tuple[list[int], list[int]]:
    nbytes = tensor.numel() * tensor.element_size()
    if splits is None:
        lengths = [nbytes // world] * world
    else:
        row = nbytes // tensor.shape[0] if tensor.dim() and tensor.shape[0] else 0
        lengths = [int(rows) * row for rows in splits]
    offsets = [sum(lengths[:p]) for p in range(world)]
    return offsets, lengths
