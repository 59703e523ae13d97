"""Rank code of test_deepspeed.py: ZeRO-2 and ZeRO-3 training on torch's gloo, then on commlayer.

Each rank trains the same small MLP (fp32, AdamW, a few steps, rank-distinct data) under
``deepspeed.init_distributed(dist_backend=...)`` for every stage and backend in turn, in one
process, and rank 0 checks that commlayer's final losses equal gloo's.
"""

from __future__ import annotations

import os

import torch

from tests.frameworks.training import MLP, STEPS, batch, same_losses

STAGES = (2, 3)


def train(stage: int) -> float:
    """A few steps of ZeRO stage ``stage``; the loss of the last step, summed over the ranks."""
    import deepspeed
    import deepspeed.comm as ds_dist

    torch.manual_seed(0)
    model = MLP()
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    rank = ds_dist.get_rank()
    for step in range(STEPS):
        inputs, targets = batch(rank, step)
        loss = engine(inputs, targets)
        engine.backward(loss)
        engine.step()
    losses = torch.tensor([loss.item()], dtype=torch.float64)
    ds_dist.all_reduce(losses)
    engine.destroy()
    return losses.item()


def run_on(dist_backend: str) -> dict[tuple[int, str], float]:
    """Every stage on one process group of ``dist_backend`` (torch's gloo is started once a process)."""
    import deepspeed
    import deepspeed.comm as ds_dist

    deepspeed.init_distributed(dist_backend=dist_backend, auto_mpi_discovery=False)
    assert torch.distributed.get_backend() == dist_backend, torch.distributed.get_backend()
    losses = {(stage, dist_backend): train(stage) for stage in STAGES}
    ds_dist.destroy_process_group()
    return losses


def main() -> None:
    os.environ.setdefault("LOCAL_RANK", os.environ.get("RANK", "0"))
    same_losses({**run_on("gloo"), **run_on("commlayer")}, reference="gloo")
