"""Rank code of test_lightning.py: Lightning's DDPStrategy on a given process-group backend.

Lightning starts its own process group from the environment it finds (``commlayer run``,
torchrun and mpirun set it), with ``DDPStrategy(process_group_backend=...)``.
"""

from __future__ import annotations

import json
import os
import sys

import torch

from tests.frameworks.training import MLP, STEPS, batch


class Regression:
    """Builds the LightningModule lazily, so this file imports without Lightning."""

    @staticmethod
    def module() -> object:
        import lightning

        class Module(lightning.LightningModule):
            def __init__(self) -> None:
                super().__init__()
                torch.manual_seed(0)
                self.model = MLP()

            def training_step(self, pair: list[torch.Tensor], index: int) -> torch.Tensor:
                loss = self.model(*pair)
                self.last_loss = loss.detach()
                return loss

            def configure_optimizers(self) -> torch.optim.Optimizer:
                return torch.optim.AdamW(self.parameters(), lr=1e-2)

        return Module()


def train(process_group_backend: str, out: str) -> None:
    import lightning
    from lightning.pytorch.strategies import DDPStrategy

    rank = int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    pairs = [batch(rank, step) for step in range(STEPS)]
    samples = torch.utils.data.TensorDataset(*(torch.cat(parts) for parts in zip(*pairs)))
    data = torch.utils.data.DataLoader(samples, batch_size=len(pairs[0][0]))
    module = Regression.module()
    trainer = lightning.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(process_group_backend=process_group_backend),
        max_steps=STEPS,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
        use_distributed_sampler=False,
    )
    trainer.fit(module, train_dataloaders=data)
    total = module.last_loss.double()
    torch.distributed.all_reduce(total)
    if trainer.global_rank == 0:
        with open(out, "w") as file:
            json.dump({"backend": torch.distributed.get_backend(), "loss": total.item()}, file)


if __name__ == "__main__":
    train(sys.argv[1], sys.argv[2])
