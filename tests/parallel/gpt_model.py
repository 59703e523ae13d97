"""The GPT of examples/gpt_parallel.py (Ulysses attention, MoE feed-forward), its data and reference.

The same class builds the distributed model (given a mesh) and the single-process reference
(mesh None): only the communication differs, so both must train to the same weights.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import torch
from torch import nn

from commlayer.mesh import Mesh


def _load_example() -> ModuleType:
    """examples/gpt_parallel.py, whose GPT these checks train (so the example is the tested model)."""
    path = Path(__file__).resolve().parents[2] / "examples" / "gpt_parallel.py"
    spec = importlib.util.spec_from_file_location("gpt_parallel_example", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_EXAMPLE = _load_example()
VOCAB, WIDTH, SEQ, EXPERTS = _EXAMPLE.VOCAB, _EXAMPLE.WIDTH, _EXAMPLE.SEQ, 4
causal_attention = _EXAMPLE.attention


def make_model(
    seed: int = 7, mesh: Mesh | None = None, *, sequence_parallel: bool = False, experts: int = 0
) -> nn.Module:
    """The example's GPT: Ulysses attention with ``sequence_parallel``, MoE layers with ``experts``."""
    torch.manual_seed(seed)
    return _EXAMPLE.GPT(mesh, sequence_parallel, experts)


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
