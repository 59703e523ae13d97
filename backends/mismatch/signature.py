"""Collective signatures: what the ranks of a group must agree on, packed for one MAX reduction.

A backend that cannot tell when ranks pass different calls to one collective (MPI matches them by
order only; gloo checks byte sizes but not dtypes, reduce ops or roots) checks each call's
signature first: op, dtype, reduce op, root and element count, packed into two int64 values
``key`` and ``count`` and reduced as ``[key, -key, count, -count]`` with MAX. Afterwards each rank
holds the group's maximum and (negated) minimum of both: they are equal everywhere exactly when
every rank made the same call, so every rank decides alike and raises
:class:`~commlayer.core.errors.CollectiveMismatchError` instead of returning garbage.

Example: world of 2, rank 0 ``all_reduce(float32[4])``, rank 1 ``all_reduce(int32[4])``: the two
keys differ in their dtype field, and both ranks raise "calls all_reduce(float32, ...) and
all_reduce(int32, ...) across the group".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from commlayer.core.errors import CollectiveMismatchError
from commlayer.core.types import ReduceOp

__all__ = ["agree", "describe", "dtype_codes", "mismatch", "pack", "unpack"]

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
)
_OP_CODES = {name: code for code, name in enumerate(_OPS)}
_REDUCE_CODES = {reduce_op: code + 1 for code, reduce_op in enumerate(ReduceOp)}
_NO_DTYPE = 0
# key = (((op * 64 + dtype) * 16 + reduce op) << 24) + root + 1: fields never overlap.
_DTYPE_SLOTS, _REDUCE_SLOTS, _ROOT_BITS = 64, 16, 24


def dtype_codes(dtypes: Iterable[torch.dtype]) -> dict[torch.dtype, int]:
    """Codes 1.. for ``dtypes``, sorted by name so that every rank numbers them alike."""
    return {dtype: code + 1 for code, dtype in enumerate(sorted(set(dtypes), key=str))}


def pack(
    op: str, dtype: torch.dtype | None, codes: dict[torch.dtype, int], root: int = -1, reduce_op: Any = None
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


def describe(key: int, dtypes: dict[int, torch.dtype]) -> str:
    """``all_reduce(float32, reduce op SUM, root -1)``: the call a packed key stands for."""
    op, dtype_code, reduce_op, root = unpack(key)
    dtype = str(dtypes.get(dtype_code, "no tensor")).replace("torch.", "")
    return f"{op}({dtype}, reduce op {'-' if reduce_op is None else reduce_op.name}, root {root})"


def agree(key: int, count: int, reduced: Sequence[int]) -> bool:
    """Whether the group's MAX of ``[key, -key, count, -count]`` says every rank passed these."""
    return reduced[0] == key == -reduced[1] and reduced[2] == count == -reduced[3]


def mismatch(
    op: str,
    key: int,
    count: int,
    reduced: Sequence[int],
    codes: dict[torch.dtype, int],
    where: tuple[str, int],
    checked_by: str,
) -> CollectiveMismatchError:
    """The error every rank raises when :func:`agree` is False; ``where`` is (group name, rank)."""
    group, rank = where
    dtypes = {code: dtype for dtype, code in codes.items()}
    mine = f"{describe(key, dtypes)} of {count} elements"
    calls = sorted({describe(reduced[0], dtypes), describe(-reduced[1], dtypes)})
    seen = [f"calls {' and '.join(calls)}" if len(calls) > 1 else f"every call {calls[0]}"]
    seen.append(f"element counts {-reduced[3]} to {reduced[2]}")
    return CollectiveMismatchError(
        f"{op} on group '{group}': the ranks called different collectives ({'; '.join(seen)} "
        f"across the group); this rank called {mine} (rank {rank}). {checked_by}",
        {rank: mine},
    )
