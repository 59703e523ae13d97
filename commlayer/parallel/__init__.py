"""Parallel layers on top of :mod:`commlayer.mesh` and :mod:`commlayer.dist`: they run on every backend.

- :class:`UlyssesAttention`: sequence parallelism over ``mesh["sp"]`` (all-to-all heads <-> sequence);
- :class:`MoE`: top-k gated mixture of experts, expert parallel over ``mesh["ep"]``.
"""

from __future__ import annotations

from commlayer.parallel.gating import GateOptions, Routing, capacity_for, route
from commlayer.parallel.moe import MoE, is_expert_parameter, reduce_gradients
from commlayer.parallel.ulysses import UlyssesAttention, sequence_offset, shard_sequence

__all__ = [
    "GateOptions",
    "MoE",
    "Routing",
    "UlyssesAttention",
    "capacity_for",
    "is_expert_parameter",
    "reduce_gradients",
    "route",
    "sequence_offset",
    "shard_sequence",
]
