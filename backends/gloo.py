"""Gloo through torch.distributed: CPU collectives where shm cannot run, between the hosts of a
two-level shm group, and the CPU side of the accelerators' default specs (``cpu:gloo,cuda:peermem``;
the defaults are in :mod:`commlayer.contract.selection`).

Every collective is verified across the group by default (:mod:`.mismatch.gloo`): without it, gloo
returns garbage for a dtype or reduce-op mismatch, and aborts a rank or returns garbage for a
count mismatch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as torch_dist
from torch import Tensor

from commlayer.backends.mismatch.gloo import CHECKED_BY, VERIFY_ENV, SignedProcessGroup
from commlayer.backends.mismatch.signer import Signer, verify_enabled
from commlayer.backends.torch_base import TorchBackend
from commlayer.backends.torch_fast_paths import fused_plan
from commlayer.contract.backend import StandaloneOptions
from commlayer.core.flight_recorder import Recording
from commlayer.core.types import Capabilities, GroupSpec, ReduceOp, Splits
from commlayer.core.work import Work

__all__ = ["GlooBackend"]


class GlooBackend(TorchBackend):
    name = "gloo"
    torch_backend = "gloo"
    capabilities = Capabilities(devices=frozenset({"cpu"}), recv_any_source=True)
    builds_standalone = True

    def __init__(self, spec: GroupSpec, process_group: Any, mismatch_checks: bool = True) -> None:
        super().__init__(spec, process_group)
        checked = mismatch_checks and spec.size > 1 and verify_enabled(VERIFY_ENV)
        self._signer = (
            Signer(process_group, spec.name, spec.global_rank, spec.group_rank, CHECKED_BY)
            if checked
            else None
        )

    @classmethod
    def create_standalone(cls, spec: GroupSpec, options: StandaloneOptions) -> GlooBackend:
        """A gloo ProcessGroup of the members alone, rendezvousing under ``spec.name``."""
        store = torch_dist.PrefixStore(f"{spec.name}/gloo", spec.store)
        process_group = torch_dist.ProcessGroupGloo(store, spec.group_rank, spec.size, spec.timeout)
        return cls(spec, process_group, options.mismatch_checks)

    def recorded_plan(
        self, op: str, fixed: tuple[Any, ...], recording: Recording
    ) -> Callable[..., Work | None] | None:
        if self._signer is None or op in ("send", "recv"):
            return super().recorded_plan(op, fixed, recording)
        return fused_plan(SignedProcessGroup(self._signer, self._pg, op, fixed), op, fixed, recording)

    def _verify(
        self, op: str, tensor: torch.Tensor, count: int, root: int = -1, reduce_op: Any = None
    ) -> None:
        if self._signer is not None:
            self._signer.verify(op, tensor.dtype, count, root, reduce_op)

    # Each op is verified before it is issued (on every rank alike, so the reductions pair up).

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp, *, async_op: bool = True) -> Work:
        self._verify("all_reduce", tensor, tensor.numel(), reduce_op=op)
        return super().all_reduce(tensor, op, async_op=async_op)

    def all_gather_into_tensor(
        self, output: torch.Tensor, tensor: torch.Tensor, *, async_op: bool = True
    ) -> Work:
        self._verify("all_gather_into_tensor", tensor, tensor.numel())
        return super().all_gather_into_tensor(output, tensor, async_op=async_op)

    def broadcast(self, tensor: torch.Tensor, root: int, *, async_op: bool = True) -> Work:
        self._verify("broadcast", tensor, tensor.numel(), root)
        return super().broadcast(tensor, root, async_op=async_op)

    def reduce(self, tensor: torch.Tensor, root: int, op: ReduceOp, *, async_op: bool = True) -> Work:
        self._verify("reduce", tensor, tensor.numel(), root, op)
        return super().reduce(tensor, root, op, async_op=async_op)

    def all_gather(
        self, outputs: Sequence[torch.Tensor], tensor: torch.Tensor, *, async_op: bool = True
    ) -> Work:
        self._verify("all_gather", tensor, tensor.numel())
        return super().all_gather(outputs, tensor, async_op=async_op)

    def reduce_scatter_tensor(
        self, output: torch.Tensor, tensor: torch.Tensor, op: ReduceOp, *, async_op: bool = True
    ) -> Work:
        self._verify("reduce_scatter_tensor", tensor, output.numel(), reduce_op=op)
        return super().reduce_scatter_tensor(output, tensor, op, async_op=async_op)

    def reduce_scatter(
        self, output: torch.Tensor, inputs: Sequence[torch.Tensor], op: ReduceOp, *, async_op: bool = True
    ) -> Work:
        self._verify("reduce_scatter", output, output.numel(), reduce_op=op)
        return super().reduce_scatter(output, inputs, op, async_op=async_op)

    def all_to_all_single(
        self, output: Tensor, tensor: Tensor, out_splits: Splits, in_splits: Splits, *, async_op: bool = True
    ) -> Work:
        if self._signer is not None:
            self._signer.verify_all_to_all_single("all_to_all_single", output, tensor, out_splits, in_splits)
        return super().all_to_all_single(output, tensor, out_splits, in_splits, async_op=async_op)

    def all_to_all(
        self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], *, async_op: bool = True
    ) -> Work:
        if self._signer is not None:
            self._signer.verify_all_to_all("all_to_all", outputs, inputs)
        return super().all_to_all(outputs, inputs, async_op=async_op)

    def gather(
        self, tensor: Tensor, outputs: Sequence[Tensor] | None, root: int, *, async_op: bool = True
    ) -> Work:
        self._verify("gather", tensor, tensor.numel(), root)
        return super().gather(tensor, outputs, root, async_op=async_op)

    def scatter(
        self, output: Tensor, inputs: Sequence[Tensor] | None, root: int, *, async_op: bool = True
    ) -> Work:
        self._verify("scatter", output, output.numel(), root)
        return super().scatter(output, inputs, root, async_op=async_op)
