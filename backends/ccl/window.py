"""The ccl backend's windows: the two-sided emulation with its payloads on a gloo channel.

oneCCL matches point-to-point messages by communicator and peer, never by tag, and may start
operations posted together in another order than they were posted, so a window's payloads sent
over oneCCL could be taken by the wrong receive (oneCCL's strict-order mode, which would prevent
that, deadlocks ordinary collectives posted asynchronously). Each window therefore carries its
payloads on a gloo communicator of its own over the same ranks, whose messages match by tag, and
releases it when the window is freed; the headers go through the store as on every backend.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from commlayer.backends.gloo import GlooBackend
from commlayer.contract.backend import Backend, StandaloneOptions
from commlayer.contract.emulated_windows import HeaderStore, TwoSidedWindow
from commlayer.contract.windows import WindowSpec
from commlayer.core.types import GroupSpec

__all__ = ["ChannelWindow", "payload_channel", "payload_spec"]


def payload_spec(group: GroupSpec, window: WindowSpec) -> GroupSpec:
    """The spec of the communicator carrying ``window``'s payloads: ``group``'s ranks, its own name."""
    return replace(group, name=f"{window.key}/payloads")


def payload_channel(group: GroupSpec, window: WindowSpec) -> GlooBackend:
    """A gloo communicator over ``group``'s ranks for ``window``'s payloads (collective)."""
    options = StandaloneOptions(mismatch_checks=False)  # it carries send/recv alone
    return GlooBackend.create_standalone(payload_spec(group, window), options)


class ChannelWindow(TwoSidedWindow):
    """A two-sided window whose payloads travel over ``channel``, a communicator it owns."""

    def __init__(self, channel: Backend, store: HeaderStore, tensor: torch.Tensor, spec: WindowSpec) -> None:
        super().__init__(channel, store, tensor, spec)
        self._channel = channel

    def close(self) -> None:
        super().close()
        self._channel.shutdown()
