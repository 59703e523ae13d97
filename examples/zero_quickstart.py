"""ZeRO stage 2 on a small regression model: DeepSpeed's configuration keys, commlayer's groups.

Each rank feeds its own micro-batches; gradients are accumulated over four of them, reduced and
sharded, and the optimizer steps at the accumulation boundary. The loss falls, and the checkpoint
is written as per-rank shards.

Run: commlayer run -n 2 examples/zero_quickstart.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from torch import nn

from commlayer import dist, zero

CKPT = Path(tempfile.gettempdir()) / "commlayer-example-zero"  # one folder every rank writes into

dist.init_process_group()
torch.manual_seed(0)  # the same initial model on every rank
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
target = nn.Linear(16, 1)
generator = torch.Generator().manual_seed(dist.get_rank())  # each rank its own data
inputs = [torch.randn(8, 16, generator=generator) for _ in range(32)]
loader = [(x, target(x).detach()) for x in inputs]
loss_of = nn.MSELoss()

engine = zero.initialize(
    model=model,
    optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2),
    config={
        "train_batch_size": 64,
        "train_micro_batch_size_per_gpu": 8,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 2},
    },
)
losses = []
for x, y in loader:
    loss = loss_of(engine(x).float(), y)
    engine.backward(loss)
    engine.step()  # every micro-step; the optimizer steps at the accumulation boundary
    losses.append(loss.item())
engine.save_checkpoint(CKPT)  # per-rank shards, written atomically; load at any world size

assert sum(losses[-4:]) < sum(losses[:4]), losses
print(f"rank {dist.get_rank()}: loss {losses[0]:.4f} -> {losses[-1]:.4f}")
dist.destroy_process_group()
