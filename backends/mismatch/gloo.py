"""gloo's default mismatch check: a 32-byte signature reduction before each collective.

Measured without it (benchmarks/faults/gloo_mismatch_detection.py, check off): gloo returns garbage, exit code
0, for every dtype mismatch of one element size (float32 against int32) and every reduce-op
mismatch, on all eleven ops the facade sends it; a count mismatch makes gloo abort the receiving
process (SIGABRT from its transport thread) or, on broadcast and scatter, return garbage; a root
mismatch times out. So before each collective on a gloo group every rank contributes its call's
packed signature (:mod:`commlayer.backends.signature`: op, dtype, reduce op, root, count) to one 32-byte
``allreduce(MAX)`` on the same ProcessGroup and waits for it; when the calls differ every rank
raises :class:`~commlayer.core.errors.CollectiveMismatchError` naming both calls, and the data op is
never issued.

Why wait, rather than overlap the signature with the data op (gloo runs queued ops on several
worker threads): an overlapped data op still moves its bytes, so a count mismatch still aborted
the receiving rank and the rank with the smaller buffers still returned garbage (the probe, with
an overlapping first version). The price is one small gloo round trip per collective, measured by
``python benchmarks/overhead/mismatch_checks.py --gloo``; an async op pays it before returning its
Work. ``COMMLAYER_GLOO_VERIFY=0`` turns the check off.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from commlayer.backends.mismatch.signer import Signer
from commlayer.core import settings

__all__ = ["CHECKED_BY", "VERIFY_ENV", "SignedProcessGroup"]

VERIFY_ENV = settings.GLOO_VERIFY.name
CHECKED_BY = f"Checked by the gloo backend before communicating; {VERIFY_ENV}=0 turns the check off."


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
