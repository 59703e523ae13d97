"""A Llama-style decoder block, tensor-parallel, whose all-reduces are fused with the norms after them.

Attention's q/k/v and the MLP's gate/up projections are split by columns (heads and intermediate
units) across the group, the output and down projections by rows, so each block needs two
all-reduces. Each runs as :func:`~commlayer.parallel.fused_norm.all_reduce_residual_rms_norm`
together with the residual add and the RMSNorm that follow it. A block therefore hands the next one
its *un-reduced* MLP output and the residual, and the next block's input norm finishes the sum::

    partial, residual = None, embeddings
    for block in blocks:
        partial, residual = block(partial, residual)
    hidden, _ = all_reduce_residual_rms_norm(partial, residual, final_norm_weight, group=group)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from commlayer import dist
from commlayer.dist import ProcessGroup
from commlayer.parallel.checks import require_divisible
from commlayer.parallel.fused_norm import all_reduce_residual_rms_norm

__all__ = ["TensorParallelBlock", "attention_over_itself"]

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def attention_over_itself(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Each token attends to itself alone (a sequence of one, as in decode without a cache): the
    softmax over one key is 1, so each query head gets its key/value group's value.

    ``q``: ``[tokens, heads, head_dim]``; ``k``, ``v``: ``[tokens, kv_heads, head_dim]``.
    Returns ``[tokens, heads * head_dim]``.
    """
    groups = q.shape[1] // v.shape[1]
    return v.repeat_interleave(groups, dim=1).flatten(1)


class TensorParallelBlock(nn.Module):
    """One decoder block (attention + SwiGLU MLP, pre-norm), split over ``group``.

    Args:
        hidden_size: the model width.
        intermediate_size: the MLP's width (all ranks together).
        num_heads: query heads (all ranks together); ``hidden_size / num_heads`` is the head dim.
        num_kv_heads: key/value heads (grouped-query attention).
        group: the tensor-parallel group (default: the world).
        attention: ``(q, k, v) -> [tokens, local heads * head_dim]`` on the rank's heads;
            default :func:`attention_over_itself`.
        eps: the norms' epsilon.

    ``forward(partial, residual)`` takes the previous block's un-reduced output (None for the
    first block) and the residual ``[tokens, hidden]``; returns this block's un-reduced output
    and the new residual.
    """

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        num_heads: int,
        num_kv_heads: int,
        group: ProcessGroup | None = None,
        *,
        attention: Attention | None = None,
        eps: float = 1e-6,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.group = group
        rank = dist.get_rank() if dist.is_initialized() else 0
        tp = 1 if not dist.is_initialized() else (group or dist.group.WORLD).size()
        require_divisible("TensorParallelBlock", "hidden_size", hidden_size, num_heads, "num_heads", rank)
        for name, size in (("num_heads", num_heads), ("num_kv_heads", num_kv_heads)):
            require_divisible("TensorParallelBlock", name, size, tp, "the group size", rank)
        require_divisible(
            "TensorParallelBlock", "intermediate_size", intermediate_size, tp, "the group size", rank
        )
        self.head_dim = hidden_size // num_heads
        self.heads, self.kv_heads = num_heads // tp, num_kv_heads // tp
        self.eps = eps
        self.attention = attention or attention_over_itself
        make = {"device": device, "dtype": dtype}
        width = (self.heads + 2 * self.kv_heads) * self.head_dim
        self.qkv = nn.Linear(hidden_size, width, bias=False, **make)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden_size, bias=False, **make)
        self.gate_up = nn.Linear(hidden_size, 2 * (intermediate_size // tp), bias=False, **make)
        self.down = nn.Linear(intermediate_size // tp, hidden_size, bias=False, **make)
        self.input_norm = nn.Parameter(torch.ones(hidden_size, **make))
        self.post_attention_norm = nn.Parameter(torch.ones(hidden_size, **make))

    def forward(
        self, partial: torch.Tensor | None, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if partial is None:
            hidden = F.rms_norm(residual, (residual.shape[-1],), self.input_norm, self.eps)
        else:
            hidden, residual = all_reduce_residual_rms_norm(
                partial, residual, self.input_norm, self.eps, self.group
            )
        q, k, v = self.qkv(hidden).split(
            [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], dim=-1
        )
        tokens = hidden.shape[0]
        heads = self.attention(
            q.view(tokens, self.heads, self.head_dim),
            k.view(tokens, self.kv_heads, self.head_dim),
            v.view(tokens, self.kv_heads, self.head_dim),
        )
        hidden, residual = all_reduce_residual_rms_norm(
            self.o_proj(heads), residual, self.post_attention_norm, self.eps, self.group
        )
        gate, up = self.gate_up(hidden).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up), residual
