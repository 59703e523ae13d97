"""DeepSpeed ZeRO on commlayer: one line, the backend's name in ``init_distributed``.

Run: commlayer run -n 2 examples/frameworks/deepspeed_train.py

torchrun, mpirun (``COMMLAYER_BACKEND=mpi``, with MASTER_ADDR and MASTER_PORT set) and the
``deepspeed`` launcher start it as well. commlayer picks the backend of each device:
``$COMMLAYER_BACKEND``, else shm on a CPU host and ``cpu:gloo,cuda:peermem`` on a CUDA host.
"""

import deepspeed
import torch


def main() -> None:
    deepspeed.init_distributed(dist_backend="commlayer")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "zero_optimization": {"stage": 3},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    data = torch.Generator().manual_seed(engine.global_rank)
    for _ in range(4):
        inputs = torch.randn(4, 32, generator=data).to(engine.device)
        loss = torch.nn.functional.mse_loss(engine(inputs), inputs.sum(dim=1, keepdim=True).sin())
        engine.backward(loss)
        engine.step()
    if engine.global_rank == 0:
        print(f"process group: {torch.distributed.get_backend()}; loss {loss.item()!r}")


if __name__ == "__main__":
    main()
