"""commlayer's Ulysses attention and MoE layer on GPUs, shaped and timed like the DeepSpeed anchors.

Same stacks, sizes, data, warm-up and timing as ``shared/anchors/ulysses_anchor.py`` and
``moe_anchor.py``; only the parallel layer (and, for Ulysses, the gradient reduction) is
commlayer's. Prints one JSON line with the anchors' keys::

    torchrun --standalone --nproc-per-node 2 benchmarks/gpu/parallel_layers.py --layer ulysses --seq 32768
    torchrun --standalone --nproc-per-node 2 benchmarks/gpu/parallel_layers.py --layer moe

Ulysses trains through ``commlayer.zero`` over the ("dp", "sp") mesh (dp=1): ``--precision
autocast`` keeps fp32 weights under bf16 autocast like the anchor's DDP; ``bf16`` trains bf16
weights with fp32 masters. MoE keeps the anchor's loop (fp32 weights, autocast, dense gradients
averaged over data parallel, fused AdamW), with ``commlayer.parallel.reduce_gradients``.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F
from stream_profile import profile_step
from timed_steps import time_steps
from torch import nn

from commlayer import dist, zero
from commlayer.mesh import init_mesh
from commlayer.parallel import GateOptions, MoE, UlyssesAttention, reduce_gradients


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layer", choices=("ulysses", "moe"), required=True)
    parser.add_argument("--seq", type=int, default=32768)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--layers", type=int, default=None, help="default: 8 (ulysses), 4 (moe)")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--capacity", type=float, default=1.25)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--stage", type=int, default=1, choices=(0, 1, 2, 3))
    parser.add_argument("--precision", choices=("autocast", "bf16"), default="autocast")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--profile", action="store_true", help="after timing, profile one more step (GPU only)"
    )
    parser.add_argument(
        "--cpu", action="store_true", help="dry run on CPU over gloo (tiny sizes; checks the script)"
    )
    parser.add_argument(
        "--backend",
        default="nccl",
        help="commlayer backend spec on GPUs (default nccl; 'default': peermem's)",
    )
    return parser.parse_args()


def attention_bhsd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class UlyssesBlock(nn.Module):
    """The anchor's block; q, k, v are laid out [b, h, s, d] so SDPA gets them as they arrive."""

    def __init__(self, args: argparse.Namespace, mesh) -> None:
        super().__init__()
        width, self.heads = args.width, args.heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.attn = UlyssesAttention(attention_bhsd, mesh, seq_dim=2, head_dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [b, s/p, d]
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.proj(self.attn(q, k, v).transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(self.ln2(x))


class UlyssesModel(nn.Module):
    def __init__(self, args: argparse.Namespace, mesh) -> None:
        super().__init__()
        self.emb = nn.Embedding(args.vocab, args.width)
        self.blocks = nn.ModuleList(UlyssesBlock(args, mesh) for _ in range(args.layers))
        self.head = nn.Linear(args.width, args.vocab, bias=False)
        self.vocab = args.vocab

    def forward(self, idx: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        for block in self.blocks:
            x = block(x)
        return F.cross_entropy(self.head(x).float().view(-1, self.vocab), tgt.view(-1))


class MoEBlock(nn.Module):
    def __init__(self, args: argparse.Namespace, mesh) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(args.width)
        expert = nn.Sequential(
            nn.Linear(args.width, 4 * args.width), nn.GELU(), nn.Linear(4 * args.width, args.width)
        )
        options = GateOptions(k=args.k, capacity_factor=args.capacity, eval_capacity_factor=args.capacity)
        self.moe = MoE(args.width, expert, args.experts, mesh, options=options)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, aux, _ = self.moe(self.ln(x))
        return x + out, aux


def ulysses_step(args: argparse.Namespace, device: torch.device) -> tuple[Callable[[], torch.Tensor], int]:
    world = dist.get_world_size()
    mesh = init_mesh((1, world), ("dp", "sp"))
    torch.manual_seed(0)
    model = UlyssesModel(args, mesh).to(device)
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "bf16": {"enabled": args.precision == "bf16"},
        "zero_optimization": {"stage": args.stage, "reduce_bucket_size": 25_000_000},
    }
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    engine = zero.initialize(model=model, optimizer=optimizer, config=config, mesh=mesh)
    generator = torch.Generator(device=device).manual_seed(dist.get_rank())
    chunk = args.seq // world
    idx = torch.randint(0, args.vocab, (1, chunk), device=device, generator=generator)
    tgt = torch.randint(0, args.vocab, (1, chunk), device=device, generator=generator)

    def step() -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "autocast"):
            loss = engine(idx, tgt)
        engine.backward(loss)
        engine.step()
        return loss

    return step, args.seq


def moe_step(args: argparse.Namespace, device: torch.device) -> tuple[Callable[[], torch.Tensor], int]:
    world = dist.get_world_size()
    mesh = init_mesh((world,), ("dp",), expert_parallel_size=world)
    torch.manual_seed(0)
    blocks = nn.ModuleList(MoEBlock(args, mesh) for _ in range(args.layers)).to(device)
    optimizer = torch.optim.AdamW(blocks.parameters(), lr=1e-4, fused=device.type == "cuda")
    generator = torch.Generator(device=device).manual_seed(dist.get_rank())
    x0 = torch.randn(8, args.tokens // 8, args.width, device=device, generator=generator)

    def step() -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            x, aux_sum = x0, 0.0
            for block in blocks:
                x, aux = block(x)
                aux_sum = aux_sum + aux
            loss = x.float().pow(2).mean() + 0.01 * aux_sum
        loss.backward()
        reduce_gradients(blocks, mesh)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return step, args.tokens * world


def main() -> None:
    args = parse()
    args.layers = args.layers or (8 if args.layer == "ulysses" else 4)
    if args.cpu:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    else:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        device = torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group(None if args.backend == "default" else args.backend)
    step, tokens = (ulysses_step if args.layer == "ulysses" else moe_step)(args, device)
    seconds, peak, loss = time_steps(step, args.warmup, args.steps, device)
    profiled = profile_step(step) if args.profile and not args.cpu else None
    if dist.get_rank() == 0:
        mode = f"cl_{args.layer}" + (f"_zero{args.stage}_{args.precision}" if args.layer == "ulysses" else "")
        mode += "" if args.backend == "nccl" else f"_{args.backend}"
        result = {"mode": mode, "world": dist.get_world_size(), "seq": args.seq, "width": args.width,
                  "layers": args.layers, "tokens_per_s": round(tokens / seconds), "step_ms": round(seconds * 1e3, 1),
                  "peak_GiB": round(peak, 2), "loss": round(loss.item(), 4),
                  **({"profile": profiled} if profiled else {})}  # fmt: skip
        print(json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
