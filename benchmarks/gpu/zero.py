"""commlayer ZeRO on GPUs, measured exactly like shared/anchors/zero_anchor.py measures its modes.

Same model (the anchor's own GPT class, imported from the anchor file), sequence, micro-batch,
bf16, AdamW(lr=1e-4), data, warm-up and timing; prints one JSON line with the anchor's keys::

    torchrun --standalone --nproc-per-node 2 benchmarks/gpu/zero.py --stage 2 \
        --anchor shared/anchors/zero_anchor.py

``benchmarks/gpu/zero.sh`` runs it for every stage together with the anchor's ddp, fsdp2 and
DeepSpeed modes, then ``benchmarks/gpu/zero_report.py`` prints the comparison table.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
from pathlib import Path
from types import ModuleType

import torch
from stream_profile import profile_step
from timed_steps import time_steps

from commlayer import dist, zero


def load_anchor(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("zero_anchor", path)
    if spec is None or spec.loader is None or not path.is_file():
        raise SystemExit(f"zero: --anchor expected the path of zero_anchor.py, received {str(path)!r}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stage", type=int, choices=(0, 1, 2, 3), required=True)
    parser.add_argument("--anchor", type=Path, default=Path("shared/anchors/zero_anchor.py"))
    parser.add_argument(
        "--backend",
        default="cpu:gloo,cuda:nccl",
        help="commlayer backend spec ('default': peermem's on GPUs)",
    )
    parser.add_argument("--d", "--width", dest="d", type=int, default=1024)  # torchrun cannot pass a bare --d
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--mb", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--bucket", type=float, default=2.5e7, help="reduce_bucket_size (elements)")
    parser.add_argument("--unit", type=float, default=1e8, help="stage3_max_unit_numel (elements)")
    parser.add_argument("--prefetch", type=float, default=5e7, help="stage3_prefetch_bucket_size (elements)")
    parser.add_argument(
        "--coalesce",
        type=float,
        default=None,
        help="stage3_coalesce_numel (elements; 0: one unit per block; default: the engine's)",
    )
    parser.add_argument("--fused", action="store_true", help="torch.optim.AdamW(fused=True)")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after timing, profile one more step: compute / communication-alone / idle milliseconds (GPU only)",
    )
    parser.add_argument(
        "--cpu", action="store_true", help="dry run on CPU over gloo (tiny sizes; checks the script)"
    )
    parser.add_argument(
        "--trace",
        type=Path,
        default=None,
        help="after timing, dump every rank's flight recorder here (read it with "
        "`commlayer trace analyze --arrivals DIR`: when each rank entered each collective)",
    )
    return parser.parse_args()


def engine_config(args: argparse.Namespace) -> dict:
    return {
        "train_micro_batch_size_per_gpu": args.mb,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {
            "stage": args.stage,
            "overlap_comm": True,
            "contiguous_gradients": True,
            "reduce_bucket_size": int(args.bucket),
            "stage3_max_unit_numel": int(args.unit),
            "stage3_prefetch_bucket_size": int(args.prefetch),
            **({} if args.coalesce is None else {"stage3_coalesce_numel": int(args.coalesce)}),
        },
    }


def main() -> None:
    args = parse()
    anchor = load_anchor(args.anchor)
    local = int(os.environ["LOCAL_RANK"])
    if args.cpu:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    else:
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group(None if args.backend == "default" else args.backend)
    torch.manual_seed(0)
    model = anchor.GPT(args.vocab, args.d, args.layers, args.heads, args.seq).to(device)
    parameters = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=args.fused or None)
    engine = zero.initialize(model=model, optimizer=optimizer, config=engine_config(args))
    rank, world = dist.get_rank(), dist.get_world_size()
    generator = torch.Generator(device=device).manual_seed(rank)
    x = torch.randint(0, args.vocab, (args.mb, args.seq), device=device, generator=generator)
    y = torch.randint(0, args.vocab, (args.mb, args.seq), device=device, generator=generator)

    def step() -> torch.Tensor:
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        return loss

    seconds, peak, loss = time_steps(step, args.warmup, args.steps, device)
    if args.trace is not None:
        dist.dump_flight_recorder(args.trace, reason="zero.py --trace")
    profiled = profile_step(step) if args.profile and not args.cpu else None
    if rank == 0:
        mode = (
            f"cl{args.stage}"
            + ("_fused" if args.fused else "")
            + ("_default" if args.backend == "default" else "")
            + ("" if args.coalesce is None else f"_coalesce{args.coalesce:.0e}")
        )
        print(
            json.dumps(
                {
                    "mode": mode,
                    "world": world,
                    "params_M": round(parameters / 1e6, 1),
                    "tokens_per_s": round(args.mb * args.seq * world / seconds),
                    "step_ms": round(seconds * 1e3, 1),
                    "peak_GiB": round(peak, 2),
                    "loss": round(loss.item(), 3),
                    "bucket": int(args.bucket),
                    "torch": torch.__version__,
                    **({"profile": profiled} if profiled else {}),
                }
            ),
            flush=True,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
