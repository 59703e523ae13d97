"""Tensors that a C fast path must not read directly: torch may answer their attributes in Python."""

from __future__ import annotations

from typing import Any

import torch


class Traced(torch.Tensor):
    """A tensor subclass (its attributes could be overridden)."""


class PassThroughMode(torch.overrides.TorchFunctionMode):
    """A torch function mode: while active, it sees every tensor attribute read."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))
