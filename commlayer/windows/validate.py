"""Checks of window arguments, run before any communication; each error names the op, the
argument, what was expected, what was received and the rank (``commlayer.core.errors.invalid_argument``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from commlayer.core.errors import InvalidArgumentError, InvalidTypeError, invalid_argument

__all__ = ["check_dtypes_agree", "check_peer", "check_span", "check_tensor", "check_timeout"]


def check_tensor(op: str, arg: str, tensor: Any, dtype: torch.dtype, device: torch.device, rank: int) -> None:
    """``tensor`` is a tensor of the window's dtype on the window's device."""
    if not isinstance(tensor, torch.Tensor):
        raise invalid_argument(op, arg, "a torch.Tensor", type(tensor).__name__, rank, InvalidTypeError)
    if tensor.dtype != dtype:
        raise invalid_argument(
            op, arg, f"a tensor of the window's dtype {dtype}", tensor.dtype, rank, InvalidTypeError
        )
    if tensor.device != device:
        raise invalid_argument(op, arg, f"a tensor on the window's device {device}", tensor.device, rank)


def check_peer(op: str, arg: str, peer: Any, group_ranks: Mapping[int, int], rank: int) -> int:
    """The group rank of global rank ``peer``, a member of the window's group."""
    if isinstance(peer, bool) or not isinstance(peer, int):
        raise invalid_argument(op, arg, "an int (a global rank)", type(peer).__name__, rank, InvalidTypeError)
    group_rank = group_ranks.get(peer)
    if group_rank is None:
        raise invalid_argument(op, arg, f"a rank of the window's group {sorted(group_ranks)}", peer, rank)
    return group_rank


def check_span(op: str, offset: Any, numel: int, size: int, peer: int, rank: int) -> None:
    """Elements ``[offset, offset + numel)`` lie inside global rank ``peer``'s window of ``size``."""
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise invalid_argument(
            op, "offset", "an int (elements)", type(offset).__name__, rank, InvalidTypeError
        )
    if offset < 0:
        raise invalid_argument(op, "offset", "a non-negative element offset", offset, rank)
    if offset + numel > size:
        raise invalid_argument(
            op,
            "offset",
            f"offset + numel <= {size} (rank {peer}'s window holds {size} elements)",
            f"offset {offset} + numel {numel} = {offset + numel}",
            rank,
        )


def check_timeout(op: str, timeout_s: float, rank: int) -> None:
    if not timeout_s > 0:
        raise invalid_argument(op, "timeout", "a positive duration", f"{timeout_s:g} s", rank)


def check_dtypes_agree(dtypes: Sequence[torch.dtype], global_ranks: Sequence[int], rank: int) -> None:
    """Every member registered a tensor of one dtype (all members raise the same error)."""
    if len(set(dtypes)) > 1:
        found = ", ".join(f"rank {r}: {d}" for r, d in zip(global_ranks, dtypes))
        raise InvalidArgumentError(
            f"window: argument 'tensor' expected one dtype on every rank of the group, received {found} "
            f"(rank {rank})"
        )
