"""Ray Train on commlayer: one line, the backend's name in ``TorchConfig``.

Run: python examples/frameworks/ray_train.py

Ray starts the workers and commlayer picks the backend in each (shm on a CPU host). Workers on
other nodes see the driver's ``COMMLAYER_*`` variables only through Ray's ``runtime_env``.
"""

import ray
import ray.train
import ray.train.torch
import torch
from ray.train import ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer


def train_loop() -> None:
    torch.manual_seed(0)
    model = ray.train.torch.prepare_model(
        torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rank = ray.train.get_context().get_world_rank()
    data = torch.Generator().manual_seed(rank)
    for _ in range(4):
        inputs = torch.randn(4, 32, generator=data)
        loss = torch.nn.functional.mse_loss(model(inputs), inputs.sum(dim=1, keepdim=True).sin())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if rank == 0:
        print(f"process group: {torch.distributed.get_backend()}; loss {loss.item()!r}", flush=True)


def main() -> None:
    ray.init(num_cpus=2, include_dashboard=False)
    trainer = TorchTrainer(
        train_loop,
        torch_config=TorchConfig(backend="commlayer"),
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
    )
    trainer.fit()
    ray.shutdown()


if __name__ == "__main__":
    main()
