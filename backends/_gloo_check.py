"""gloo's default mismatch check: a 32-byte signature reduction before each collective.

Measured without it (benchmarks/gloo_mismatch_probe.py, check off): gloo returns garbage, exit code
0, for every dtype mismatch of one element size (float32 against int32) and every reduce-op
mismatch, on all eleven ops the facade sends it; a count mismatch makes gloo abort the receiving
process (SIGABRT from its transport thread) or, on broadcast and scatter, return garbage; a root
mismatch times out. So before each collective on a gloo group every rank contributes its call's
packed signature (:mod:`._signature`: op, dtype, reduce op, root, count) to one 32-byte
``allreduce(MAX)`` on the same ProcessGroup and waits for it; when the calls differ every rank
raises :class:`~commlayer.errors.CollectiveMismatchError` naming both calls, and the data op is
never issued.

Why wait, rather than overlap the signature with the data op (gloo runs queued ops on several
worker threads): an overlapped data op still moves its bytes, so a count mismatch still aborted
the receiving rank and the rank with the smaller buffers still returned garbage (the probe, with
an overlapping first version). The price is one small gloo round trip per collective, measured by
``python benchmarks/mismatch_check_overhead.py --gloo``; an async op pays it before returning its
Work. ``COMMLAYER_GLOO_VERIFY=0`` turns the check off.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as torch_dist

from commlayer.errors import CollectiveMismatchError

from ._signature import agree, dtype_codes, mismatch, pack
from ._torch_plans import options

__all__ = ["SignedProcessGroup", "Signer", "split_counts", "verify_enabled"]

VERIFY_ENV = "COMMLAYER_GLOO_VERIFY"
_CHECKED_BY = f"Checked by the gloo backend before communicating; {VERIFY_ENV}=0 turns the check off."
# Every dtype torch defines, numbered by name: the same on every rank of one torch version.
_CODES = dtype_codes(value for value in vars(torch).values() if isinstance(value, torch.dtype))
_UNKNOWN = -(1 << 62)  # below any element count, and below any negated one
_MAX = options(torch_dist.AllreduceOptions, False, reduceOp=torch_dist.ReduceOp.MAX)


def verify_enabled(environ: Mapping[str, str] = os.environ, variable: str = VERIFY_ENV) -> bool:
    """False when ``variable`` (``COMMLAYER_GLOO_VERIFY`` by default) is 0 (or false/off/no)."""
    return environ.get(variable, "1").strip().lower() not in ("0", "false", "off", "no")


class Signer:
    """Checks each call's signature across one gloo ProcessGroup before the call is issued."""

    __slots__ = ("checked_by", "group", "group_rank", "process_group", "rank")

    def __init__(
        self, process_group: Any, group: str, rank: int, group_rank: int = 0, checked_by: str = _CHECKED_BY
    ) -> None:
        self.process_group, self.group, self.rank = process_group, group, rank
        self.group_rank, self.checked_by = group_rank, checked_by

    def verify(self, op: str, dtype: torch.dtype, count: int, root: int = -1, reduce_op: Any = None) -> None:
        """Raise CollectiveMismatchError on every rank unless all ranks pass this call.

        The reduction's own failure (a dead peer, the group's timeout) propagates as torch raised
        it; the facade translates it, naming the op.
        """
        key = pack(op, dtype, _CODES, root, reduce_op)
        values = torch.tensor((key, -key, count, -count), dtype=torch.int64)
        self.process_group.allreduce([values], _MAX).wait()
        reduced = values.tolist()
        if not agree(key, count, reduced):
            raise mismatch(op, key, count, reduced, _CODES, (self.group, self.rank), self.checked_by)

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
        self.process_group.allreduce([values], _MAX).wait()
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


class SignedProcessGroup:
    """The ProcessGroup methods the fused launchers call (``_torch_plans``), each verified first.

    ``op`` and ``fixed`` are the plan's (reduce op or root); the dtype comes from the tensors.
    """

    def __init__(self, signer: Signer, process_group: Any, op: str, fixed: Sequence[Any]) -> None:
        self._signer, self._pg = signer, process_group
        reduce_op = fixed[0] if op in ("all_reduce", "reduce_scatter_tensor") else None
        root = fixed[0] if op == "broadcast" else -1
        self._describe = (op, root, reduce_op)
        self.send, self.recv = process_group.send, process_group.recv  # point to point: unchecked

    def _verify(self, tensor: torch.Tensor, count: int) -> None:
        op, root, reduce_op = self._describe
        self._signer.verify(op, tensor.dtype, count, root, reduce_op)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        self._verify(tensors[0], tensors[0].numel())
        return self._pg.allreduce(tensors, opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        self._verify(tensors[0], tensors[0].numel())
        return self._pg.broadcast(tensors, opts)

    def _allgather_base(self, output: torch.Tensor, tensor: torch.Tensor, opts: Any) -> Any:
        self._verify(tensor, tensor.numel())
        return self._pg._allgather_base(output, tensor, opts)

    def _reduce_scatter_base(self, output: torch.Tensor, tensor: torch.Tensor, opts: Any) -> Any:
        self._verify(tensor, output.numel())
        return self._pg._reduce_scatter_base(output, tensor, opts)

    def alltoall_base(
        self,
        output: torch.Tensor,
        tensor: torch.Tensor,
        out_splits: list[int],
        in_splits: list[int],
        opts: Any,
    ) -> Any:
        self._signer.verify_all_to_all_single("all_to_all_single", output, tensor, out_splits, in_splits)
        return self._pg.alltoall_base(output, tensor, out_splits, in_splits, opts)


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
