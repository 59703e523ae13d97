"""Stage 3: parameters live only as fp32 master shards; each unit is gathered when it runs.

Per unit (see :mod:`.units`) there is one flat buffer of the training dtype whose storage is
allocated only while the unit is gathered; the unit's parameters are views into it, swapped for
an empty placeholder while it is freed, so a stray use fails loudly instead of reading freed
memory. Autograd keeps referring to the same storage, which is why a re-gathered unit serves
the tensors that forward saved for backward.

- forward pre-hook: gather the unit (or wait for its prefetch), then prefetch the next units of
  the recorded forward order, up to ``stage3_prefetch_bucket_size`` elements;
- forward post-hook: free the unit (the root unit, and the last one to run, stay until their
  gradients are done: backward starts with the latter), and hook
  the outputs so that backward gathers the unit again before its gradient computation, then
  prefetches along the reverse order;
- grad hooks: count the unit's gradients; once it has all of them, write them end to end into a
  scratch buffer (two kernels for the whole unit), reduce-scatter that into the master gradient
  shard and free the unit.

Gathers and reductions run on two communicators, so each is ordered the same on every rank on
its own and a prefetch never queues behind a reduction.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Sequence
from typing import Any

import torch

from commlayer import dist
from commlayer.dist import ProcessGroup, Work
from commlayer.zero.master import MasterShard
from commlayer.zero.partition import FlatLayout, Segment
from commlayer.zero.reducer import GradientReducer
from commlayer.zero.replicated import outside_backward
from commlayer.zero.units import UnitPlan

__all__ = ["PartitionedParams"]


class _State(enum.Enum):
    FREE = "free"
    GATHERING = "gathering"
    READY = "ready"


class _Unit:
    def __init__(
        self,
        plan: UnitPlan,
        segment: Segment,
        params: Sequence[torch.nn.Parameter],
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.plan, self.segment = plan, segment
        self.index = segment.index
        self.indices = [slot.param for slot in segment.slots]
        self.params = [params[index] for index in self.indices]
        self.full = torch.empty(segment.padded_numel, dtype=dtype, device=device)
        self.nbytes = self.full.untyped_storage().nbytes()
        self.views = [
            self.full[s.offset : s.offset + s.numel].view(p.shape) for s, p in zip(segment.slots, self.params)
        ]
        self.full.untyped_storage().resize_(0)
        self.expected = {s.param for s, p in zip(segment.slots, self.params) if p.requires_grad}
        self.state = _State.FREE
        self.gather: tuple[Work, torch.Tensor] | None = None
        self.arrived: set[int] = set()
        self.reduced = False


class PartitionedParams:
    """Gather / free / prefetch of units and per-unit gradient reduce-scatter for stage 3."""

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        names: Sequence[str],
        plans: Sequence[UnitPlan],
        layout: FlatLayout,
        master: MasterShard,
        reducer: GradientReducer,
        gather_group: ProcessGroup,
        *,
        train_dtype: torch.dtype,
        prefetch_numel: int,
    ) -> None:
        self.params, self.names = list(params), list(names)
        self.layout, self.master, self.reducer = layout, master, reducer
        self.gather_group, self.train_dtype, self.prefetch_numel = gather_group, train_dtype, prefetch_numel
        device = master.values.device
        self.units = [
            _Unit(plan, segment, self.params, train_dtype, device)
            for plan, segment in zip(plans, layout.segments)
        ]
        self.unit_of = {index: unit for unit in self.units for index in unit.indices}
        self._placeholder = torch.empty(0, dtype=train_dtype, device=device)
        self._forward_order: list[int] | None = None
        self._backward_order: list[int] = []  # reverse forward order, each unit once, root left out
        self._backward_position: dict[int, int] = {}  # unit index -> its place in _backward_order
        self._recording: list[int] = []
        self._position = 0
        self._backward_started = False
        self._hooks: list[Any] = []
        for unit in self.units:
            for module in unit.plan.modules:
                self._hooks.append(module.register_forward_pre_hook(self._pre_forward_hook(unit)))
                last = module is unit.plan.modules[-1]
                self._hooks.append(module.register_forward_hook(self._post_forward_hook(unit, last)))
        for index, param in enumerate(self.params):
            if param.requires_grad:
                self._hooks.append(param.register_post_accumulate_grad_hook(self._grad_hook(index)))

    # --- set-up ------------------------------------------------------------------------------

    def adopt(self, segment: Segment, full: torch.Tensor) -> None:
        low, high = segment.shard_range(self.master.rank)
        self.master.segment_values(segment).copy_(full[low:high])

    def install(self) -> None:
        """Drop every parameter's own storage: from now on units are gathered on demand."""
        for param in self.params:
            param.data = self._placeholder

    # --- gather and free ---------------------------------------------------------------------

    def _start_gather(self, unit: _Unit) -> None:
        unit.full.untyped_storage().resize_(unit.nbytes)
        source = self.master.segment_values(unit.segment)
        source = source if source.dtype == self.train_dtype else source.to(self.train_dtype)
        if self.layout.shards == 1:
            unit.full.copy_(source)
            unit.gather = None
        else:
            work = dist.all_gather_into_tensor(unit.full, source, group=self.gather_group, async_op=True)
            unit.gather = (work, source)  # the source stays alive until the gather is waited for
        unit.state = _State.GATHERING

    def _ensure_gathered(self, unit: _Unit) -> None:
        if unit.state is _State.READY:
            return
        if unit.state is _State.FREE:
            self._start_gather(unit)
        if unit.gather is not None:
            unit.gather[0].wait()
            unit.gather = None
        for param, view in zip(unit.params, unit.views):
            param.data = view
        unit.state = _State.READY

    def _free(self, unit: _Unit) -> None:
        if unit.state is _State.FREE:
            return
        if unit.gather is not None:
            unit.gather[0].wait()
            unit.gather = None
        for param in unit.params:
            param.data = self._placeholder
        unit.full.untyped_storage().resize_(0)
        unit.state = _State.FREE

    def free_all(self) -> None:
        for unit in self.units:
            self._free(unit)

    def _prefetch(self, order: Sequence[int], position: int) -> None:
        ahead = 0
        for index in itertools.islice(order, position + 1, None):
            if ahead >= self.prefetch_numel:
                break
            unit = self.units[index]
            if unit.state is _State.FREE and not unit.reduced:
                self._start_gather(unit)
            ahead += unit.segment.padded_numel

    # --- hooks -------------------------------------------------------------------------------

    def _pre_forward_hook(self, unit: _Unit):
        def pre_forward(module: torch.nn.Module, args: Any) -> None:
            if unit.index == 0:
                self._recording, self._position = [], 0
            if module is not unit.plan.modules[0]:
                self._ensure_gathered(unit)  # a later module of a unit of several: gathered with the first
                return
            self._recording.append(unit.index)
            self._ensure_gathered(unit)
            if self._forward_order is not None:
                self._prefetch(self._forward_order, self._position)
            self._position += 1

        return pre_forward

    def _post_forward_hook(self, unit: _Unit, last: bool):
        """``last``: the module is the unit's last one (a unit of several is freed after it)."""

        def post_forward(module: torch.nn.Module, args: Any, output: Any) -> None:
            grad_enabled = torch.is_grad_enabled()
            if grad_enabled:
                for tensor in _tensors(output):
                    if tensor.requires_grad:
                        tensor.register_hook(self._pre_backward_hook(unit))
            if not last:
                return
            if unit.index != 0 and not (grad_enabled and self._runs_last(unit)):
                self._free(unit)
            elif not grad_enabled:
                self.free_all()
            elif self._forward_order is None:
                self._forward_order = list(self._recording)
                self._backward_order = [i for i in dict.fromkeys(reversed(self._recording)) if i != 0]
                self._backward_position = {unit: at for at, unit in enumerate(self._backward_order)}

        return post_forward

    def _runs_last(self, unit: _Unit) -> bool:
        """The last unit of the forward pass is the first of backward: it stays gathered between
        the two (FSDP2 keeps its root likewise) instead of being freed and gathered again at once."""
        return self._forward_order is not None and unit.index == self._forward_order[-1]

    def _pre_backward_hook(self, unit: _Unit):
        def pre_backward(grad: torch.Tensor) -> torch.Tensor:
            if not unit.reduced:
                self._ensure_gathered(unit)  # already gathered: prefetched, or kept since forward
                position = self._backward_position.get(unit.index)
                if position is not None:
                    self._prefetch(self._backward_order, position)
            return grad

        return pre_backward

    def _grad_hook(self, index: int):
        def on_grad(param: torch.Tensor) -> None:
            if not self._backward_started:
                raise outside_backward(self.names[index])
            unit = self.unit_of[index]
            unit.arrived.add(index)
            if unit.arrived == unit.expected:
                self._reduce(unit)

        return on_grad

    def _new_staging(self, unit: _Unit) -> torch.Tensor:
        """Uninitialised but for the padding: the gradients overwrite the rest (one pass, not two)."""
        staging = torch.empty(
            unit.segment.padded_numel, dtype=self.reducer.reduce_dtype, device=unit.full.device
        )
        staging[unit.segment.numel :].zero_()
        return staging

    def _reduce(self, unit: _Unit) -> None:
        staging = self._new_staging(unit)
        grads = [
            param.grad if index in unit.arrived else None for index, param in zip(unit.indices, unit.params)
        ]
        if all(grad is not None for grad in grads):
            self.reducer.stage_consecutive(staging[: unit.segment.numel], grads)
        else:  # a unit that got no gradient (or lacks some) still takes part, with zeros for the missing
            for slot, grad in zip(unit.segment.slots, grads):
                target = staging[slot.offset : slot.offset + slot.numel]
                if grad is None:
                    target.zero_()
                else:
                    self.reducer.stage(target, grad)
        for param in unit.params:
            param.grad = None
        unit.reduced = True
        self.reducer.start(unit.segment, staging, prescaled=True)
        self._free(unit)

    # --- engine interface --------------------------------------------------------------------

    def begin_backward(self, boundary: bool) -> None:
        self._backward_started = True
        for unit in self.units:
            unit.arrived, unit.reduced = set(), False

    def finish_backward(self) -> None:
        for unit in self.units:
            if unit.expected and not unit.reduced:
                self._reduce(unit)
        self.reducer.drain()
        self.free_all()
        self._backward_started = False

    def zero_grads(self) -> None:
        """Drop the gradients a unit holds until its reduction (none once backward has finished)."""
        for unit in self.units:
            if unit.arrived and not unit.reduced:
                for param in unit.params:
                    param.grad = None
                unit.arrived = set()

    def refresh_params(self) -> None:
        """After a step every gathered copy is stale; the next forward gathers afresh."""
        self.free_all()

    def full_values(self) -> list[torch.Tensor]:
        return self.master.gather_params(self.gather_group)

    def remove_hooks(self) -> None:
        for handle in self._hooks:
            handle.remove()


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item)]
    return []
