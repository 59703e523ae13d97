"""Driver of test_ray.py: Ray Train's TorchTrainer, 2 CPU workers, on gloo and then on commlayer.

One local Ray cluster serves both runs; each worker trains the shared MLP under Ray's DDP
(``prepare_model``), and the driver prints one JSON line with each backend's final loss and process group.
"""

from __future__ import annotations

import json
import sys

import torch

from tests.frameworks.training import MLP, STEPS, batch


def train_loop(config: dict[str, object]) -> None:
    import ray.train
    import ray.train.torch

    torch.manual_seed(0)
    model = ray.train.torch.prepare_model(MLP())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rank = ray.train.get_context().get_world_rank()
    for step in range(STEPS):
        loss = model(*batch(rank, step))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    total = loss.detach().double()
    torch.distributed.all_reduce(total)
    if rank == 0:  # Ray Train keeps no metrics of a report without a checkpoint: a file carries them
        with open(str(config["out"]), "w") as file:
            json.dump({"loss": total.item(), "backend": torch.distributed.get_backend()}, file)


def fit(backend: str, storage: str) -> dict[str, object]:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    out = f"{storage}/{backend}.json"
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"out": out},
        torch_config=TorchConfig(backend=backend),
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(storage_path=storage, name=backend),
    )
    trainer.fit()
    with open(out) as file:
        return json.load(file)


def main(storage: str) -> None:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"COMMLAYER_BACKEND": "shm"}})
    try:
        results = {backend: fit(backend, storage) for backend in ("gloo", "commlayer")}
    finally:
        ray.shutdown()
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1])
