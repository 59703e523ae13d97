"""A backend's default mismatch check by one signature reduction before each collective.

Every rank of the group contributes its call's packed signature (:mod:`commlayer.backends.signature`: op, dtype,
reduce op, root, count) to one small ``allreduce(MAX)`` on the group itself and waits for it;
when the calls differ every rank raises :class:`~commlayer.core.errors.CollectiveMismatchError`
naming both calls, and the data op is never issued. gloo (:mod:`commlayer.backends.gloo`) and ccl use it;
why it waits instead of overlapping the data op is in :mod:`commlayer.backends.gloo`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as torch_dist

from commlayer.backends.mismatch.signature import agree, dtype_codes, mismatch, pack
from commlayer.backends.torch_fast_paths import options
from commlayer.core import profiling, settings
from commlayer.core.call_deadline import wait_polled
from commlayer.core.errors import CollectiveMismatchError

__all__ = ["Signer", "split_counts", "verify_enabled"]

# Every dtype torch defines, numbered by name: the same on every rank of one torch version.
_CODES = dtype_codes(value for value in vars(torch).values() if isinstance(value, torch.dtype))
_UNKNOWN = -(1 << 62)  # below any element count, and below any negated one
_MAX = options(torch_dist.AllreduceOptions, False, reduceOp=torch_dist.ReduceOp.MAX)


def verify_enabled(variable: str, environ: Mapping[str, str] | None = None) -> bool:
    """False when the setting ``variable`` (a backend's switch) is 0 (or false/off/no)."""
    return bool(settings.by_name(variable).value(environ))


class Signer:
    """Checks each call's signature across one group before the call is issued.

    ``process_group`` needs one method, torch's ``allreduce([int64 tensor], opts)`` returning a
    Work: a gloo ProcessGroup, or a channel over another library (ccl's). ``checked_by`` ends each
    mismatch message: which backend checked, and the switch that turns its check off.
    """

    __slots__ = ("checked_by", "group", "group_rank", "process_group", "rank")

    def __init__(self, process_group: Any, group: str, rank: int, group_rank: int, checked_by: str) -> None:
        self.process_group, self.group, self.rank = process_group, group, rank
        self.group_rank, self.checked_by = group_rank, checked_by

    def verify(self, op: str, dtype: torch.dtype, count: int, root: int = -1, reduce_op: Any = None) -> None:
        """Raise CollectiveMismatchError on every rank unless all ranks pass this call.

        The reduction's own failure (a dead peer, the group's timeout) propagates as torch raised
        it; the facade translates it, naming the op.
        """
        key = pack(op, dtype, _CODES, root, reduce_op)
        values = torch.tensor((key, -key, count, -count), dtype=torch.int64)
        self._reduce(values, op)
        reduced = values.tolist()
        if not agree(key, count, reduced):
            raise mismatch(op, key, count, reduced, _CODES, (self.group, self.rank), self.checked_by)

    def _reduce(self, values: torch.Tensor, op: str) -> None:
        """The check's MAX reduction, hidden from a running profiler: it is not the user's call."""
        if not profiling.active:
            wait_polled(self.process_group.allreduce([values], _MAX), f"{op}'s signature check")
            return
        with profiling.hidden():
            wait_polled(self.process_group.allreduce([values], _MAX), f"{op}'s signature check")

    def verify_exchange(
        self, op: str, dtype: torch.dtype, sends: Sequence[int], receives: Sequence[int]
    ) -> None:
        """An all-to-all's check: op and dtype, and every pair's element count.

        ``sends[j]`` is what this rank sends to group rank j, ``receives[j]`` what it expects from
        j. Entry (s, d) of an n x n grid is known to its sender s and its receiver d; each writes it
        as ``[x, -x]`` (the others an "unknown" below any size), so after the MAX each entry holds
        its largest and (negated) smallest value, equal exactly when the two ranks agree.
        """
        key, size, me = pack(op, dtype, _CODES), len(sends), self.group_rank
        grid = torch.full((size, size, 2), _UNKNOWN, dtype=torch.int64)
        sent, expected = torch.tensor(sends, dtype=torch.int64), torch.tensor(receives, dtype=torch.int64)
        grid[me, :, 0], grid[me, :, 1] = sent, -sent
        grid[:, me, 0] = torch.maximum(grid[:, me, 0], expected)
        grid[:, me, 1] = torch.maximum(grid[:, me, 1], -expected)
        values = torch.cat((torch.tensor((key, -key), dtype=torch.int64), grid.flatten()))
        self._reduce(values, op)
        reduced = values[:2].tolist()
        if not agree(key, 0, [*reduced, 0, 0]):
            raise mismatch(op, key, 0, [*reduced, 0, 0], _CODES, (self.group, self.rank), self.checked_by)
        grid = values[2:].view(size, size, 2)
        differing = (grid[:, :, 0] != -grid[:, :, 1]).nonzero()
        if len(differing):
            raise self._exchange_mismatch(op, *differing[0].tolist(), grid)

    def verify_all_to_all_single(
        self,
        op: str,
        output: torch.Tensor,
        tensor: torch.Tensor,
        output_splits: Sequence[int] | None,
        input_splits: Sequence[int] | None,
    ) -> None:
        """An all_to_all_single's check: every pair's count when the splits are uneven (they
        differ between ranks legitimately), else op, dtype and count like any collective."""
        if output_splits or input_splits:
            counts = split_counts(output, tensor, list(output_splits or ()), list(input_splits or ()))
            self.verify_exchange(op, tensor.dtype, *counts)
        else:
            self.verify(op, tensor.dtype, tensor.numel())

    def verify_all_to_all(
        self, op: str, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]
    ) -> None:
        """An all_to_all's check over tensor lists: each pair's count (per-peer sizes may differ)."""
        sends, receives = [chunk.numel() for chunk in inputs], [chunk.numel() for chunk in outputs]
        self.verify_exchange(op, inputs[0].dtype, sends, receives)

    def _exchange_mismatch(self, op: str, sender: int, receiver: int, grid: torch.Tensor) -> Exception:
        low, high = int(-grid[sender, receiver, 1]), int(grid[sender, receiver, 0])
        return CollectiveMismatchError(
            f"{op} on group '{self.group}': group ranks {sender} and {receiver} disagree on how many "
            f"elements {sender} sends to {receiver} ({low} and {high}) (rank {self.rank}). {self.checked_by}",
            {self.rank: f"{op} with mismatched sizes"},
        )


def split_counts(
    output: torch.Tensor, tensor: torch.Tensor, out_splits: Sequence[int], in_splits: Sequence[int]
) -> tuple[list[int], list[int]]:
    """(elements sent to each rank, elements received from each) of an all_to_all_single; an
    empty split list is an even split of dim 0."""
    size = len(out_splits or in_splits)
    return _elements(tensor, in_splits, size), _elements(output, out_splits, size)


def _elements(tensor: torch.Tensor, splits: Sequence[int], size: int) -> list[int]:
    rows = tensor.shape[0] if tensor.dim() else 1
    row = tensor.numel() // rows if rows else 0
    return [split * row for split in splits] if splits else [tensor.numel() // size] * size
