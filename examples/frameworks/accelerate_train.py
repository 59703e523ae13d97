"""An unmodified Accelerate script: no line of it names commlayer.

Run: commlayer run --torch-takeover -n 2 examples/frameworks/accelerate_train.py

``accelerate launch`` starts it as well, with the switch in the environment::

    COMMLAYER_TORCH_TAKEOVER=1 accelerate launch --multi_gpu --num_processes 2 --num_machines 1 \\
        --mixed_precision no --dynamo_backend no examples/frameworks/accelerate_train.py

Accelerate asks torch for a "gloo" (CPU) or "nccl" (CUDA) process group and keeps that name in
``state.backend``; with ``COMMLAYER_TORCH_TAKEOVER=1`` torch hands it commlayer's group instead.
On a CPU host ``cpu=True`` is needed: without it Accelerate trains each rank alone, silently.
"""

import torch
from accelerate import Accelerator


def main() -> None:
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    data = torch.Generator().manual_seed(accelerator.process_index)
    for _ in range(4):
        inputs = torch.randn(4, 32, generator=data).to(accelerator.device)
        loss = torch.nn.functional.mse_loss(model(inputs), inputs.sum(dim=1, keepdim=True).sin())
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    total = accelerator.reduce(loss.detach().double(), reduction="sum").item()
    group = torch.distributed.get_backend()
    accelerator.print(f"backend asked: {accelerator.state.backend}; process group: {group}; loss {total!r}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
