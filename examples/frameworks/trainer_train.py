"""An unmodified transformers Trainer script: no line of it names commlayer.

Run: commlayer run --torch-takeover -n 2 examples/frameworks/trainer_train.py

torchrun starts it as well, with the switch in the environment::

    COMMLAYER_TORCH_TAKEOVER=1 torchrun --nproc-per-node 2 examples/frameworks/trainer_train.py

The Trainer asks torch for a "gloo" or "nccl" process group (``--ddp_backend`` accepts only torch's
names); with ``COMMLAYER_TORCH_TAKEOVER=1`` torch hands it commlayer's group instead. On a CPU host
``use_cpu=True`` is needed: without it the Trainer trains each rank alone, silently.
"""

import tempfile

import torch
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments


class Samples(Dataset):
    """32 fixed samples: inputs and the target each model should learn."""

    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        inputs = torch.randn(32, generator=torch.Generator().manual_seed(index))
        return {"inputs": inputs, "labels": inputs.sum().sin().reshape(1)}


class Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.layers(inputs), labels)}


def main() -> None:
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as output:
        args = TrainingArguments(
            output_dir=output,
            per_device_train_batch_size=4,
            max_steps=4,
            learning_rate=1e-2,
            use_cpu=not torch.cuda.is_available(),
            report_to=[],
            save_strategy="no",
            disable_tqdm=True,
        )
        result = Trainer(model=Regressor(), args=args, train_dataset=Samples()).train()
    if args.process_index == 0:
        group = torch.distributed.get_backend()
        print(f"ddp_backend asked: {args.ddp_backend}; process group: {group}; loss {result.training_loss!r}")


if __name__ == "__main__":
    main()
