"""Fault-tolerant ZeRO-2 training: kill any member, the others train on and it comes back.

Four members make 2 replicas x 2 shards: each replica splits its gradients and optimizer state
over its 2 members (ZeRO stage 2), and the replicas average their gradients. Kill a member
(``kill -9`` its pid): the other replica trains on, the launcher restarts the dead member in its
slot, and it catches up from a peer at the next step. Every ``--checkpoint-every`` steps the
members write a checkpoint; a run that starts again (a whole-job restart under torchrun or
mpirun, or by hand) resumes from it.

Run: commlayer run --ft -n 4 examples/fault_tolerant_training.py
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
import torch.nn.functional as F
from torch import nn

from commlayer import ft

FEATURES, HIDDEN, OUTPUTS, BATCH = 16, 32, 4, 8


def build_model(dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)  # every member starts from the same parameters
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, OUTPUTS)).to(dtype)


def make_optimizer(params: list[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=0.01)


def batch(step: int, replica: int, shard: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Member (replica, shard)'s micro-batch of ``step``: the same whoever computes it."""
    generator = torch.Generator().manual_seed(step * 1000 + replica * 10 + shard)
    x = torch.randn(BATCH, FEATURES, generator=generator, dtype=dtype)
    return x, torch.sin(2 * x[:, :OUTPUTS])


def loss_of(model: nn.Module, step: int, replica: int, shard: int) -> torch.Tensor:
    parameter = next(model.parameters())
    x, y = batch(step, replica, shard, parameter.dtype)
    return F.mse_loss(model(x.to(parameter.device)), y.to(parameter.device))


def main() -> None:
    args = parse()
    manager = ft.Manager(ft.FaultToleranceOptions(shards=2, backend=args.backend))
    replica, shard = manager.slot
    model = build_model(getattr(torch, args.dtype)).to(device(args.backend, shards=2))
    engine = ft.FaultTolerantDataParallel(model, make_optimizer, manager, stage=2)
    resumed = engine.load_checkpoint(args.checkpoint_dir)
    if resumed is not None and manager.member == 0:
        print(f"resuming at step {resumed} from {args.checkpoint_dir}")
    while engine.step < args.steps:
        loss = engine.train_step(lambda module, step: loss_of(module, step, replica, shard))
        if engine.step % args.checkpoint_every == 0:
            engine.save_checkpoint(args.checkpoint_dir)
            print(f"member {manager.member}: step {engine.step}, loss {loss:.4f}")
        time.sleep(args.step_time)
    manager.finish()
    print(f"member {manager.member}: trained to step {engine.step}")


def device(backend: str, shards: int) -> torch.device:
    """One GPU per member on this host for nccl or peermem (LOCAL_RANK), else the CPU. With fewer
    GPUs than members, (replica, shard) takes GPU (replica + shard) % GPUs: no communicator (a
    replica's shards, a shard's replicas) then holds two members on one GPU."""
    if backend not in ("nccl", "peermem"):
        return torch.device("cpu")
    local, count = int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count()
    index = local if local < count else (local // shards + local % shards) % count
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--backend", default="gloo", help="gloo or shm on CPUs, nccl or peermem on GPUs")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument(
        "--checkpoint-dir", default=os.path.join(tempfile.gettempdir(), "commlayer-fault-tolerant-training")
    )
    parser.add_argument(
        "--step-time",
        type=float,
        default=0.1,
        help="seconds to pause after each step: a bigger model's compute, time to kill a member",
    )
    return parser.parse_args()


if __name__ == "__main__":
    main()
