"""Rank code of tests/parallel/test_tensor_parallel.py (gloo, CPU: the fused op's fallback path).

- all_reduce_residual_rms_norm equals rms_norm(residual + the sum of every rank's partial), with
  every element distinct per rank and position;
- two TensorParallelBlocks split over the world, then the final norm, equal the same blocks run
  whole in one process (float64);
- bad arguments raise before any communication, naming the argument and the rank.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from commlayer import dist
from commlayer.core.errors import InvalidArgumentError, InvalidTypeError
from commlayer.parallel import TensorParallelBlock, all_reduce_residual_rms_norm

HIDDEN, INTER, HEADS, KV = 64, 96, 8, 4
TOLERANCE = 1e-10


def fused_fallback(rank: int, world: int) -> None:
    rows = 5
    partials = [
        torch.arange(rows * HIDDEN, dtype=torch.float64).view(rows, HIDDEN) / 7 + 100 * r
        for r in range(world)
    ]
    residual = torch.linspace(-3, 3, rows * HIDDEN, dtype=torch.float64).view(rows, HIDDEN)
    weight = torch.linspace(0.5, 1.5, HIDDEN, dtype=torch.float64)
    normed, residual_out = all_reduce_residual_rms_norm(partials[rank].clone(), residual, weight, 1e-6)
    want_residual = residual + sum(partials)
    assert torch.allclose(residual_out, want_residual, rtol=TOLERANCE, atol=0)
    assert torch.allclose(normed, F.rms_norm(want_residual, (HIDDEN,), weight, 1e-6), rtol=TOLERANCE, atol=0)


def _full_weights() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    head_dim = HIDDEN // HEADS

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64) / shape[-1] ** 0.5

    return {
        "q": draw(HEADS * head_dim, HIDDEN),
        "k": draw(KV * head_dim, HIDDEN),
        "v": draw(KV * head_dim, HIDDEN),
        "o": draw(HIDDEN, HEADS * head_dim),
        "gate": draw(INTER, HIDDEN),
        "up": draw(INTER, HIDDEN),
        "down": draw(HIDDEN, INTER),
        "input_norm": torch.linspace(0.8, 1.2, HIDDEN, dtype=torch.float64),
        "post_attention_norm": torch.linspace(1.1, 0.9, HIDDEN, dtype=torch.float64),
    }


def _load_shard(block: TensorParallelBlock, full: dict[str, torch.Tensor], rank: int, world: int) -> None:
    def rows(name: str) -> torch.Tensor:
        size = full[name].shape[0] // world
        return full[name][rank * size : (rank + 1) * size]

    with torch.no_grad():
        block.qkv.weight.copy_(torch.cat([rows("q"), rows("k"), rows("v")]))
        size = full["o"].shape[1] // world
        block.o_proj.weight.copy_(full["o"][:, rank * size : (rank + 1) * size])
        block.gate_up.weight.copy_(torch.cat([rows("gate"), rows("up")]))
        size = full["down"].shape[1] // world
        block.down.weight.copy_(full["down"][:, rank * size : (rank + 1) * size])
        block.input_norm.copy_(full["input_norm"])
        block.post_attention_norm.copy_(full["post_attention_norm"])


def _whole_block(x: torch.Tensor, full: dict[str, torch.Tensor]) -> torch.Tensor:
    """One block in one process: pre-norm attention over each token alone, then the MLP."""
    head_dim = HIDDEN // HEADS
    hidden = F.rms_norm(x, (HIDDEN,), full["input_norm"], 1e-6)
    v = (hidden @ full["v"].T).view(-1, KV, head_dim).repeat_interleave(HEADS // KV, dim=1).flatten(1)
    x = x + v @ full["o"].T
    hidden = F.rms_norm(x, (HIDDEN,), full["post_attention_norm"], 1e-6)
    return x + (F.silu(hidden @ full["gate"].T) * (hidden @ full["up"].T)) @ full["down"].T


def blocks_match_one_process(rank: int, world: int) -> None:
    full = _full_weights()
    blocks = [TensorParallelBlock(HIDDEN, INTER, HEADS, KV, dtype=torch.float64) for _ in range(2)]
    for block in blocks:
        _load_shard(block, full, rank, world)
    x = torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    final_norm = torch.ones(HIDDEN, dtype=torch.float64)
    with torch.no_grad():
        partial, residual = None, x
        for block in blocks:
            partial, residual = block(partial, residual)
        normed, residual = all_reduce_residual_rms_norm(partial, residual, final_norm)
    want = _whole_block(_whole_block(x, full), full)
    assert torch.allclose(residual, want, rtol=1e-9, atol=1e-12)
    assert torch.allclose(normed, F.rms_norm(want, (HIDDEN,), final_norm, 1e-6), rtol=1e-9, atol=1e-12)


def bad_arguments(rank: int, world: int) -> None:
    x = torch.zeros(2, HIDDEN)
    with pytest.raises(InvalidArgumentError, match=f"argument 'residual' expected .*\\(rank {rank}\\)"):
        all_reduce_residual_rms_norm(x, torch.zeros(2, HIDDEN + 1), torch.ones(HIDDEN))
    with pytest.raises(InvalidArgumentError, match="argument 'weight' expected shape"):
        all_reduce_residual_rms_norm(x, x, torch.ones(HIDDEN + 1))
    with pytest.raises(InvalidArgumentError, match="argument 'residual' expected dtype torch.float32"):
        all_reduce_residual_rms_norm(x, x.double(), torch.ones(HIDDEN))
    with pytest.raises(InvalidTypeError, match="argument 'partial' expected a torch.Tensor"):
        all_reduce_residual_rms_norm([1.0], x, torch.ones(HIDDEN))
    with pytest.raises(InvalidArgumentError, match="argument 'num_kv_heads' expected a size divisible by"):
        TensorParallelBlock(HIDDEN, INTER, HEADS, 3)  # 3 kv heads over 2 ranks
    dist.barrier()  # every rank got here without a collective in between


def main() -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    fused_fallback(rank, world)
    blocks_match_one_process(rank, world)
    bad_arguments(rank, world)
