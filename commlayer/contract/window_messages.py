"""The two-sided emulation's wire format: a fixed-size header per window op.

Headers travel through the rendezvous store, one queue per (origin, target) pair, in the order
the origin issued its ops; payloads (put data, get replies) follow over the backend's send/recv,
each on a tag of its own (the header names it), so no library's matching order matters.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import NamedTuple

__all__ = ["Header", "Kind", "channel", "decode", "encode", "tag"]

_FORMAT = struct.Struct("<qqqq")  # kind, offset, numel, seq
#: Tags of the emulation start here, above any tag a program plausibly uses for its own sends.
TAG_BASE = 1 << 24
#: Payloads in flight between two ranks whose tags are distinct (their numbers wrap after that).
_TAG_SEQUENCE = 1 << 20
#: Windows whose tags are distinct; the index wraps after that many windows of one group.
_TAG_WINDOWS = 64


class Kind(IntEnum):
    """What a header announces."""

    PUT = 1  # ``numel`` elements for the window at ``offset`` follow on the data tag
    SIGNAL = 2
    GET = 3  # the target is asked for ``numel`` elements of its window at ``offset``
    REPLY = 4  # the answer to the origin's oldest unanswered GET follows on the reply tag
    FENCE = 5  # the origin entered a fence: everything it sent before has arrived
    DRAINED = 6  # the origin applied everything sent to it before the fence


class Header(NamedTuple):
    kind: Kind
    offset: int = 0
    numel: int = 0
    seq: int = 0  # PUT, REPLY: the number of the payload's message from this origin to this target


def encode(header: Header) -> bytes:
    """The header as the bytes queued in the store."""
    return _FORMAT.pack(int(header.kind), header.offset, header.numel, header.seq)


def decode(data: bytes) -> Header:
    """The header ``data`` holds; ValueError for anything else."""
    if len(data) != _FORMAT.size:
        raise ValueError(f"a window header is {_FORMAT.size} bytes, received {len(data)}")
    kind, offset, numel, seq = _FORMAT.unpack(data)
    if kind not in Kind._value2member_map_ or min(offset, numel, seq) < 0:
        raise ValueError(f"corrupt window header {[kind, offset, numel, seq]}")
    return Header(Kind(kind), offset, numel, seq)


def tag(window_index: int, seq: int) -> int:
    """The tag of payload message ``seq`` between two ranks in the ``window_index``-th window."""
    return TAG_BASE + (window_index % _TAG_WINDOWS) * _TAG_SEQUENCE + seq % _TAG_SEQUENCE


def channel(window_key: str, origin: int, target: int) -> str:
    """The store queue carrying ``origin``'s headers to ``target`` (group ranks)."""
    return f"commlayer/window/{window_key}/{origin}>{target}"
