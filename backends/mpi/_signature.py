"""The default mismatch check of the mpi backend: one 32-byte Allreduce before each collective.

MPI matches collectives by order only and never checks that ranks agree on what they pass: on
Intel MPI, rank 0 reducing 4 floats against rank 1's 8 returns garbage with exit code 0, and Open
MPI either aborts with a raw error or prints a wrong result first. So before each collective every
rank contributes its call's signature -- op, dtype, reduce op, root, element count -- packed into
two int64 values ``key`` and ``count``, as ``[key, -key, count, -count]`` to one in-place
``Allreduce(MAX)``. Afterwards each rank holds the group's maximum and (negated) minimum of both:
they are equal everywhere exactly when every rank made the same call, so every rank decides alike
and raises :class:`~commlayer.errors.CollectiveMismatchError` before the real collective moves a
byte. It is one more collective of latency (a few microseconds on one host:
benchmarks/mismatch_check_overhead.py), negligible next to a 1 MiB collective.

Vector all-to-alls pass a count of 0: their per-rank sizes differ legitimately.
Example: world of 2, rank 0 ``all_reduce(float32[4])``, rank 1 ``all_reduce(float32[8])``: the
maximum count is 8, the minimum 4, and both ranks raise "element counts 4 to 8 across the group".
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from commlayer.errors import CollectiveMismatchError
from commlayer.types import ReduceOp
from commlayer.work import WaitLimit

from ._work import wait_in_place

__all__ = ["SignatureCheck", "describe", "verified_call"]

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
)
_OP_CODES = {name: code for code, name in enumerate(_OPS)}
_REDUCE_CODES = {reduce_op: code + 1 for code, reduce_op in enumerate(ReduceOp)}
_NO_DTYPE = 0
# key = (((op * 64 + dtype) * 16 + reduce op) << 24) + root + 1: fields never overlap.
_DTYPE_SLOTS, _REDUCE_SLOTS, _ROOT_BITS = 64, 16, 24


def describe(key: int, dtypes: dict[int, torch.dtype]) -> str:
    """``all_reduce(float32, reduce op SUM, root -1)``: the call a packed key stands for."""
    rest, root = divmod(key, 1 << _ROOT_BITS)
    rest, reduce_code = divmod(rest, _REDUCE_SLOTS)
    op_code, dtype_code = divmod(rest, _DTYPE_SLOTS)
    op = _OPS[op_code] if 0 <= op_code < len(_OPS) else f"op #{op_code}"
    dtype = str(dtypes.get(dtype_code, "no tensor")).replace("torch.", "")
    reduce_op = next((r.name for r, code in _REDUCE_CODES.items() if code == reduce_code), "-")
    return f"{op}({dtype}, reduce op {reduce_op}, root {root - 1})"


@dataclass(frozen=True)
class SignatureCheck:
    """Checks one communicator's calls; ``allreduce_max(values)`` reduces an int64 array in place."""

    allreduce_max: Callable[[array], Any]
    iallreduce_max: Callable[[array], Any]  # returns the request
    dtype_codes: dict[torch.dtype, int]
    group: str
    rank: int

    @classmethod
    def over(cls, comm: Any, mpi: Any, dtypes: Any, group: str, rank: int) -> SignatureCheck:
        int64, maximum, in_place = mpi.INT64_T, mpi.MAX, mpi.IN_PLACE
        allreduce, iallreduce = comm.Allreduce, comm.Iallreduce

        def allreduce_max(values: array) -> None:
            allreduce(in_place, [values, int64], maximum)

        def iallreduce_max(values: array) -> Any:
            return iallreduce(in_place, [values, int64], maximum)

        # Sorted by name, so every rank numbers the dtypes alike.
        codes = {dtype: code + 1 for code, dtype in enumerate(sorted(dtypes, key=str))}
        return cls(allreduce_max, iallreduce_max, codes, group, rank)

    def key(self, op: str, tensor: torch.Tensor | None, root: int = -1, reduce_op: Any = None) -> int:
        dtype = _NO_DTYPE if tensor is None else self.dtype_codes.get(tensor.dtype, _NO_DTYPE)
        reduce_code = 0 if reduce_op is None else _REDUCE_CODES.get(reduce_op, 0)
        return (
            (((_OP_CODES[op] * _DTYPE_SLOTS + dtype) * _REDUCE_SLOTS + reduce_code) << _ROOT_BITS) + root + 1
        )

    def verify(self, op: str, key: int, count: int) -> None:
        """Raise CollectiveMismatchError on every rank unless all ranks passed this key and count."""
        values = array("q", (key, -key, count, -count))
        self.allreduce_max(values)
        self._compare(op, key, count, values)

    def verify_within(self, op: str, key: int, count: int, limit: WaitLimit) -> None:
        """:meth:`verify` through a request waited for until the group's timeout (modes whose
        synchronous ops are bounded)."""
        values = array("q", (key, -key, count, -count))
        request = self.iallreduce_max(values)
        wait_in_place(request, op, limit, values)
        self._compare(op, key, count, values)

    def _compare(self, op: str, key: int, count: int, values: array) -> None:
        if values[0] == key == -values[1] and values[2] == count == -values[3]:
            return
        raise self._mismatch(op, key, count, values)

    def _mismatch(self, op: str, key: int, count: int, values: array) -> CollectiveMismatchError:
        dtypes = {code: dtype for dtype, code in self.dtype_codes.items()}
        mine = f"{describe(key, dtypes)} of {count} elements"
        calls = sorted({describe(values[0], dtypes), describe(-values[1], dtypes)})
        seen = [f"calls {' and '.join(calls)}" if len(calls) > 1 else f"every call {calls[0]}"]
        seen.append(f"element counts {-values[3]} to {values[2]}")
        return CollectiveMismatchError(
            f"{op} on group '{self.group}': the ranks called different collectives ({'; '.join(seen)} "
            f"across the group); this rank called {mine} (rank {self.rank}). Checked by the mpi backend "
            "before communicating; COMMLAYER_MPI_VERIFY=0 turns the check off.",
            {self.rank: mine},
        )


def verified_call(
    verify: Callable[[str, int, int], None],
    op: str,
    signature: tuple[int, int],
    call: Callable[..., Any],
    *arguments: Any,
) -> None:
    """A checked blocking collective (ordered mode): the signature check, then ``call`` itself."""
    verify(op, *signature)
    call(*arguments)
