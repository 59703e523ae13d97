"""The two-sided emulation's wire format: a fixed header per window op, then any payload.

Every message from one rank to another travels on the window's header tag, in the order the
origin issued its ops (send/recv between two ranks on one tag is ordered on every backend), so the
target applies puts, counts signals and serves gets exactly in issue order.
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple

import torch

__all__ = ["CHANNELS", "HEADER_NUMEL", "Header", "Kind", "decode", "encode", "tag"]

#: int64 elements of one header: kind, offset, numel.
HEADER_NUMEL = 3
#: Tags of the emulation start here, above any tag a program plausibly uses for its own sends.
TAG_BASE = 1 << 24
#: Tags per window: headers, put payloads, get replies.
CHANNELS = 3
#: Windows whose tags are distinct; the index wraps after that many windows of one group.
_TAG_WINDOWS = 1 << 20


class Kind(IntEnum):
    """What a header announces."""

    PUT = 1  # a payload of ``numel`` elements for the window at ``offset`` follows on the data tag
    SIGNAL = 2
    GET = 3  # reply with ``numel`` elements of the window at ``offset`` on the reply tag
    FENCE = 4


class Header(NamedTuple):
    kind: Kind
    offset: int = 0
    numel: int = 0


def encode(header: Header) -> torch.Tensor:
    """The header as the int64 tensor that is sent."""
    return torch.tensor([int(header.kind), header.offset, header.numel], dtype=torch.int64)


def decode(buffer: torch.Tensor) -> Header:
    """The header a received int64 tensor holds; ValueError for anything else."""
    if buffer.dtype != torch.int64 or buffer.numel() != HEADER_NUMEL:
        raise ValueError(
            f"a window header is {HEADER_NUMEL} int64 elements, received {buffer.dtype} x {buffer.numel()}"
        )
    kind, offset, numel = buffer.tolist()
    if kind not in Kind._value2member_map_ or offset < 0 or numel < 0:
        raise ValueError(f"corrupt window header {[kind, offset, numel]}")
    return Header(Kind(kind), offset, numel)


def tag(window_index: int, channel: int) -> int:
    """The tag of ``channel`` (0 headers, 1 put payloads, 2 get replies) of the ``window_index``-th window."""
    return TAG_BASE + CHANNELS * (window_index % _TAG_WINDOWS) + channel
