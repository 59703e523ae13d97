"""Parallel layers on top of :mod:`commlayer.mesh` and :mod:`commlayer.dist`: they run on every backend.

- :class:`UlyssesAttention`: sequence parallelism over ``mesh["sp"]`` (all-to-all heads <-> sequence);
- :class:`MoE`: top-k gated mixture of experts, expert parallel over ``mesh["ep"]``;
- :func:`all_reduce_residual_rms_norm`: a tensor-parallel all-reduce fused with the residual add
  and RMSNorm after it, and :class:`TensorParallelBlock`, a Llama-style block built on it.
"""

from __future__ import annotations

from commlayer.parallel.fused_norm import all_reduce_residual_rms_norm
from commlayer.parallel.gating import GateOptions, Routing, capacity_for, route
from commlayer.parallel.moe import MoE, is_expert_parameter, reduce_gradients
from commlayer.parallel.tensor_parallel import TensorParallelBlock, attention_over_itself
from commlayer.parallel.ulysses import UlyssesAttention, sequence_offset, shard_sequence

__all__ = [
    "GateOptions",
    "MoE",
    "Routing",
    "TensorParallelBlock",
    "UlyssesAttention",
    "all_reduce_residual_rms_norm",
    "attention_over_itself",
    "capacity_for",
    "is_expert_parameter",
    "reduce_gradients",
    "route",
    "sequence_offset",
    "shard_sequence",
]
