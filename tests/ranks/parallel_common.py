"""A tiny GPT whose attention and feed-forward can be Ulysses and MoE, and its reference data.

The same class builds the distributed model (given a mesh) and the single-process reference
(mesh None): only the communication differs, so both must train to the same weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from commlayer.mesh import Mesh
from commlayer.parallel import GateOptions, MoE, UlyssesAttention, sequence_offset

VOCAB, WIDTH, HEADS, LAYERS, SEQ, EXPERTS = 40, 32, 4, 2, 16, 4


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal SDPA on ``[batch, seq, heads, head_dim]``."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    )
    return out.transpose(1, 2)


class Block(nn.Module):
    def __init__(self, mesh: Mesh | None, sequence_parallel: bool, experts: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.attention = UlyssesAttention(causal_attention, mesh) if sequence_parallel else causal_attention
        expert = nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(), nn.Linear(2 * WIDTH, WIDTH))
        self.moe = (
            MoE(WIDTH, expert, experts, mesh, options=GateOptions(k=2, capacity_factor=1.0))
            if experts
            else None
        )
        self.mlp = expert if not experts else None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, WIDTH // HEADS).unbind(2)
        x = x + self.proj(self.attention(q, k, v).reshape(b, t, WIDTH))
        if self.moe is None:
            return x + self.mlp(self.ln2(x)), x.new_zeros(())
        out, aux, _ = self.moe(self.ln2(x))
        return x + out, aux


class ParallelGPT(nn.Module):
    """``sequence_parallel``: inputs are this rank's slice of the sequence (Ulysses over "sp");
    ``experts``: MoE feed-forward layers with that many experts (expert parallel over "ep")."""

    def __init__(
        self, mesh: Mesh | None = None, *, sequence_parallel: bool = False, experts: int = 0
    ) -> None:
        super().__init__()
        self.mesh, self.sequence_parallel = mesh, sequence_parallel
        self.tok, self.pos = nn.Embedding(VOCAB, WIDTH), nn.Embedding(SEQ, WIDTH)
        self.blocks = nn.ModuleList(Block(mesh, sequence_parallel, experts) for _ in range(LAYERS))
        self.ln, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        length = idx.shape[1]
        start = sequence_offset(length, self.mesh) if self.sequence_parallel and self.mesh else 0
        x = self.tok(idx) + self.pos(torch.arange(start, start + length))
        aux_total = x.new_zeros(())
        for block in self.blocks:
            x, aux = block(x)
            aux_total = aux_total + aux
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.float().reshape(-1, VOCAB), targets.reshape(-1)) + 0.01 * aux_total


def make_model(seed: int = 7, mesh: Mesh | None = None, **kind: object) -> ParallelGPT:
    torch.manual_seed(seed)
    return ParallelGPT(mesh, **kind)  # type: ignore[arg-type]


def global_batch(step: int, sequences: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Learnable sequences (each token determines the next), distinct per step."""
    generator = torch.Generator().manual_seed(500 + step)
    tokens = [torch.randint(0, VOCAB, (sequences,), generator=generator)]
    for _ in range(SEQ):
        tokens.append((7 * tokens[-1] + 2) % VOCAB)
    whole = torch.stack(tokens, dim=1)
    return whole[:, :-1], whole[:, 1:]


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), eps=1e-5, weight_decay=0.1)


def reference_weights(steps: int, sequences: int = 8, clip: float = 0.5) -> dict[str, torch.Tensor]:
    """Single-process training on the global batch (the dense model)."""
    model = make_model()
    optimizer = make_optimizer(model)
    for step in range(steps):
        model(*global_batch(step, sequences)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def max_difference(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor]) -> tuple[float, str]:
    assert left.keys() == right.keys(), (sorted(left), sorted(right))
    worst = max(left, key=lambda key: (left[key].float() - right[key].float()).abs().max().item())
    return (left[worst].float() - right[worst].float()).abs().max().item(), worst
