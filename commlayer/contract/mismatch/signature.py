"""Collective signatures: what the ranks of a group must agree on, packed into two int64 words, and
the one message every backend raises when they do not.

A call's signature is its op, dtype, reduce op, root and element count. :func:`pack` puts all but
the count into one int64 ``key``; a check compares ``(key, count)`` across the group, by reading
every rank's pair (shared memory) or by one MAX reduction of ``[key, -key, count, -count]``, after
which every rank holds the group's extremes of both and :func:`agree` decides alike everywhere.

Whichever way a backend compares, a rank that finds a difference raises :func:`mismatch_error`,
which names this rank's call and the first differing peer's, e.g.::

    all_reduce on group 'world': the ranks called different collectives: rank 1 called
    all_reduce(float32[8], op sum), peer rank 0 called all_reduce(float32[4], op sum); checked by
    gloo before any data moved

shm's C++ check writes the same text (csrc/shm/comm.cpp); tests/reliability/test_mismatch_format.py
holds every backend to it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from commlayer.core.errors import CollectiveMismatchError
from commlayer.core.types import ReduceOp

__all__ = [
    "DTYPE_CODES",
    "agree",
    "checked_after",
    "checked_before",
    "describe",
    "describe_key",
    "dtype_codes",
    "first_differing",
    "mismatch_error",
    "pack",
    "unpack",
]

_OPS = (
    "all_reduce",
    "broadcast",
    "barrier",
    "reduce",
    "all_gather_into_tensor",
    "all_gather",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "all_to_all",
    "gather",
    "scatter",
    "reduce_scatter",
    "all_gather_v",
    "reduce_scatter_v",
    "all_reduce_coalesced",
    "all_gather_coalesced",
)
_OP_CODES = {name: code for code, name in enumerate(_OPS)}
_REDUCE_CODES = {reduce_op: code + 1 for code, reduce_op in enumerate(ReduceOp)}
_NO_DTYPE = 0
# key = (((op * 64 + dtype) * 16 + reduce op) << 24) + root + 1: fields never overlap.
_DTYPE_SLOTS, _REDUCE_SLOTS, _ROOT_BITS = 64, 16, 24
# Ops whose per-rank sizes differ legitimately: their count is 0 and their description has none.
_SIZELESS = frozenset({"all_to_all", "all_gather_v", "reduce_scatter_v", "barrier"})


def dtype_codes(dtypes: Iterable[torch.dtype]) -> dict[torch.dtype, int]:
    """Codes 1.. for ``dtypes``, sorted by name so that every rank numbers them alike."""
    return {dtype: code + 1 for code, dtype in enumerate(sorted(set(dtypes), key=str))}


# Every dtype torch defines, numbered by name: the same on every rank of one torch version.
DTYPE_CODES = dtype_codes(value for value in vars(torch).values() if isinstance(value, torch.dtype))


def pack(
    op: str,
    dtype: torch.dtype | None,
    codes: dict[torch.dtype, int] = DTYPE_CODES,
    root: int = -1,
    reduce_op: Any = None,
) -> int:
    """The key of one call: op, dtype (None: no tensor), reduce op and root (a group rank; -1: none)."""
    dtype_code = _NO_DTYPE if dtype is None else codes.get(dtype, _NO_DTYPE)
    reduce_code = 0 if reduce_op is None else _REDUCE_CODES.get(reduce_op, 0)
    return (
        (((_OP_CODES[op] * _DTYPE_SLOTS + dtype_code) * _REDUCE_SLOTS + reduce_code) << _ROOT_BITS) + root + 1
    )


def unpack(key: int) -> tuple[str, int, ReduceOp | None, int]:
    """What :func:`pack` put in ``key``: (op, dtype code, reduce op or None, root; -1: none)."""
    rest, root = divmod(key, 1 << _ROOT_BITS)
    rest, reduce_code = divmod(rest, _REDUCE_SLOTS)
    op_code, dtype_code = divmod(rest, _DTYPE_SLOTS)
    op = _OPS[op_code] if 0 <= op_code < len(_OPS) else f"op #{op_code}"
    reduce_op = next((r for r, code in _REDUCE_CODES.items() if code == reduce_code), None)
    return op, dtype_code, reduce_op, root - 1


def describe(
    op: str, dtype: Any, elements: Any = None, reduce_op: ReduceOp | None = None, root: int = -1
) -> str:
    """``all_reduce(float32[8], op sum)``, ``broadcast(int64[4], root 1)``, ``barrier()``: one call as
    every mismatch message shows it. ``elements`` is a count, a shape, or None (sizes that may
    differ between ranks)."""
    if op == "barrier":
        return "barrier()"
    text = "?" if dtype is None else str(dtype).replace("torch.", "")
    if elements is not None:
        dims = ", ".join(map(str, elements)) if isinstance(elements, (tuple, list)) else str(elements)
        text += f"[{dims}]"
    if reduce_op is not None:
        text += f", op {reduce_op.name.lower()}"
    if root >= 0:
        text += f", root {root}"
    return f"{op}({text})"


def describe_key(key: int, count: int, codes: dict[torch.dtype, int] = DTYPE_CODES) -> str:
    """:func:`describe` of a packed ``(key, count)``."""
    op, dtype_code, reduce_op, root = unpack(key)
    dtype = next((dtype for dtype, code in codes.items() if code == dtype_code), None)
    return describe(op, dtype, None if op in _SIZELESS else count, reduce_op, root)


def agree(key: int, count: int, reduced: Sequence[int]) -> bool:
    """Whether the group's MAX of ``[key, -key, count, -count]`` says every rank passed these."""
    return reduced[0] == key == -reduced[1] and reduced[2] == count == -reduced[3]


def first_differing(mine: tuple[int, int], calls: Sequence[tuple[int, int]], me: int) -> int:
    """The lowest group rank whose ``(key, count)`` in ``calls`` differs from ``mine``; -1 if none."""
    return next((rank for rank, call in enumerate(calls) if rank != me and call != mine), -1)


def mismatch_error(
    op: str,
    group: str,
    calls: tuple[tuple[int, str], tuple[int, str]],
    checked_by: str,
    seen_by: int | None = None,
) -> CollectiveMismatchError:
    """The error of a mismatched collective: ``calls`` is ((rank, its call), (peer rank, its call)),
    this rank's first; ``seen_by`` names this rank where it is neither (a pair of others disagree).
    Ranks are global ranks; ``checked_by`` says which check found it and when, e.g. "checked by
    gloo before any data moved"."""
    (rank, mine), (peer, theirs) = calls
    where = "" if seen_by is None else f" (seen by rank {seen_by})"
    return CollectiveMismatchError(
        f"{op} on group '{group}': the ranks called different collectives: rank {rank} called {mine}, "
        f"peer rank {peer} called {theirs}{where}; {checked_by}",
        {rank: mine, peer: theirs},
    )


def checked_before(backend: str) -> str:
    """The ending of a mismatch found before any rank communicated."""
    return f"checked by {backend} before any data moved"


def checked_after(backend: str) -> str:
    """The ending of a mismatch a speculating rank found once its call had run."""
    return f"checked by {backend} after this rank's call ran, which left its output undefined"
