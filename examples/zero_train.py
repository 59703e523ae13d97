"""ZeRO data parallelism with commlayer: a small language model learns a next-token rule.

Every rank sees its own micro-batches; ``--stage`` picks how much is sharded (0: nothing, 1:
optimizer state, 2: + gradients, 3: + parameters). Halfway through, the run checkpoints and
reloads itself, as a resumed job would. Runs on any backend commlayer has::

    commlayer run -n 2 examples/zero_train.py --stage 3
    mpirun -n 2 python examples/zero_train.py --stage 2 --backend mpi
    torchrun --nproc-per-node 2 examples/zero_train.py --stage 1 --bf16   (on GPUs: nccl)

Run: commlayer run -n 2 examples/zero_train.py --stage 3 --steps 8
"""

from __future__ import annotations

import argparse
import shutil
import tempfile

import torch
import torch.nn.functional as F
from torch import nn

from commlayer import dist, zero

VOCAB, WIDTH, SEQ, MICRO_BATCH = 64, 64, 16, 8


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(
            nn.Sequential(
                nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)
            )
            for _ in range(3)
        )
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = x + layer(x)
        return F.cross_entropy(self.head(x).float().reshape(-1, VOCAB), targets.reshape(-1))


def batch(step: int, rank: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences following ``next = (3 * token + 1) % VOCAB``, different on every rank and step."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    tokens = [torch.randint(0, VOCAB, (MICRO_BATCH,), generator=generator)]
    for _ in range(SEQ):
        tokens.append((3 * tokens[-1] + 1) % VOCAB)
    sequence = torch.stack(tokens, dim=1).to(device)
    return sequence[:, :-1], sequence[:, 1:]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stage", type=int, default=2, choices=(0, 1, 2, 3))
    parser.add_argument("--backend", default=None, help="commlayer backend (default: from the accelerator)")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )
    torch.manual_seed(0)
    model = TinyLM().to(device)
    config = {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": 2,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": args.bf16},
        "zero_optimization": {
            "stage": args.stage,
            "reduce_bucket_size": 20_000,
            "stage3_max_unit_numel": 40_000,
        },
    }
    engine = zero.initialize(
        model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3), config=config
    )
    checkpoint = tempfile.mkdtemp(prefix="zero_train_") if rank == 0 else ""
    holder = [checkpoint]
    dist.broadcast_object_list(holder, src=0)
    losses = []
    for step in range(args.steps):
        for micro in range(engine.gradient_accumulation_steps()):
            loss = engine(*batch(2 * step + micro, rank, device))
            engine.backward(loss)
            engine.step()
        losses.append(loss.item())
        if step == args.steps // 2:
            engine.save_checkpoint(holder[0])
            engine.load_checkpoint(holder[0])  # what a restarted job does, at any world size
    weights = engine.full_state_dict()  # collective; every rank gets the whole model
    print(
        f"rank {rank}: stage {args.stage}, loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
        f"{sum(v.numel() for v in weights.values())} parameters"
    )
    dist.barrier()
    if rank == 0:
        shutil.rmtree(holder[0])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
