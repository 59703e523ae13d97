"""Ulysses sequence parallelism: attention over a sequence split across the ranks of ``mesh["sp"]``.

Each rank holds ``S / P`` consecutive tokens (``P`` = the "sp" size) of every head. Before the
attention the heads are scattered and the sequence gathered (one all-to-all), so each rank
attends over the *whole* sequence with ``H / P`` of the heads; after it, the reverse all-to-all
restores the sequence split. Any attention function works unchanged, causal masks included,
and backward does the same two exchanges in reverse. Example (``[batch, seq, heads, head_dim]``)::

    mesh = init_mesh((2, 2), ("dp", "sp"))
    attention = UlyssesAttention(lambda q, k, v: sdpa_bshd(q, k, v), mesh)
    tokens = shard_sequence(batch_tokens, mesh, dim=1)     # this rank's half of the sequence
    out = attention(q, k, v)                               # [b, S/P, h, d], like q

Gradients of the (replicated) weights must then be averaged over ``mesh["dp", "sp"]``, which is
what ``commlayer.zero`` does for a mesh with an "sp" dim.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from commlayer import dist
from commlayer.core.errors import invalid_argument
from commlayer.mesh import Mesh
from commlayer.parallel.checks import mesh_dim_group, require_divisible
from commlayer.parallel.exchange import exchange

__all__ = ["UlyssesAttention", "sequence_offset", "shard_sequence"]


class UlyssesAttention(nn.Module):
    """Wrap ``attention(q, k, v, *args, **kwargs)`` to run over the sequence-parallel group.

    Args:
        attention: the local attention; it receives the whole sequence and ``heads / P`` heads,
            in the layout of its inputs.
        mesh: a device mesh with a ``dim`` dimension (default "sp").
        seq_dim: the sequence dim of q, k, v and of the output (default 1: ``[b, s, h, d]``).
        head_dim: the heads dim (default 2). Head counts must be divisible by the "sp" size.
    """

    def __init__(
        self,
        attention: Callable[..., torch.Tensor],
        mesh: Mesh,
        *,
        dim: str = "sp",
        seq_dim: int = 1,
        head_dim: int = 2,
    ) -> None:
        super().__init__()
        rank = dist.get_rank()
        self.group = mesh_dim_group("UlyssesAttention", mesh, dim, rank)
        if seq_dim < 0 or head_dim < 0 or seq_dim == head_dim:
            expected = f"two different non-negative dims (seq_dim={seq_dim})"
            raise invalid_argument("UlyssesAttention", "head_dim", expected, head_dim, rank)
        self.attention, self.seq_dim, self.head_dim = attention, seq_dim, head_dim

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any):
        self._check(query, key, value)
        q, k, v = exchange(self.group, (query, key, value), self.head_dim, self.seq_dim)
        out = self.attention(q, k, v, *args, **kwargs)
        if not isinstance(out, torch.Tensor):
            raise TypeError(
                f"UlyssesAttention: the attention function must return one tensor, received {type(out).__name__}"
            )
        return exchange(self.group, (out,), self.seq_dim, self.head_dim)[0]

    def _check(self, *tensors: torch.Tensor) -> None:
        size, rank = self.group.size(), dist.get_rank()
        for name, tensor in zip(("query", "key", "value"), tensors):
            if not isinstance(tensor, torch.Tensor) or tensor.dim() <= max(self.seq_dim, self.head_dim):
                got = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
                expected = f"a tensor with dims seq_dim={self.seq_dim} and head_dim={self.head_dim}"
                raise invalid_argument("UlyssesAttention", name, expected, got, rank)
            heads = tensor.shape[self.head_dim]
            require_divisible(
                "UlyssesAttention", f"{name} (heads, dim {self.head_dim})", heads, size, "the sp size", rank
            )
        lengths = [t.shape[self.seq_dim] for t in tensors]
        if len(set(lengths)) != 1:
            expected = "query, key and value of one local sequence length"
            raise invalid_argument("UlyssesAttention", "key", expected, lengths, rank)


def shard_sequence(tensor: torch.Tensor, mesh: Mesh, dim: int = 1, mesh_dim: str = "sp") -> torch.Tensor:
    """This rank's consecutive ``1 / P`` of ``tensor`` along ``dim`` (``P`` = the ``mesh_dim`` size).

    Raises before any communication when the length is not divisible by ``P``.
    """
    rank = dist.get_rank()
    group = mesh_dim_group("shard_sequence", mesh, mesh_dim, rank)
    size = group.size()
    require_divisible(
        "shard_sequence", f"tensor (sequence dim {dim})", tensor.shape[dim], size, "the sp size", rank
    )
    return tensor.chunk(size, dim=dim)[group.rank()]


def sequence_offset(local_length: int, mesh: Mesh, mesh_dim: str = "sp") -> int:
    """Position of this rank's first token in the whole sequence (for position embeddings)."""
    group = mesh_dim_group("sequence_offset", mesh, mesh_dim, dist.get_rank())
    return group.rank() * local_length
