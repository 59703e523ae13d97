"""Ulysses sequence parallelism: each rank holds a slice of the sequence, attention sees all of it.

``UlyssesAttention`` wraps any attention function; one all-to-all trades sequence for heads on the
way in and one on the way out. The check: the sharded attention equals the unsharded one, slice
for slice.

Run: commlayer run -n 4 examples/ulysses_attention.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from commlayer import dist
from commlayer.mesh import init_mesh
from commlayer.parallel import UlyssesAttention, shard_sequence


def my_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention on [batch, seq, heads, head_dim]."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    )
    return out.transpose(1, 2)


dist.init_process_group()
torch.manual_seed(0)  # every rank draws the same full sequence
full_q, full_k, full_v = (torch.randn(2, 16, 4, 8) for _ in range(3))  # [batch, seq, heads, head_dim]

mesh = init_mesh((2, 2), ("dp", "sp"))
attention = UlyssesAttention(my_attention, mesh)  # q, k, v: [batch, seq/sp, heads, head_dim]
q, k, v = (shard_sequence(t, mesh, dim=1) for t in (full_q, full_k, full_v))  # this rank's slice
out = attention(q, k, v)  # one all-to-all in, one out

expected = shard_sequence(my_attention(full_q, full_k, full_v), mesh, dim=1)
torch.testing.assert_close(out, expected)
print(f"rank {dist.get_rank()}: attention over {tuple(q.shape)} slices matches the whole sequence's")
dist.destroy_process_group()
