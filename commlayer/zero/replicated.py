"""Stages 0-2: every rank holds all parameters, in one flat buffer of the training dtype.

Parameters become views into ``flat`` (segment after segment, see :mod:`.partition`), so the
all-gather after the optimizer step writes them in place. Gradients:

- with ``full_grads`` (stage 0, and stage 1 accumulating over micro-steps, see
  :func:`keeps_full_gradients`) a persistent flat gradient buffer; each ``param.grad``
  is a view into it, so autograd accumulates micro-steps there, and only the boundary
  micro-step reduces it;
- otherwise no full gradient: a grad hook copies each gradient into its segment's scratch
  buffer (allocated on its first gradient, freed once reduced) and drops ``param.grad``; every
  micro-step reduce-scatters the segments into this rank's gradient pieces (see
  :class:`.master.MasterShard`).

With ``overlap_comm`` a segment is reduced from the backward hooks as soon as all its gradients
arrived, in segment order (segments hold parameters in reverse registration order, which is
roughly the order backward produces them); otherwise everything is reduced after backward.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from commlayer import dist
from commlayer.core.errors import CommError
from commlayer.dist import ProcessGroup, Work
from commlayer.zero.master import MasterShard
from commlayer.zero.partition import FlatLayout, Segment
from commlayer.zero.reducer import GradientReducer

__all__ = ["ReplicatedParams", "keeps_full_gradients"]


class ReplicatedParams:
    """Parameter and gradient storage, grad hooks and post-step all-gather for stages 0-2."""

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        names: Sequence[str],
        layout: FlatLayout,
        master: MasterShard,
        reducer: GradientReducer,
        gather_group: ProcessGroup | None,
        *,
        full_grads: bool,
        train_dtype: torch.dtype,
        overlap: bool,
        allgather_numel: int,
    ) -> None:
        self.params, self.names = list(params), list(names)
        self.layout, self.master, self.reducer = layout, master, reducer
        self.gather_group, self.full_grads, self.overlap, self.allgather_numel = (
            gather_group,
            full_grads,
            overlap,
            allgather_numel,
        )
        device = self.params[0].device
        self.flat = torch.zeros(layout.padded_numel, dtype=train_dtype, device=device)
        self.param_views = self._views(self.flat)
        self.grad_flat = torch.zeros_like(self.flat) if full_grads else None
        self.grad_views = self._views(self.grad_flat) if self.grad_flat is not None else None
        self.segment_of = {slot.param: segment for segment in layout.segments for slot in segment.slots}
        self.slot_of = {slot.param: slot for segment in layout.segments for slot in segment.slots}
        self.expected = [
            sum(self.params[s.param].requires_grad for s in segment.slots) for segment in layout.segments
        ]
        self._staging: dict[int, torch.Tensor] = {}
        self._arrived: list[set[int]] = [set() for _ in layout.segments]
        self._next_start = 0
        self._counting = False
        self._inside_backward = False
        self._hooks = [
            p.register_post_accumulate_grad_hook(self._hook_for(i))
            for i, p in enumerate(self.params)
            if p.requires_grad
        ]

    def _views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        views: list[torch.Tensor] = [flat] * len(self.params)
        for segment in self.layout.segments:
            for slot in segment.slots:
                start = segment.offset + slot.offset
                views[slot.param] = flat[start : start + slot.numel].view(self.params[slot.param].shape)
        return views

    # --- set-up ------------------------------------------------------------------------------

    def adopt(self, segment: Segment, full: torch.Tensor) -> None:
        """Take the (broadcast) fp32 values of a whole segment: working copy and master shard."""
        self.flat[segment.offset : segment.offset + segment.padded_numel].copy_(full)
        low, high = (
            segment.shard_range(self.master.rank) if self.layout.shards > 1 else (0, segment.padded_numel)
        )
        self.master.segment_values(segment).copy_(full[low:high])

    def install(self) -> None:
        """Make every parameter a view of the flat buffer (freeing its original storage)."""
        for param, view in zip(self.params, self.param_views):
            param.data = view
        self.attach_grads()

    def attach_grads(self) -> None:
        """With full gradients: make each ``.grad`` the flat view again (a user zero_grad may replace it)."""
        if self.grad_views is None:
            return
        for param, view in zip(self.params, self.grad_views):
            if not param.requires_grad or param.grad is view:
                continue
            if param.grad is None:
                view.zero_()
            else:
                view.copy_(param.grad)
            param.grad = view

    # --- backward ----------------------------------------------------------------------------

    def begin_backward(self, boundary: bool) -> None:
        self.attach_grads()
        # Full gradients are reduced only on the accumulation boundary; scratch ones every micro-step.
        self._counting = boundary or not self.full_grads
        self._inside_backward = True
        self._arrived = [set() for _ in self.layout.segments]
        self._next_start = 0

    def _hook_for(self, index: int):
        def on_grad(param: torch.Tensor) -> None:
            if not self._inside_backward:
                raise outside_backward(self.names[index])
            if self._counting:
                self._gradient_arrived(index, param)

        return on_grad

    def _gradient_arrived(self, index: int, param: torch.Tensor) -> None:
        segment = self.segment_of[index]
        if index in self._arrived[segment.index] or segment.index < self._next_start:
            raise CommError(
                f"zero: parameter '{self.names[index]}' received a second gradient in one backward pass "
                "(reentrant activation checkpointing?); set zero_optimization.overlap_comm to false"
            )
        if not self.full_grads:
            slot = self.slot_of[index]
            staging = self._staging_for(segment)
            self.reducer.stage(staging[slot.offset : slot.offset + slot.numel], param.grad)
            param.grad = None
        self._arrived[segment.index].add(index)
        if self.overlap:
            self._start_ready()

    def _staging_for(self, segment: Segment) -> torch.Tensor:
        if segment.index not in self._staging:
            buffer = torch.empty(
                segment.padded_numel, dtype=self.reducer.reduce_dtype, device=self.flat.device
            )
            buffer[segment.numel :].zero_()
            self._staging[segment.index] = buffer
        return self._staging[segment.index]

    def _start_ready(self) -> None:
        segments = self.layout.segments
        while (
            self._next_start < len(segments)
            and len(self._arrived[self._next_start]) == self.expected[self._next_start]
        ):
            self._start(segments[self._next_start])

    def _start(self, segment: Segment) -> None:
        self._next_start = segment.index + 1
        if not self.full_grads:
            buffer = self._staging_for(segment)
            for slot in segment.slots:
                if slot.param not in self._arrived[segment.index]:  # unused this time: no gradient
                    buffer[slot.offset : slot.offset + slot.numel].zero_()
            self.reducer.start(segment, self._staging.pop(segment.index), prescaled=True)
        else:
            assert self.grad_flat is not None
            self.reducer.start(
                segment, self.grad_flat[segment.offset : segment.offset + segment.padded_numel]
            )

    def finish_backward(self) -> None:
        """Reduce whatever is left (unused parameters, or everything without overlap), in order."""
        self._inside_backward = False
        if not self._counting:
            return
        for segment in self.layout.segments[self._next_start :]:
            self._start(segment)
        self.reducer.drain()
        self._counting = False

    # --- step --------------------------------------------------------------------------------

    def zero_grads(self) -> None:
        if self.grad_flat is not None:
            self.grad_flat.zero_()
        self._staging.clear()

    def refresh_params(self) -> None:
        """Copy the master shard into the working parameters: all-gather it (stages 1-2)."""
        in_flight: list[tuple[Work, torch.Tensor, int]] = []
        for segment in self.layout.segments:
            whole = self.flat[segment.offset : segment.offset + segment.padded_numel]
            shard = self.master.segment_values(segment)
            if self.layout.shards == 1:
                whole.copy_(shard)
                continue
            # A separate input (never a slice of the output): MPI forbids aliased buffers.
            source = shard.to(self.flat.dtype) if shard.dtype != self.flat.dtype else shard
            work = dist.all_gather_into_tensor(whole, source, group=self.gather_group, async_op=True)
            in_flight.append((work, source, segment.padded_numel))
            # allgather_bucket_size caps the elements being gathered at once.
            while sum(n for _, _, n in in_flight) > self.allgather_numel and len(in_flight) > 1:
                in_flight.pop(0)[0].wait()
        for work, _, _ in in_flight:
            work.wait()

    def full_values(self) -> list[torch.Tensor]:
        """Every parameter in fp32, gathered from the master shards (collective)."""
        return self.master.gather_params(self.gather_group or self.reducer.group)

    def remove_hooks(self) -> None:
        for handle in self._hooks:
            handle.remove()


def outside_backward(name: str) -> RuntimeError:
    return RuntimeError(
        f"zero: a gradient reached parameter '{name}' outside engine.backward(); call "
        "engine.backward(loss) instead of loss.backward(), so that the engine can reduce it"
    )


def keeps_full_gradients(stage: int, accumulation_steps: int) -> bool:
    """Whether ranks keep a whole-model gradient buffer between backward passes (stages 0-2).

    Stage 0 does (it all-reduces whole buckets); stage 1 does only when gradients accumulate
    over micro-steps, since it reduces once per optimizer step. With one micro-step per step
    nothing has to outlive the backward pass, so stage 1 reduce-scatters scratch buckets as
    stage 2 does and never holds the full gradient (that buffer is 2 bytes per parameter in
    bf16, on top of the memory peak). Stage 2 never does.
    """
    return stage == 0 or (stage == 1 and accumulation_steps > 1)
