"""A training script that resumes: under ``commlayer run --max-restarts``, a failed start is redone
from the newest checkpoint.

Rank 1 dies once, after the checkpoint of step 3; the launcher restarts every rank, which load
that checkpoint and go on from step 3. ZeRO's checkpoints are written atomically, so a rank dying
mid-save leaves the previous one loadable.

Run: commlayer run -n 2 --max-restarts 1 examples/resume_training.py
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch
from torch import nn

from commlayer import dist, zero

CKPT, STEPS = Path(tempfile.gettempdir()) / "commlayer-example-resume", 6


def batch(step: int) -> torch.Tensor:
    return torch.randn(8, 16, generator=torch.Generator().manual_seed(step * 10 + dist.get_rank()))


def crash_once(step: int) -> None:
    """Rank 1's one failure, after step 3's checkpoint (a marker file makes it once)."""
    marker = CKPT / "crashed-once"
    if step == 3 and dist.get_rank() == 1 and not marker.exists():
        marker.touch()
        os._exit(1)


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
config = {"train_batch_size": 16, "zero_optimization": {"stage": 1}}

dist.init_process_group("gloo")
engine = zero.initialize(model=model, optimizer=optimizer, config=config)
if (Path(CKPT) / "latest").exists():
    engine.load_checkpoint(CKPT)  # the newest intact checkpoint
start = engine.global_steps
for step in range(engine.global_steps, STEPS):
    engine.backward(engine(batch(step)).sum())
    engine.step()
    engine.save_checkpoint(CKPT, tag=f"step{step + 1}")
    crash_once(step + 1)

print(f"rank {dist.get_rank()}: steps {start} to {engine.global_steps}")
assert engine.global_steps == STEPS
dist.barrier()
if dist.get_rank() == 0:  # finished: the next run starts afresh
    shutil.rmtree(CKPT)
dist.destroy_process_group()
