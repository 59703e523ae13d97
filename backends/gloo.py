"""Gloo through torch.distributed: the default CPU backend."""

from __future__ import annotations

from commlayer.types import Capabilities

from ._torch import TorchBackend

__all__ = ["GlooBackend"]


class GlooBackend(TorchBackend):
    name = "gloo"
    torch_backend = "gloo"
    capabilities = Capabilities(devices=frozenset({"cpu"}), recv_any_source=True)
