"""Moving token rows into expert slots and back with gathers only (no atomics, no host syncs).

A routing of ``T`` tokens with ``k`` choices each into ``E * C`` expert slots is a partial
one-to-one map between the ``k * T`` choices (choice-major: choice ``j * T + t`` is token ``t``'s
``j``-th choice) and the slots. :class:`RouteMap` holds it in both directions, so each move
and its gradient is one ``index_select``: the gradient of a gather through a one-to-one map is
the gather through the inverse map, where ``index_add`` (what autograd would use) makes CUDA
threads collide on atomic adds -- and on one row for every dropped choice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["RouteMap", "combine", "dispatch"]


@dataclass(frozen=True)
class RouteMap:
    """Both directions of a routing; ``pad`` entries point one row past the end (a zero row)."""

    slot_of_choice: torch.Tensor  # [k * T] long: the slot of each choice, E * C when dropped
    choice_of_slot: torch.Tensor  # [E * C] long: the choice in each slot, k * T when empty
    token_of_slot: torch.Tensor  # [E * C] long: the token in each slot, T when empty
    tokens: int
    slots: int

    @staticmethod
    def build(expert: torch.Tensor, slot: torch.Tensor, capacity: int, experts: int) -> RouteMap:
        """From ``[T, k]`` chosen experts and slots (``slot < 0``: dropped)."""
        tokens, k = expert.shape
        slots, choices = experts * capacity, tokens * k
        flat_slot = (expert * capacity + slot).t().reshape(-1)
        slot_of_choice = torch.where(slot.t().reshape(-1) >= 0, flat_slot, slots)
        # Dropped choices all land on the spare entry ``slots``, which is cut off.
        choice_of_slot = torch.full((slots + 1,), choices, dtype=torch.long, device=expert.device)
        choice_of_slot.scatter_(0, slot_of_choice, torch.arange(choices, device=expert.device))
        choice_of_slot = choice_of_slot[:slots]
        token_of_slot = torch.where(choice_of_slot < choices, choice_of_slot % tokens, tokens)
        return RouteMap(slot_of_choice, choice_of_slot, token_of_slot, tokens, slots)


def dispatch(tokens: torch.Tensor, routes: RouteMap) -> torch.Tensor:
    """``[T, d]`` tokens -> ``[E * C, d]`` slots (empty slots zero)."""
    return _GatherRows.apply(tokens, routes.token_of_slot, routes.slot_of_choice, routes.tokens)


def combine(slots: torch.Tensor, weight: torch.Tensor, routes: RouteMap) -> torch.Tensor:
    """``[E * C, d]`` expert results -> ``[T, d]``: each token's choices summed with ``weight``
    (``[T, k]``; dropped choices read a zero row)."""
    routed = _GatherRows.apply(slots, routes.slot_of_choice, routes.choice_of_slot, routes.slots)
    k = weight.shape[1]
    weights = weight.t().reshape(k, -1, 1).to(routed.dtype)
    return (routed.view(k, routes.tokens, -1) * weights).sum(dim=0)


class _GatherRows(torch.autograd.Function):
    """``out = pad(x)[index]``; backward: ``pad(grad)[inverse]``, its ``k = len(inverse) / rows``
    gathered rows of each source row summed (a token's ``k`` choices)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, index: torch.Tensor, inverse: torch.Tensor, rows: int):
        ctx.save_for_backward(inverse)
        ctx.rows = rows
        return _with_zero_row(x).index_select(0, index)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        (inverse,) = ctx.saved_tensors
        gathered = _with_zero_row(grad.contiguous()).index_select(0, inverse)
        if gathered.shape[0] != ctx.rows:
            gathered = gathered.view(-1, ctx.rows, gathered.shape[1]).sum(dim=0)
        return gathered, None, None, None


def _with_zero_row(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x, x.new_zeros(1, x.shape[1])])
