"""What every framework test trains: a small MLP on rank-distinct data, and the loss check."""

from __future__ import annotations

from collections.abc import Mapping

import torch

STEPS = 4
WIDTH = 32


class MLP(torch.nn.Module):
    """Two layers and a mean-squared loss; ``forward(inputs, targets)`` returns the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.ReLU(), torch.nn.Linear(4 * WIDTH, 1)
        )

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(self.layers(inputs), targets)


def batch(rank: int, step: int, size: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s inputs and targets at ``step``: distinct on every rank and step."""
    generator = torch.Generator().manual_seed(1000 * rank + step)
    inputs = torch.randn(size, WIDTH, generator=generator)
    return inputs, inputs.sum(dim=1, keepdim=True).sin()


def same_losses(losses: Mapping[tuple[object, str], float], reference: str) -> None:
    """Every run's loss equals the ``reference`` backend's run of the same configuration."""
    for (configuration, backend), loss in losses.items():
        expected = losses[configuration, reference]
        assert loss == expected, f"{configuration} on {backend}: loss {loss!r}, on {reference} {expected!r}"
