"""Gloo through torch.distributed: CPU collectives where shm cannot run, between the hosts of a
two-level shm group, and the CPU side of the accelerators' default specs (``cpu:gloo,cuda:peermem``;
the defaults are in :mod:`commlayer.contract.selection`).

Measured without the check (benchmarks/faults/gloo_mismatch_detection.py, check off): gloo returns
garbage, exit code 0, for every dtype mismatch of one element size (float32 against int32) and
every reduce-op mismatch, on all eleven ops the facade sends it; a count mismatch makes gloo abort
the receiving process (SIGABRT from its transport thread) or, on broadcast and scatter, return
garbage; a root mismatch times out. So every rank's signature is compared
(:mod:`commlayer.contract.mismatch`) and every rank raises CollectiveMismatchError, never gloo's
garbage or abort. On one host it goes through shared memory and costs no gloo round trip; across
hosts it is one 32-byte gloo all-reduce before the data op. On one host a blocking all_reduce,
all_gather_into_tensor, reduce_scatter_tensor, even all_to_all_single or broadcast (off its root)
*speculates* (:mod:`.gloo_speculation`): it enters once the peers that have published agree, so
the check costs no wait, and a late mismatched rank replays the speculator's call on scratch
tensors so that gloo only ever sees matching calls. ``COMMLAYER_GLOO_VERIFY=0`` turns the check off.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as torch_dist
from torch import Tensor

from commlayer.backends.gloo_speculation import SPECULATING_OPS, ConfirmedWork, scratch_replay
from commlayer.backends.torch_base import TorchBackend
from commlayer.backends.torch_fast_paths import TORCH_OPS, fused_plan, options
from commlayer.contract.backend import StandaloneOptions
from commlayer.contract.mismatch import MismatchCheck, group_check
from commlayer.core import settings
from commlayer.core.flight_recorder import Recording
from commlayer.core.types import Capabilities, GroupSpec, ReduceOp, Splits
from commlayer.core.work import TorchWork, Work

__all__ = ["GlooBackend", "SignedProcessGroup"]


class GlooBackend(TorchBackend):
    name = "gloo"
    torch_backend = "gloo"
    capabilities = Capabilities(devices=frozenset({"cpu"}), recv_any_source=True)
    builds_standalone = True

    def __init__(self, spec: GroupSpec, process_group: Any, mismatch_checks: bool = True) -> None:
        super().__init__(spec, process_group)
        checked = mismatch_checks and spec.size > 1 and settings.GLOO_VERIFY.value()
        replay = scratch_replay(process_group, spec.size)
        self._check = group_check(spec, process_group, "gloo", replay) if checked else None

    @classmethod
    def create_standalone(cls, spec: GroupSpec, options: StandaloneOptions) -> GlooBackend:
        """A gloo ProcessGroup of the members alone, rendezvousing under ``spec.name``."""
        store = torch_dist.PrefixStore(f"{spec.name}/gloo", spec.store)
        process_group = torch_dist.ProcessGroupGloo(store, spec.group_rank, spec.size, spec.timeout)
        return cls(spec, process_group, options.mismatch_checks)

    def recorded_plan(
        self, op: str, fixed: tuple[Any, ...], recording: Recording
    ) -> Callable[..., Work | None] | None:
        if self._check is None or op in ("send", "recv"):
            return super().recorded_plan(op, fixed, recording)
        return fused_plan(SignedProcessGroup(self._check, self._pg, op, fixed), op, fixed, recording)

    def _verify(
        self, op: str, tensor: torch.Tensor, count: int, root: int = -1, reduce_op: Any = None
    ) -> None:
        if self._check is not None:
            self._check.verify(op, tensor.dtype, count, root, reduce_op)

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
        if self._check is not None:
            self._check.verify_all_to_all_single("all_to_all_single", output, tensor, out_splits, in_splits)
        return super().all_to_all_single(output, tensor, out_splits, in_splits, async_op=async_op)

    def all_to_all(
        self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], *, async_op: bool = True
    ) -> Work:
        if self._check is not None:
            self._check.verify_all_to_all("all_to_all", outputs, inputs)
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

    def all_reduce_coalesced(
        self, tensors: Sequence[torch.Tensor], op: ReduceOp, *, async_op: bool = True
    ) -> Work:
        # torch's own coalesced op: its profiler events are torch's, asyncOp included.
        self._verify("all_reduce_coalesced", tensors[0], sum(t.numel() for t in tensors), reduce_op=op)
        reduction = options(torch_dist.AllreduceCoalescedOptions, async_op, reduceOp=TORCH_OPS[op])
        return TorchWork(self._pg.allreduce_coalesced(list(tensors), reduction), list(tensors))

    def all_gather_coalesced(
        self,
        outputs: Sequence[Sequence[torch.Tensor]],
        inputs: Sequence[torch.Tensor],
        *,
        async_op: bool = True,
    ) -> Work:
        self._verify("all_gather_coalesced", inputs[0], sum(t.numel() for t in inputs))
        lists = [list(row) for row in outputs]
        work = self._pg.allgather_coalesced(
            lists, list(inputs), options(torch_dist.distributed_c10d.AllgatherOptions, async_op)
        )
        return TorchWork(work, [tensor for row in lists for tensor in row])


class SignedProcessGroup:
    """The ProcessGroup methods the fused fast paths call (``fused_plan``), each verified first.

    ``op`` and ``fixed`` are the plan's (reduce op or root); the dtype comes from the tensors.
    """

    def __init__(self, check: MismatchCheck, process_group: Any, op: str, fixed: Sequence[Any]) -> None:
        self._check, self._pg = check, process_group
        reduce_op = fixed[0] if op in ("all_reduce", "reduce_scatter_tensor") else None
        root = fixed[0] if op == "broadcast" else -1
        self._describe = (op, root, reduce_op)
        self._may_speculate = op in SPECULATING_OPS and root != check.members.group_rank
        self.send, self.recv = process_group.send, process_group.recv  # point to point: unchecked

    def _signed(
        self, tensor: torch.Tensor, count: int, opts: Any, method: Callable[..., Any], *args: Any
    ) -> Any:
        """``method(*args)`` once this call is verified, or speculated (see :mod:`.gloo_speculation`):
        only a blocking call may speculate (an async one's Work is the caller's), and never a
        broadcast's root, whose call returns before its peers have published."""
        op, root, reduce_op = self._describe
        if not self._may_speculate or getattr(opts, "asyncOp", True):
            self._check.verify(op, tensor.dtype, count, root, reduce_op)
            return method(*args)
        speculation = self._check.speculate(op, tensor.dtype, count, root, reduce_op)
        work = method(*args)
        return work if speculation is None else ConfirmedWork(work, speculation)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        return self._signed(tensors[0], tensors[0].numel(), opts, self._pg.allreduce, tensors, opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        return self._signed(tensors[0], tensors[0].numel(), opts, self._pg.broadcast, tensors, opts)

    def _allgather_base(self, output: torch.Tensor, tensor: torch.Tensor, opts: Any) -> Any:
        return self._signed(tensor, tensor.numel(), opts, self._pg._allgather_base, output, tensor, opts)

    def _reduce_scatter_base(self, output: torch.Tensor, tensor: torch.Tensor, opts: Any) -> Any:
        return self._signed(tensor, output.numel(), opts, self._pg._reduce_scatter_base, output, tensor, opts)

    def alltoall_base(
        self,
        output: torch.Tensor,
        tensor: torch.Tensor,
        out_splits: list[int],
        in_splits: list[int],
        opts: Any,
    ) -> Any:
        if out_splits or in_splits:
            self._check.verify_all_to_all_single("all_to_all_single", output, tensor, out_splits, in_splits)
            return self._pg.alltoall_base(output, tensor, out_splits, in_splits, opts)
        method = self._pg.alltoall_base
        return self._signed(tensor, tensor.numel(), opts, method, output, tensor, out_splits, in_splits, opts)
