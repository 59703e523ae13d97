"""A rank program for tests/launch/test_restarts.py: ZeRO training that resumes from its checkpoint.

    python restarts_ranks.py CHECKPOINT_DIR STEPS FAIL_AFTER_STEP

Every rank trains a tiny linear model for STEPS steps under a ZeRO stage-1 engine on gloo,
writing a checkpoint with commlayer's checkpoint code after every step and resuming from the
newest one at start. On the first start (``TORCHELASTIC_RESTART_COUNT=0``) rank 1 dies right
after the checkpoint of step FAIL_AFTER_STEP. Weights, inputs and learning rate are small powers
of two, so the resumed run's final weights must equal, bit for bit, plain SGD on the averaged
gradients of every step computed here without interruption.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from commlayer import dist, zero

FEATURES = 3
LEARNING_RATE = 0.5


def main() -> int:
    folder, steps, fail_after = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1}}
    engine = zero.initialize(model=model, optimizer=optimizer, config=config)
    if (folder / "latest").exists():
        engine.load_checkpoint(str(folder))
    first = engine.global_steps
    print(
        f"start {restart} of {os.environ['TORCHELASTIC_MAX_RESTARTS']}: rank {rank} port "
        f"{os.environ['MASTER_PORT']} job {os.environ['COMMLAYER_JOB_ID']} resumes at step {first}",
        flush=True,
    )
    for step in range(first, steps):
        loss = engine(_batch(step, rank)).sum()
        engine.backward(loss)
        engine.step()
        engine.save_checkpoint(str(folder), tag=f"step{step + 1}")
        if restart == 0 and rank == 1 and step + 1 == fail_after:
            print(f"rank {rank} dies after the checkpoint of step {step + 1}", flush=True)
            os._exit(3)
    expected = _uninterrupted(steps, world)
    trained = engine.full_state_dict()
    mismatched = [name for name, value in expected.items() if not torch.equal(trained[name], value)]
    if mismatched:
        raise AssertionError(f"rank {rank}: {mismatched} differ: {trained} != {expected}")
    print(f"rank {rank} finished {steps} steps with the uninterrupted weights", flush=True)
    dist.destroy_process_group()
    return 0


def _model() -> torch.nn.Linear:
    model = torch.nn.Linear(FEATURES, 2)
    with torch.no_grad():
        model.weight.copy_(torch.arange(2 * FEATURES, dtype=torch.float32).reshape(2, FEATURES) / 4)
        model.bias.copy_(torch.tensor([1.0, -1.0]))
    return model


def _batch(step: int, rank: int) -> torch.Tensor:
    """A distinct batch for every (step, rank): small integers, so every sum is exact."""
    return torch.arange(FEATURES, dtype=torch.float32).unsqueeze(0) + 10 * step + rank


def _uninterrupted(steps: int, world: int) -> dict[str, torch.Tensor]:
    model = _model()
    for step in range(steps):
        model.zero_grad()
        for rank in range(world):
            (model(_batch(step, rank)).sum() / world).backward()
        with torch.no_grad():
            for parameter in model.parameters():
                parameter -= LEARNING_RATE * parameter.grad
    return {name: value.detach() for name, value in model.state_dict().items()}


if __name__ == "__main__":
    raise SystemExit(main())
