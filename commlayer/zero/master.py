"""A rank's fp32 master shard, its gradient, and the optimizer rewired to step only that shard.

The fp32 gradient shard exists only while it is needed. A reduced segment arrives as a *piece*
in the reduction dtype (bf16 in bf16 training) and is kept as it is; the pieces are folded into
a freshly allocated fp32 gradient shard just before the optimizer step (or at the end of a
micro-step that must accumulate into the next one), and that shard is released after the step.
So during forward and backward -- where activations make the memory peak -- a rank holds no
fp32 gradient at all, only the pieces reduced so far (half the bytes in bf16, and arriving as
activations are freed). Folding is the same ``add_`` into zeros as before, so values are exact.

The torch optimizer the user built keeps its param groups (learning rates, weight decay, betas);
only each group's ``params`` list is replaced by the *fragments* of those parameters this rank
owns -- views into one flat fp32 tensor. For element-wise optimizers (Adam, AdamW, SGD, ...)
stepping fragments is exactly stepping the whole parameters, restricted to this rank's elements.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from commlayer import dist
from commlayer.dist import ProcessGroup
from commlayer.zero.partition import FlatLayout, Fragment, Segment

__all__ = ["MasterShard"]


class MasterShard:
    """``values`` and ``grads``: this rank's flat fp32 shard of every segment, end to end."""

    def __init__(
        self, layout: FlatLayout, rank: int, params: Sequence[torch.Tensor], device: torch.device
    ) -> None:
        self.layout = layout
        self.rank = rank
        self.values = torch.zeros(layout.shard_numel, dtype=torch.float32, device=device)
        self.grads: torch.Tensor | None = None  # see fold_pending / release_grads
        self.pending: dict[int, torch.Tensor] = {}  # segment index -> reduced piece, not yet in grads
        self.fragments: tuple[Fragment, ...] = layout.fragments(rank)
        self.shapes = [tuple(p.shape) for p in params]
        self.fragment_values = [self._view(self.values, f, self.shapes[f.param]) for f in self.fragments]
        self.fragment_grads: list[torch.Tensor] = []

    @staticmethod
    def _view(flat: torch.Tensor, fragment: Fragment, shape: tuple[int, ...]) -> torch.Tensor:
        view = flat[fragment.master_offset : fragment.master_offset + fragment.numel]
        # A fragment holding a whole parameter keeps its shape, for optimizers that look at it.
        whole = fragment.start == 0 and fragment.numel == _numel(shape)
        return view.view(shape) if whole else view

    def segment_values(self, segment: Segment) -> torch.Tensor:
        return self.values[segment.shard_offset : segment.shard_offset + segment.shard_numel]

    def segment_grads(self, segment: Segment) -> torch.Tensor:
        assert self.grads is not None, "fold_pending() allocates the gradient shard"
        return self.grads[segment.shard_offset : segment.shard_offset + segment.shard_numel]

    # --- gradient life cycle -----------------------------------------------------------------

    def accept_piece(self, segment: Segment, piece: torch.Tensor) -> None:
        """Keep ``piece`` (this rank's reduced part of ``segment``) until the next fold."""
        if segment.index in self.pending:  # a second reduction of the segment in one micro-step
            self.fold_pending()
        self.pending[segment.index] = piece

    def fold_pending(self) -> torch.Tensor:
        """Sum the kept pieces into the fp32 gradient shard (allocated here when absent)."""
        fresh = self.grads is None
        if fresh:
            self.grads = torch.empty_like(self.values)
            self.fragment_grads = [self._view(self.grads, f, self.shapes[f.param]) for f in self.fragments]
        for segment in self.layout.segments:
            piece = self.pending.pop(segment.index, None)
            target = self.segment_grads(segment)
            if piece is None:
                if fresh:
                    target.zero_()
            elif fresh:
                target.copy_(piece)  # same value as adding into zeros, one pass fewer
            else:
                target.add_(piece)
        assert self.grads is not None
        return self.grads

    def release_grads(self) -> None:
        """Drop the fp32 gradient shard and any kept pieces (after a step, or on zero_grad)."""
        self.pending.clear()
        self.grads = None
        self.fragment_grads = []
        for tensor in self.fragment_values:
            tensor.grad = None

    def grad_bytes(self) -> int:
        """Bytes of gradient this rank holds right now (fp32 shard plus kept pieces)."""
        held = 0 if self.grads is None else self.grads.numel() * self.grads.element_size()
        return held + sum(piece.numel() * piece.element_size() for piece in self.pending.values())

    def gather_segment(self, segment: Segment, group: ProcessGroup) -> torch.Tensor:
        """A whole segment's fp32 values assembled from every rank's shard (collective)."""
        mine = self.segment_values(segment)
        if self.layout.shards == 1:
            return mine.clone()
        whole = torch.empty(segment.padded_numel, dtype=mine.dtype, device=mine.device)
        dist.all_gather_into_tensor(whole, mine, group=group)
        return whole

    def gather_params(self, group: ProcessGroup) -> list[torch.Tensor]:
        """Every parameter's full fp32 value, assembled from all ranks' shards (collective)."""
        gathered: list[torch.Tensor] = [self.values] * len(self.shapes)
        for segment in self.layout.segments:
            whole = self.gather_segment(segment, group)
            for slot in segment.slots:
                gathered[slot.param] = whole[slot.offset : slot.offset + slot.numel].view(
                    self.shapes[slot.param]
                )
        return gathered

    # --- optimizer ---------------------------------------------------------------------------

    def attach(
        self,
        optimizer: torch.optim.Optimizer,
        params: Sequence[torch.nn.Parameter],
        group_of: dict[int, int] | None = None,
        append: bool = False,
    ) -> None:
        """Replace each group's parameters by this rank's trainable fragments of them.

        ``group_of`` (parameter id -> group index) and ``append`` let a second master shard add
        its fragments after a first one has attached (the groups then hold fragments only).
        """
        if group_of is None:
            group_of = param_group_index(optimizer)
        per_group: list[list[torch.Tensor]] = [[] for _ in optimizer.param_groups]
        for fragment, tensor in zip(self.fragments, self.fragment_values):
            param = params[fragment.param]
            if param.requires_grad and id(param) in group_of:
                per_group[group_of[id(param)]].append(tensor)
        for group, fragments in zip(optimizer.param_groups, per_group):
            group["params"] = [*group["params"], *fragments] if append else fragments

    def link_grads(self) -> None:
        """Point every fragment's ``.grad`` at the folded gradient shard (call after fold_pending)."""
        assert len(self.fragment_grads) == len(self.fragment_values), "fold_pending() first"
        for tensor, grad in zip(self.fragment_values, self.fragment_grads):
            if tensor.grad is not grad:
                tensor.grad = grad

    def trainable_fragments(
        self, params: Sequence[torch.nn.Parameter]
    ) -> list[tuple[Fragment, torch.Tensor]]:
        """(fragment, master view) pairs of the parameters the optimizer steps, in shard order."""
        return [(f, t) for f, t in zip(self.fragments, self.fragment_values) if params[f.param].requires_grad]

    # --- gradient arithmetic -----------------------------------------------------------------

    def grad_norm_squared(self) -> torch.Tensor:
        """Local sum of squared gradients, a 1-element fp32 tensor (padding is always zero)."""
        return torch.linalg.vector_norm(self.fold_pending(), 2).square().reshape(1)

    def nonfinite_flag(self) -> torch.Tensor:
        """1.0 when any local gradient is inf or nan, as a 1-element tensor to all-reduce with MAX."""
        return (~torch.isfinite(self.fold_pending()).all()).to(torch.float32).reshape(1)


def param_group_index(optimizer: torch.optim.Optimizer) -> dict[int, int]:
    """Parameter id -> the index of the optimizer param group holding it."""
    return {id(p): index for index, group in enumerate(optimizer.param_groups) for p in group["params"]}


def _numel(shape: tuple[int, ...]) -> int:
    total = 1
    for size in shape:
        total *= size
    return total
