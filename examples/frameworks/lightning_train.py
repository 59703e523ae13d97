"""Lightning on commlayer: one line, the backend's name in ``DDPStrategy``.

Run: python examples/frameworks/lightning_train.py

Lightning starts the second rank itself; ``commlayer run -n 2``, torchrun and mpirun
(``COMMLAYER_BACKEND=mpi``) start both instead, and Lightning finds them.
"""

import lightning
import torch
from lightning.pytorch.strategies import DDPStrategy


class Regressor(lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))

    def training_step(self, batch: list[torch.Tensor], index: int) -> torch.Tensor:
        inputs, targets = batch
        return torch.nn.functional.mse_loss(self.layers(inputs), targets)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def main() -> None:
    torch.manual_seed(0)
    inputs = torch.randn(64, 32, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.TensorDataset(inputs, inputs.sum(dim=1, keepdim=True).sin())
    trainer = lightning.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(process_group_backend="commlayer"),
        max_steps=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Regressor(), torch.utils.data.DataLoader(data, batch_size=4))
    if trainer.global_rank == 0:
        print(f"process group: {torch.distributed.get_backend()}; steps {trainer.global_step}")


if __name__ == "__main__":
    main()
