"""The ccl backend's windows: the two-sided emulation over a communicator of each window's own.

oneCCL matches point-to-point messages by communicator and peer, never by tag, so on the group's
communicator a window's payloads could be taken by one of the group's own receives or by another
window's. Each window therefore builds a communicator over the same ranks that carries its payloads
alone, and releases it when the window is freed.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from commlayer.backend import Backend
from commlayer.one_sided import TwoSidedWindow, WindowSpec
from commlayer.one_sided.two_sided import HeaderStore
from commlayer.types import GroupSpec

__all__ = ["ChannelWindow", "payload_spec"]


def payload_spec(group: GroupSpec, window: WindowSpec) -> GroupSpec:
    """The spec of the communicator carrying ``window``'s payloads: ``group``'s ranks, its own name."""
    return replace(group, name=f"{window.key}/payloads")


class ChannelWindow(TwoSidedWindow):
    """A two-sided window whose payloads travel over ``channel``, a communicator it owns."""

    def __init__(self, channel: Backend, store: HeaderStore, tensor: torch.Tensor, spec: WindowSpec) -> None:
        super().__init__(channel, store, tensor, spec)
        self._channel = channel

    def close(self) -> None:
        super().close()
        self._channel.shutdown()
