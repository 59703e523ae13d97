"""Shared pieces of the ZeRO rank bodies: a small transformer, its data, and a reference run.

The reference is plain single-process training of the same model on the *global* batch, with
torch's own gradient clipping: what every ZeRO stage must reproduce.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, WIDTH, HEADS, LAYERS, SEQ = 48, 32, 4, 2, 12


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (
            z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
            for z in self.qkv(self.ln1(x)).split(d, dim=2)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    """A GPT with a tied output head (the tied weight joins stage 3's root unit)."""

    def __init__(self, tied: bool = True) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, WIDTH), nn.Embedding(SEQ, WIDTH)
        self.blocks = nn.ModuleList(Block(WIDTH, HEADS) for _ in range(LAYERS))
        self.ln = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        nn.init.normal_(self.tok.weight, std=0.1)
        if tied:
            self.head.weight = self.tok.weight
        self.register_buffer("temperature", torch.tensor(1.0))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x)) / self.temperature
        return F.cross_entropy(logits.float().reshape(-1, VOCAB), targets.reshape(-1))


@dataclass(frozen=True)
class Recipe:
    """One training run: the global batch per micro-step is ``global_micro`` samples."""

    steps: int = 10
    accumulation: int = 2
    global_micro: int = 8
    lr: float = 1e-2
    clip: float = 0.5
    tied: bool = True

    def micro_batch(self, world: int) -> int:
        return self.global_micro // world


def make_model(recipe: Recipe, seed: int = 1234) -> TinyGPT:
    torch.manual_seed(seed)
    return TinyGPT(recipe.tied)


def make_optimizer(model: nn.Module, recipe: Recipe) -> torch.optim.Optimizer:
    """AdamW with two param groups (no weight decay on biases and norms), like real recipes."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=recipe.lr, betas=(0.9, 0.95), eps=1e-5)


def global_batch(step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    """64 learnable sequences (each token determines the next), distinct per step and micro-step."""
    generator = torch.Generator().manual_seed(10_000 + 100 * step + micro)
    tokens = [torch.randint(0, VOCAB, (64,), generator=generator)]
    for _ in range(SEQ):
        tokens.append((5 * tokens[-1] + 3) % VOCAB)
    sequences = torch.stack(tokens, dim=1)
    return sequences[:, :-1], sequences[:, 1:]


def rank_batch(
    recipe: Recipe, step: int, micro: int, rank: int, world: int
) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = global_batch(step, micro)
    size = recipe.micro_batch(world)
    return x[rank * size : (rank + 1) * size], y[rank * size : (rank + 1) * size]


def reference_run(
    recipe: Recipe, first_step: int = 0, model: nn.Module | None = None
) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Single-process training on the global batch; returns the final weights and step losses."""
    model = model or make_model(recipe)
    optimizer = make_optimizer(model, recipe)
    losses = []
    for step in range(first_step, recipe.steps):
        total = 0.0
        for micro in range(recipe.accumulation):
            x, y = global_batch(step, micro)
            loss = model(x[: recipe.global_micro], y[: recipe.global_micro])
            (loss / recipe.accumulation).backward()
            total += loss.item() / recipe.accumulation
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.clip)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, losses


def train(engine: Any, recipe: Recipe, rank: int, world: int, steps: range) -> list[float]:
    """Run ``steps`` of the engine; returns each step's loss averaged over the data-parallel ranks."""
    from commlayer import dist

    losses = []
    for step in steps:
        total = torch.zeros(1, dtype=torch.float64)
        for micro in range(recipe.accumulation):
            loss = engine(*rank_batch(recipe, step, micro, rank, world))
            engine.backward(loss)
            engine.step()
            total += loss.detach().double().cpu() / recipe.accumulation
        dist.all_reduce(total)
        losses.append(total.item() / world)
    return losses


def max_difference(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor]) -> tuple[float, str]:
    assert left.keys() == right.keys(), (sorted(left), sorted(right))
    worst = max(left, key=lambda key: (left[key].float() - right[key].float()).abs().max().item())
    return (left[worst].float() - right[worst].float()).abs().max().item(), worst
