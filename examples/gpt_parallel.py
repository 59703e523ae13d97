"""A small GPT trained with the mesh put to work: Ulysses sequence parallelism, expert-parallel
MoE, or hybrid-sharded ZeRO. Four CPU ranks are enough::

    commlayer run -n 4 examples/gpt_parallel.py --parallel sp       # dp=2 x sp=2, ZeRO-2 over dp_sp
    commlayer run -n 4 examples/gpt_parallel.py --parallel ep       # dp=4, MoE experts over ep=2
    commlayer run -n 4 examples/gpt_parallel.py --parallel hybrid   # ZeRO-3 sharded in pairs, 2 replicas
    commlayer run -n 4 examples/gpt_parallel.py --parallel all      # the three, one after the other

The model learns a next-token rule; each run prints its first and last loss on rank 0.

Run: commlayer run -n 4 examples/gpt_parallel.py --parallel all --steps 4
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn

from commlayer import dist, zero
from commlayer.mesh import Mesh, init_mesh
from commlayer.parallel import GateOptions, MoE, UlyssesAttention, sequence_offset, shard_sequence

VOCAB, WIDTH, HEADS, LAYERS, SEQ, BATCH = 64, 64, 4, 2, 32, 16  # BATCH: sequences per step, all ranks


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention on [batch, seq, heads, head_dim]."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    )
    return out.transpose(1, 2)


class Block(nn.Module):
    def __init__(self, mesh: Mesh | None, sequence_parallel: bool, experts: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.attention = UlyssesAttention(attention, mesh) if sequence_parallel else attention
        mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))
        self.moe = (
            MoE(WIDTH, mlp, experts, mesh, options=GateOptions(k=2, capacity_factor=1.25))
            if experts
            else None
        )
        self.mlp = None if experts else mlp

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, WIDTH // HEADS).unbind(2)
        x = x + self.proj(self.attention(q, k, v).reshape(b, t, WIDTH))
        if self.moe is None:
            return x + self.mlp(self.ln2(x)), x.new_zeros(())
        out, aux_loss, _ = self.moe(self.ln2(x))
        return x + out, aux_loss


class GPT(nn.Module):
    def __init__(self, mesh: Mesh | None, sequence_parallel: bool = False, experts: int = 0) -> None:
        """``mesh`` None: one process, every expert local (the single-process reference)."""
        super().__init__()
        self.mesh, self.sequence_parallel = mesh, sequence_parallel
        self.tok, self.pos = nn.Embedding(VOCAB, WIDTH), nn.Embedding(SEQ, WIDTH)
        self.blocks = nn.ModuleList(Block(mesh, sequence_parallel, experts) for _ in range(LAYERS))
        self.ln, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # Under sequence parallelism idx is this rank's slice: positions start at its offset.
        start = sequence_offset(idx.shape[1], self.mesh) if self.sequence_parallel else 0
        x = self.tok(idx) + self.pos(torch.arange(start, start + idx.shape[1]))
        aux = x.new_zeros(())
        for block in self.blocks:
            x, block_aux = block(x)
            aux = aux + block_aux
        loss = F.cross_entropy(self.head(self.ln(x)).reshape(-1, VOCAB), targets.reshape(-1))
        return loss + 0.01 * aux


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """BATCH sequences following ``next = (5 * token + 3) % VOCAB`` (the same on every rank)."""
    generator = torch.Generator().manual_seed(step)
    tokens = [torch.randint(0, VOCAB, (BATCH,), generator=generator)]
    for _ in range(SEQ):
        tokens.append((5 * tokens[-1] + 3) % VOCAB)
    whole = torch.stack(tokens, dim=1)
    return whole[:, :-1], whole[:, 1:]


def train(kind: str, steps: int) -> tuple[float, float]:
    world = dist.get_world_size()
    stage, config_extra, replicate = 2, {}, ()
    if kind == "sp":  # sequence parallel in pairs, data parallel across them
        mesh = init_mesh((world // 2, 2), ("dp", "sp"))
        model = GPT(mesh, sequence_parallel=True)
    elif kind == "ep":  # every rank data parallel, experts spread over pairs
        mesh = init_mesh((world,), ("dp",), expert_parallel_size=2)
        model = GPT(mesh, experts=4)
    else:  # hybrid: ZeRO-3 shards inside pairs, replicated across them
        mesh = init_mesh((world // 2, 2), ("node", "dp"))
        model, stage, replicate = GPT(mesh), 3, ("node",)
        config_extra = {"stage3_max_unit_numel": 20_000}
    dp_rank, dp_size = data_parallel_position(mesh, replicate)
    config = {
        "train_batch_size": BATCH,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": stage, **config_extra},
    }
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    engine = zero.initialize(
        model=model, optimizer=optimizer, config=config, mesh=mesh, replicate_dims=replicate
    )
    share = BATCH // dp_size
    losses = []
    for step in range(steps):
        x, y = (t[dp_rank * share : (dp_rank + 1) * share] for t in batch(step))
        if kind == "sp":
            x, y = shard_sequence(x, mesh), shard_sequence(y, mesh)
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    engine.destroy()
    return losses[0], losses[-1]


def data_parallel_position(mesh: Mesh, replicate: tuple[str, ...]) -> tuple[int, int]:
    """This rank's index among the ranks that see distinct samples, and how many there are."""
    dims = tuple(d for d in mesh.mesh_dim_names if d == "dp" or d in replicate)
    return mesh[dims].get_local_rank(), mesh[dims].size()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--parallel", choices=("sp", "ep", "hybrid", "all"), default="all")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--backend", default=None)
    args = parser.parse_args()
    dist.init_process_group(args.backend)
    if dist.get_world_size() % 2:
        raise SystemExit("gpt_parallel: run it on an even number of ranks, e.g. commlayer run -n 4")
    torch.manual_seed(0)
    for kind in ("sp", "ep", "hybrid") if args.parallel == "all" else (args.parallel,):
        first, last = train(kind, args.steps)
        if dist.get_rank() == 0:
            print(f"{kind}: loss {first:.3f} -> {last:.3f} over {args.steps} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
