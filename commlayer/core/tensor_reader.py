"""The C fast paths' tensor reader (``commlayer.core._tensor_meta``, built from csrc/tensor_meta):
which one, if any, the C fast paths and plan lookups of ``commlayer.backends._torch_fast_paths`` may use.

The reader is compiled against one torch version's headers (setup.py builds it where torch is
importable at build time), so it is handed over only under that version; commlayer.dist, which
makes the lookups, installs it when it imports the fast paths.
"""

from __future__ import annotations

from typing import Any

import torch

try:
    from commlayer.core import _tensor_meta
except ImportError:  # not built (an isolated build, or a tree laid out without building)
    _tensor_meta = None

__all__ = ["tensor_meta_reader"]


def tensor_meta_reader() -> Any | None:
    """The C reader of tensors' dtype, device, layout, contiguity and sizes for the C fast paths and
    lookups, or None where they ask the tensor's Python attributes: not built, or built against
    the headers of another torch version than the one running (it would misread every tensor)."""
    if _tensor_meta is None or _tensor_meta.BUILT_FOR != torch.__version__:
        return None
    return _tensor_meta.READER
