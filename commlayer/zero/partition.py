"""Where every parameter element lives: flat segments, their shards, and each rank's fragments.

Pure arithmetic, no tensors and no communication. Parameters are packed into *segments* (a
gradient bucket in stages 0-2, a module unit in stage 3). Each segment is padded to a multiple of
``shards * alignment`` elements and cut into ``shards`` equal shards; rank ``r`` owns shard ``r``
of every segment, and its flat fp32 master shard is those shards end to end.

Example: parameters of 5, 3 and 6 elements in one segment, 2 shards, alignment 4::

    segment (padded to 16):  a a a a a b b b c c c c c c . .
    rank 0 shard [0, 8):     a a a a a b b b          -> fragments a[0:5], b[0:3]
    rank 1 shard [8, 16):    c c c c c c . .          -> fragment  c[0:6]  (2 padding elements)

A parameter may straddle two shards; each rank then holds one *fragment* of it (a contiguous
run of its flattened elements), which is what the optimizer steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["FlatLayout", "Fragment", "Segment", "Slot", "bucket_indices", "build_layout", "round_up"]


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True)
class Slot:
    """One parameter inside its segment."""

    param: int  # index into the engine's parameter list
    offset: int  # first element inside the segment
    numel: int


@dataclass(frozen=True)
class Segment:
    index: int
    slots: tuple[Slot, ...]
    numel: int  # parameter elements, without padding
    padded_numel: int  # a multiple of shards * alignment
    shard_numel: int  # padded_numel // shards
    shard_offset: int  # where this segment's shard starts in a rank's flat master shard
    offset: int  # where this segment starts in a flat buffer holding every segment

    def shard_range(self, rank: int) -> tuple[int, int]:
        """Element range of rank's shard inside the segment."""
        return rank * self.shard_numel, (rank + 1) * self.shard_numel


@dataclass(frozen=True)
class Fragment:
    """The elements ``[start, start + numel)`` of parameter ``param`` (flattened) held by a rank."""

    param: int
    start: int
    numel: int
    master_offset: int  # position in the rank's flat master shard
    segment: int


@dataclass(frozen=True)
class FlatLayout:
    segments: tuple[Segment, ...]
    shards: int
    alignment: int

    @property
    def shard_numel(self) -> int:
        """Elements of one rank's flat master shard (padding included)."""
        return sum(segment.shard_numel for segment in self.segments)

    @property
    def padded_numel(self) -> int:
        """Elements of a flat buffer holding every segment whole."""
        return sum(segment.padded_numel for segment in self.segments)

    @property
    def numel(self) -> int:
        return sum(segment.numel for segment in self.segments)

    def slot_of(self, param: int) -> tuple[Segment, Slot]:
        for segment in self.segments:
            for slot in segment.slots:
                if slot.param == param:
                    return segment, slot
        raise KeyError(param)

    def fragments(self, rank: int) -> tuple[Fragment, ...]:
        """Every parameter run held by ``rank``, in master-shard order."""
        found = []
        for segment in self.segments:
            low, high = segment.shard_range(rank)
            for slot in segment.slots:
                start, end = max(low, slot.offset), min(high, slot.offset + slot.numel)
                if start < end:
                    master = segment.shard_offset + start - low
                    found.append(
                        Fragment(slot.param, start - slot.offset, end - start, master, segment.index)
                    )
        return tuple(found)


def bucket_indices(numels: Sequence[int], order: Sequence[int], bucket_numel: int) -> list[list[int]]:
    """Cut ``order`` (parameter indices) into consecutive buckets of about ``bucket_numel``.

    A bucket closes once it reaches the limit, so a parameter larger than the limit gets a
    bucket of its own and no parameter is ever split between buckets.
    """
    buckets: list[list[int]] = [[]]
    filled = 0
    for index in order:
        if buckets[-1] and filled + numels[index] > bucket_numel:
            buckets.append([])
            filled = 0
        buckets[-1].append(index)
        filled += numels[index]
    return [bucket for bucket in buckets if bucket]


def build_layout(
    groups: Sequence[Sequence[int]], numels: Sequence[int], shards: int, alignment: int
) -> FlatLayout:
    """One segment per group of parameter indices, in the given order."""
    segments = []
    shard_offset = offset = 0
    for index, members in enumerate(groups):
        slots, cursor = [], 0
        for param in members:
            slots.append(Slot(param, cursor, numels[param]))
            cursor += numels[param]
        padded = round_up(max(cursor, 1), shards * alignment)
        segments.append(Segment(index, tuple(slots), cursor, padded, padded // shards, shard_offset, offset))
        shard_offset += padded // shards
        offset += padded
    return FlatLayout(tuple(segments), shards, alignment)
